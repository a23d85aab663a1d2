"""``buildmax lesson reindex``: lesson search made again from the lessons'
current revisions, on the server's machine."""

from __future__ import annotations

import asyncio
from typing import Any

from buildmax_lessons.reindex import reindex_command
from buildmax_lessons.tables import SEARCH
from click.testing import CliRunner

from .conftest import Lab


async def test_reindex_rebuilds_lesson_search_from_the_current_revisions(
    lab: Lab, buildmax_settings: Any
) -> None:
    first = await lab.lesson("Rotate the keys", "rotate them monthly")
    await lab.lesson("Rotate the logs", "daily")
    await lab.call(
        "POST",
        f"/lessons/{first['id']}/revisions",
        json={"revision": 1, "reason": "policy", "text": "rotate them weekly"},
        expect=201,
    )
    async with lab.app.db.write() as tx:
        await SEARCH.clear(tx)
    assert await lab.search(q="rotate") == []
    location = ["--data-dir", buildmax_settings.data_dir]
    if buildmax_settings.database_url:
        location = ["--database-url", buildmax_settings.database_url]
    result = await asyncio.to_thread(CliRunner().invoke, reindex_command, location)
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.output == "Indexed 2 lesson(s) for search.\n"
    assert {h["title"] for h in await lab.search(q="rotate")} == {
        "Rotate the keys",
        "Rotate the logs",
    }
    assert [h["title"] for h in await lab.search(q="weekly")] == ["Rotate the keys"]
    assert await lab.search(q="monthly") == []
