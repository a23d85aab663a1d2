"""``buildmax_importers``: the three built-in sources, a third party's
added beside them, and a name offered twice stopping the server."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from typing import Any, BinaryIO

import pytest
from buildmax_hookspecs import SourceLink, SourceProblem, SourceRecord, hookimpl
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
        (Lines("My Lines"), "plugin 'again' offered an importer named 'My Lines': a name"),
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


class Anything:
    """A third party's source that gives what no task takes."""

    name = "anything"
    title = "records of every shape"

    def __init__(self, *records: SourceRecord) -> None:
        self.records = records

    def read(self, source: BinaryIO) -> Iterator[SourceRecord | SourceProblem]:
        yield from self.records


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"state": "in_progress"}, "state 'in_progress' is none of ready, held, done, canceled"),
        ({"kind": "epic"}, "kind 'epic' is none of code, review, integration, general"),
        ({"priority": 1001}, "priority 1001 is not a whole number -1000..1000"),
        ({"priority": 1.5}, "priority 1.5 is not a whole number -1000..1000"),
        ({"priority": True}, "priority True is not a whole number -1000..1000"),
        ({"labels": ("ok", "not ok")}, "label 'not ok' is not a label a task carries"),
        ({"labels": tuple(f"l{n}" for n in range(21))}, "21 labels (at most 20)"),
        (
            {"links": (SourceLink("Parent Of", "r2"),)},
            "a link's kind 'Parent Of' is not a lowercase word",
        ),
        ({"links": (SourceLink("related", ""),)}, "a link names an id of 0 characters"),
        ({"title": None}, "title is not text"),
        ({"title": "  "}, "the record has no title"),
        ({"source_id": 5}, "source_id is not text"),
        ({"source_id": " "}, "the record has no id"),
        ({"labels": (1,)}, "a label is not text"),
        ({"links": ("bd-2",)}, "a link is not a kind and the id of a record"),
    ],
)
def test_a_third_partys_record_no_task_takes_is_a_problem_at_its_line(
    fields: dict[str, Any], reason: str
) -> None:
    bad = SourceRecord(**{"source_id": "r1", "line": 3, "title": "t", **fields})
    good = SourceRecord(source_id="r2", line=4, title="t")
    reading = read(Anything(bad, good), io.BytesIO(b""))
    shown = bad.source_id if isinstance(bad.source_id, str) else None
    assert reading.problems == [SourceProblem(3, reason, shown)]
    assert [record.source_id for record in reading.records] == ["r2"]


def test_more_than_100_prerequisites_keep_the_first_100_and_say_so() -> None:
    links = tuple(SourceLink("prerequisite", f"p{n}") for n in range(150))
    record = SourceRecord(source_id="r1", line=1, title="t", links=links)
    (kept,) = read(Anything(record), io.BytesIO(b"")).records
    assert kept.links == links[:100]
    assert kept.warnings == ("150 prerequisites: the first 100 are kept, 50 left out",)


def test_an_importer_that_gives_no_record_refuses_the_file() -> None:
    reading = read(Anything("not a record"), io.BytesIO(b""))  # type: ignore[arg-type]
    assert reading.refused is not None and "not a record" in reading.refused.reason
