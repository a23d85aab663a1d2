"""The beads importer: an export read into records as docs/imports.md maps
it, and every line it cannot read reported with its number and reason,
the rest still read."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from buildmax_hookspecs import SourceLink, SourceProblem, SourceRecord
from buildmax_imports import reading
from buildmax_imports.beads import IMPORTER
from buildmax_imports.sources import Reading, read

pytestmark = pytest.mark.engine_independent


def export(*issues: dict[str, Any] | str) -> bytes:
    """JSON lines, as ``bd export`` writes them (a string is a raw line)."""
    return "".join(
        (item if isinstance(item, str) else json.dumps(item)) + "\n" for item in issues
    ).encode()


def read_bytes(data: bytes) -> Reading:
    return read(IMPORTER, io.BytesIO(data))


def by_id(reading: Reading) -> dict[str, SourceRecord]:
    return {record.source_id: record for record in reading.records}


BASE = {"created_at": "2026-01-02T03:04:05Z", "updated_at": "2026-01-03T00:00:00Z"}


def test_an_export_is_read_in_our_terms() -> None:
    data = export(
        {
            **BASE,
            "id": "bd-1",
            "title": "  Parse the config  ",
            "description": "Read it.",
            "design": "A table.",
            "notes": "Ask ops.",
            "acceptance_criteria": "It parses.",
            "status": "open",
            "priority": 0,
            "issue_type": "bug",
            "assignee": "ada",
            "labels": ["backend", "needs review!"],
        },
        {
            **BASE,
            "id": "bd-2",
            "title": "Ship it",
            "status": "closed",
            "closed_at": "2026-02-01T00:00:00Z",
            "close_reason": "done in 1.2",
            "priority": 4,
            "issue_type": "epic",
        },
        {
            **BASE,
            "id": "bd-3",
            "title": "Being written",
            "status": "in_progress",
            "issue_type": "merge-request",
            "dependencies": [
                {"issue_id": "bd-3", "depends_on_id": "bd-1", "type": "blocks"},
                {"issue_id": "bd-3", "depends_on_id": "bd-2", "type": "parent-child"},
                {"issue_id": "bd-3", "depends_on_id": "bd-9", "type": "related"},
                {"issue_id": "bd-3", "depends_on_id": "bd-1", "type": "discovered-from"},
                {"issue_id": "bd-3", "depends_on_id": "bd-2", "type": "waits-for"},
            ],
        },
        {
            **BASE,
            "id": "bd-4",
            "title": "Waits",
            "status": "blocked",
            "dependencies": [{"issue_id": "bd-4", "depends_on_id": "bd-3", "type": "blocks"}],
        },
        {**BASE, "id": "bd-5", "title": "Blocked by nothing here", "status": "blocked"},
        {**BASE, "id": "bd-6", "title": "Later", "status": "deferred"},
        {**BASE, "id": "bd-7", "title": "Odd", "status": "someday", "priority": "high"},
    )
    reading = read_bytes(data)
    assert reading.problems == [] and reading.refused is None
    records = by_id(reading)
    assert [r.source_id for r in reading.records] == [f"bd-{n}" for n in range(1, 8)]

    first = records["bd-1"]
    assert (first.line, first.title, first.criteria) == (1, "Parse the config", "It parses.")
    assert first.body == "Read it.\n\n## Design\n\nA table.\n\n## Notes\n\nAsk ops."
    assert (first.state, first.source_state, first.priority, first.kind) == (
        "ready",
        "open",
        200,
        "code",
    )
    assert first.labels == ("backend", "needs-review", "type:bug")
    assert first.assignee == "ada" and first.created_at == BASE["created_at"]
    assert first.warnings == ("label 'needs review!' imported as 'needs-review'",)

    closed = records["bd-2"]
    assert (closed.state, closed.priority, closed.kind) == ("done", -200, "general")
    assert (closed.closed_at, closed.close_reason) == ("2026-02-01T00:00:00Z", "done in 1.2")

    working = records["bd-3"]
    assert working.state == "held" and "in progress in beads" in working.state_reason
    assert working.kind == "integration"
    assert working.links == (
        SourceLink("prerequisite", "bd-1"),
        SourceLink("parent", "bd-2"),
        SourceLink("related", "bd-9"),
        SourceLink("discovered-from", "bd-1"),
        SourceLink("waits-for", "bd-2"),
    )

    assert records["bd-4"].state == "ready" and "waits for its prerequisites" in (
        records["bd-4"].state_reason
    )
    assert records["bd-5"].state == "held" and "by nothing in the export" in (
        records["bd-5"].state_reason
    )
    assert records["bd-6"].state == "held" and "deferred" in records["bd-6"].state_reason
    odd = records["bd-7"]
    assert odd.state == "held" and "'someday' unknown" in odd.state_reason
    assert odd.priority == 0 and "priority 'high' is not 0-4" in odd.warnings[0]


def test_what_is_read_and_not_kept_is_said_on_the_record() -> None:
    reading = read_bytes(
        export(
            {
                "id": "bd-1",
                "title": "t",
                "comments": [{"text": "hi"}],
                "external_ref": "gh-9",
                "labels": "not a list",
                "dependencies": [
                    {"issue_id": "bd-8", "depends_on_id": "bd-2", "type": "blocks"},
                    {"type": "blocks"},
                ],
            }
        )
    )
    (record,) = reading.records
    assert record.links == ()
    assert record.warnings == (
        "fields not imported: comments, external_ref",
        "dependency 1 is of issue 'bd-8', not this one: left out",
        "dependency 2 names no depends_on_id: left out",
        "labels is not a list of strings: left out",
    )
    assert record.labels == ("type:task",)


def test_every_bad_line_is_reported_with_its_number_and_the_rest_is_read() -> None:
    long_line = json.dumps({"id": "bd-huge", "title": "x" * (reading.MAX_LINE_BYTES + 10)})
    data = (
        export(
            {"id": "bd-1", "title": "fine"},
            '{"id": "bd-2", "title": ',
            "[1, 2]",
            {"title": "no id"},
            {"id": "bd-5", "title": " "},
            {"id": "bd-1", "title": "the same id again"},
            {"id": "bd-7", "title": "gone", "status": "tombstone"},
            long_line,
        )
        + b'{"id": "bd-9", "title": "caf\xe9"}\n'
        + b"\n"
        + export({"id": "bd-10", "title": "still read"})
    )
    result = read_bytes(data)
    assert [r.source_id for r in result.records] == ["bd-1", "bd-10"]
    assert result.records[1].line == 11
    assert result.refused is None
    assert result.problems == [
        SourceProblem(2, "not JSON: Expecting value at column 25"),
        SourceProblem(3, "not a JSON object"),
        SourceProblem(4, "no id (a non-empty string)"),
        SourceProblem(5, "no title (a non-empty string)", "bd-5"),
        SourceProblem(6, "id 'bd-1' again (first on line 1): left out", "bd-1"),
        SourceProblem(7, "deleted in beads (tombstone): left out", "bd-7"),
        SourceProblem(8, "the line is longer than 1 MiB"),
        SourceProblem(9, "not UTF-8 text: 0xe9 at byte 29 of the line"),
    ]


@pytest.mark.parametrize(
    ("data", "line", "reason"),
    [
        (b"id,title\nbd-1,x\n", 1, "not a beads export (a CSV file? --format csv)"),
        (b'[{"number": 1}]\n', 1, "not a beads export (GitHub's? --format github)"),
        (b"", 1, "the file is empty"),
        (b"\n\n   \n42\n", 4, "not a JSON object"),
    ],
)
def test_a_file_of_another_format_is_refused_where_it_shows(
    data: bytes, line: int, reason: str
) -> None:
    result = read_bytes(data)
    assert result.records == [] and result.refused is not None
    assert result.refused.line == line and reason in result.refused.reason


def test_a_file_past_the_size_limit_is_refused_without_being_read_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reading, "MAX_FILE_BYTES", 200)
    data = export(*({"id": f"bd-{n}", "title": "t"} for n in range(20)))
    result = read_bytes(data)
    assert result.refused is not None and "larger than" in result.refused.reason
    assert 0 < len(result.records) < 20


def test_a_byte_order_mark_and_windows_line_ends_are_read() -> None:
    data = b"\xef\xbb\xbf" + export({"id": "bd-1", "title": "a"}).replace(b"\n", b"\r\n")
    (record,) = read_bytes(data).records
    assert (record.source_id, record.title) == ("bd-1", "a")


def test_a_file_past_the_record_limit_is_refused_at_the_first_record_too_many(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from buildmax_imports import beads

    monkeypatch.setattr(beads, "MAX_RECORDS", 3)
    result = read_bytes(export(*({"id": f"bd-{n}", "title": "t"} for n in range(5))))
    assert len(result.records) == 3
    assert result.refused is not None and result.refused.line == 4
    assert "more than 3 issues" in result.refused.reason


def test_a_dependency_type_that_is_no_word_is_kept_as_a_related_link() -> None:
    data = export(
        {
            "id": "bd-1",
            "title": "t",
            "dependencies": [{"depends_on_id": "bd-2", "type": "Waits On!"}],
        },
        {"id": "bd-2", "title": "u"},
    )
    first = by_id(read_bytes(data))["bd-1"]
    assert first.links == (SourceLink("related", "bd-2"),)
    assert first.warnings == (
        "dependency 1 is of type 'Waits On!', not a word: kept as a related link",
    )
