"""``buildmax_importers``: the three built-in sources, a third party's
added beside them, and a name offered twice stopping the server."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from typing import Any, BinaryIO

import pytest
from buildmax_hookspecs import SourceProblem, SourceRecord, hookimpl
from buildmax_imports.sources import importers, read

from buildmax.app import create_app

pytestmark = pytest.mark.engine_independent


class Lines:
    """A third party's source: one task per line, its text the title."""

    def __init__(self, name: str = "lines") -> None:
        self.name = name
        self.title = "a task a line"

    def read(self, source: BinaryIO) -> Iterator[SourceRecord | SourceProblem]:
        for number, line in enumerate(source.read().decode().splitlines(), 1):
            yield SourceRecord(source_id=f"L{number}", line=number, title=line)


class Offers:
    def __init__(self, *offered: Any) -> None:
        self.offered = offered

    @hookimpl
    def buildmax_importers(self) -> list[Any]:
        return list(self.offered)


def test_the_built_in_sources_are_offered_by_name(buildmax_settings: Any) -> None:
    app = create_app(buildmax_settings)
    assert sorted(importers(app.hooks)) == ["beads", "csv", "github"]


def test_a_third_party_source_is_offered_beside_them_and_read(buildmax_settings: Any) -> None:
    app = create_app(buildmax_settings, extra_plugins=[("lines", Offers(Lines()))])
    found = importers(app.hooks)
    assert sorted(found) == ["beads", "csv", "github", "lines"]
    reading = read(found["lines"], io.BytesIO(b"first\nsecond\n"))
    assert [(r.source_id, r.title) for r in reading.records] == [("L1", "first"), ("L2", "second")]


@pytest.mark.parametrize(
    ("offered", "message"),
    [
        (Lines("beads"), "importer 'beads' is offered by plugins 'imports' and 'again'"),
        ("beads", "plugin 'again' offered 'beads', not an importer"),
    ],
)
async def test_a_source_that_cannot_be_offered_stops_the_server(
    buildmax_settings: Any, offered: Any, message: str
) -> None:
    app = create_app(
        buildmax_settings, auto_migrate=True, extra_plugins=[("again", Offers(offered))]
    )
    with pytest.raises(Exception, match=re.escape(message)):
        async with app.test_app():
            pass
