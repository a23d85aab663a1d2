"""``buildmax lesson reindex``: lesson search made again from the lessons'
current revisions, on the server's machine."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import sqlalchemy as sa
from buildmax_lessons.reindex import reindex_command
from buildmax_lessons.tables import SEARCH
from click.testing import CliRunner

from buildmax.migrations import migrate, schema_migrations

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


async def test_migration_2_keeps_lesson_search_rows_whole_and_every_lesson_found(
    lab: Lab,
) -> None:
    """A database made before migration ``lessons 2``, its long lessons'
    search rows stored apart (PostgreSQL's default past 2 KB): the
    migration keeps rows whole and stores every lesson's again, each still
    found once."""
    app = lab.app
    postgres = app.db.dialect == "postgresql"
    if postgres:
        async with app.db.write() as tx:
            await tx.execute(sa.text(f"ALTER TABLE {SEARCH.name} RESET (toast_tuple_target)"))
    # Words that do not compress: a row of some 6 KB (past 2 KB, within 8).
    long_text = " ".join(f"kerberos{secrets.token_hex(6)}" for _ in range(150)) + " kerberos"
    made = [await lab.lesson("Kerberos tickets expire", long_text) for _ in range(2)]
    options = (
        "SELECT coalesce(array_to_string(reloptions, ','), '') FROM pg_class "
        f"WHERE relname = '{SEARCH.name}'"
    )
    toasted = f"SELECT reltoastrelid::regclass::text FROM pg_class WHERE relname = '{SEARCH.name}'"
    if postgres:
        async with app.db.read() as conn:
            toast = await conn.fetch_val(sa.text(toasted))
            assert await conn.fetch_val(sa.text(f"SELECT count(*) FROM {toast}")) > 0
    async with app.db.write() as tx:
        await tx.execute(
            sa.delete(schema_migrations).where(
                schema_migrations.c.plugin == "lessons", schema_migrations.c.version == 2
            )
        )
    applied = await migrate(app.db, app.migrations(), app.clock)
    assert [(m.plugin, m.version) for m in applied] == [("lessons", 2)]
    if postgres:
        async with app.db.read() as conn:
            assert await conn.fetch_val(sa.text(options)) == "toast_tuple_target=8160"
            assert await conn.fetch_val(sa.text(f"SELECT count(*) FROM {toast}")) == 0
    found = await lab.search(q="kerberos")
    assert sorted(h["id"] for h in found) == sorted(m["id"] for m in made)
