"""The CSV and GitHub importers: records as docs/imports.md maps them, each
problem with its line and reason, and a file of another format refused."""

from __future__ import annotations

import io
import json

import pytest
from buildmax_hookspecs import SourceLink, SourceProblem
from buildmax_imports import csvfile, github
from buildmax_imports.sources import Reading, read

pytestmark = pytest.mark.engine_independent


def read_csv(text: str | bytes) -> Reading:
    data = text.encode() if isinstance(text, str) else text
    return read(csvfile.IMPORTER, io.BytesIO(data))


def read_github(data: str | bytes) -> Reading:
    raw = data.encode() if isinstance(data, str) else data
    return read(github.IMPORTER, io.BytesIO(raw))


def test_a_csv_file_is_read_by_its_header_in_any_order_and_case() -> None:
    reading = read_csv(
        "Title,ID,State,Priority,Kind,Labels,Prerequisites,Parent,Related,Body,Criteria,Owner\n"
        'Parse,T-1,,10,code,"backend; ci",,,,"a body\nover two lines",It parses,ada\n'
        "Ship,T-2,in_progress,-5,,release,T-1,T-0,T-3;T-4,,,\n"
        "Old,T-3,closed,,general,,,,,,,\n"
        "\n"
        "Dropped,T-4,cancelled,,,,,,,,,\n"
    )
    assert reading.refused is None
    assert reading.problems == [SourceProblem(1, "columns not imported: owner")]
    first, second, third, fourth = reading.records
    assert (first.source_id, first.line, first.title, first.state) == ("T-1", 2, "Parse", "ready")
    assert (first.body, first.criteria, first.priority) == (
        "a body\nover two lines",
        "It parses",
        10,
    )
    assert (first.kind, first.labels) == ("code", ("backend", "ci"))
    assert (second.line, second.state, second.priority, second.kind) == (4, "held", -5, "general")
    assert second.links == (
        SourceLink("prerequisite", "T-1"),
        SourceLink("parent", "T-0"),
        SourceLink("related", "T-3"),
        SourceLink("related", "T-4"),
    )
    assert (third.line, third.state) == (5, "done")
    assert (fourth.line, fourth.state) == (7, "canceled")


def test_a_bad_csv_row_is_reported_and_the_next_rows_are_read() -> None:
    data = (
        b"id,title,state,kind,priority\n"
        b"A,one,ready,code,1\n"
        b",no id,,,\n"
        b"C,,,,\n"
        b"D,bad state,sleeping,,\n"
        b"E,bad kind,,chore,\n"
        b"F,bad priority,,,high\n"
        b"G,too high,,,1001\n"
        b"H,caf\xe9,,,\n"
        b"A,again,,,\n"
        b"I,fine,,,\n"
    )
    reading = read_csv(data)
    assert [r.source_id for r in reading.records] == ["A", "I"]
    assert reading.problems == [
        SourceProblem(3, "no id"),
        SourceProblem(4, "no title", "C"),
        SourceProblem(
            5,
            "state 'sleeping' is none of ready, open, held, in_progress, done, closed, "
            "canceled, cancelled",
            "D",
        ),
        SourceProblem(6, "kind 'chore' is none of code, review, integration, general", "E"),
        SourceProblem(7, "priority 'high' is not a whole number", "F"),
        SourceProblem(8, "priority 1001 is outside -1000..1000", "G"),
        SourceProblem(9, "not UTF-8 text: 0xe9 at byte 6 of the line: the row is left out"),
        SourceProblem(10, "id 'A' again (first on line 2): left out", "A"),
    ]


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b'{"id": "bd-1", "title": "x"}\n', "JSON, not CSV"),
        (b'[{"number": 1}]', "JSON, not CSV"),
        (
            b"name,description\nx,y\n",
            "the header names no 'id' column (it names name, description)",
        ),
        (b"id,title,id\n1,x,2\n", "the header row names id twice"),
        (b"", "the file is empty"),
    ],
)
def test_a_file_that_is_not_our_csv_is_refused(data: bytes, reason: str) -> None:
    reading = read_csv(data)
    assert reading.records == [] and reading.refused is not None
    assert reading.refused.line == 1 and reason in reading.refused.reason


GH = [
    {
        "number": 12,
        "title": "Crash on start",
        "body": "Steps...",
        "state": "OPEN",
        "labels": [{"id": "L1", "name": "bug", "description": "", "color": "d73a4a"}],
        "assignees": [{"id": "U1", "login": "octo", "name": ""}, {"login": "cat"}],
        "createdAt": "2026-01-01T00:00:00Z",
        "closedAt": None,
        "url": "https://github.com/acme/app/issues/12",
    },
    {
        "number": 7,
        "title": "Won't do",
        "body": "",
        "state": "CLOSED",
        "stateReason": "NOT_PLANNED",
        "labels": [],
        "assignees": [],
        "createdAt": "2025-01-01T00:00:00Z",
        "closedAt": "2025-02-01T00:00:00Z",
        "url": "https://github.com/acme/app/issues/7",
        "milestone": {"title": "v1"},
    },
    {
        "number": 3,
        "title": "Done",
        "state": "CLOSED",
        "url": "https://github.com/acme/app/issues/3",
    },
    {"number": 4, "title": "Odd", "state": "MERGED"},
    {"title": "No number", "state": "OPEN"},
    "not an object",
]


def test_gh_issue_list_output_is_read_with_each_issues_line() -> None:
    text = json.dumps(GH, indent=2)  # as gh prints it
    reading = read_github(text)
    assert reading.refused is None
    crash, wont, done = reading.records
    lines = text.splitlines()
    assert [lines[r.line - 1] for r in reading.records] == ["  {"] * 3
    assert (crash.source_id, crash.state, crash.kind, crash.body) == (
        "acme/app#12",
        "ready",
        "code",
        "Steps...",
    )
    assert crash.labels == ("bug",) and crash.assignee == "octo"
    assert crash.warnings == ("assignees cat not imported (a task has one)",)
    assert (wont.source_id, wont.state, wont.state_reason) == (
        "acme/app#7",
        "canceled",
        "closed as not planned",
    )
    assert wont.warnings == ("fields not imported: milestone",)
    assert (wont.closed_at, done.state, done.source_id) == (
        "2025-02-01T00:00:00Z",
        "done",
        "acme/app#3",
    )
    assert [(p.reason, p.source_id) for p in reading.problems] == [
        ("state 'MERGED' is neither OPEN nor CLOSED", "#4"),
        ("no number (a whole number from 1)", None),
        ("not a JSON object", None),
    ]
    assert [lines[p.line - 1].strip()[:1] for p in reading.problems] == ["{", "{", '"']


@pytest.mark.parametrize(
    ("data", "line", "reason"),
    [
        ('{"id": "bd-1"}\n{"id": "bd-2"}\n', 1, "not a JSON array: not GitHub's issue list"),
        ("number,title\n", 1, "not a JSON array"),
        ('[\n  {"number": 1,\n  "title": }\n]', 3, "not JSON: Expecting value"),
        ('[{"number": 1, "title": "x", "state": "OPEN"}] trailing', 1, "does not end"),
        ("   ", 1, "the file is empty"),
        (b'[\n{"title": "\xff"}]', 2, "not UTF-8 text"),
    ],
)
def test_a_file_that_is_not_a_gh_list_is_refused_where_it_shows(
    data: str | bytes, line: int, reason: str
) -> None:
    reading = read_github(data)
    assert reading.refused is not None
    assert reading.refused.line == line and reason in reading.refused.reason


def test_an_empty_list_is_no_records() -> None:
    reading = read_github("[]\n")
    assert reading.records == [] and reading.problems == [] and reading.refused is None


def test_files_past_the_record_limit_are_refused_at_the_first_record_too_many(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(csvfile, "MAX_RECORDS", 2)
    monkeypatch.setattr(github, "MAX_RECORDS", 2)
    rows = read_csv("id,title\n" + "".join(f"T{n},t\n" for n in range(4)))
    issues = read_github(
        json.dumps([{"number": n, "title": "t", "state": "OPEN"} for n in (1, 2, 3)])
    )
    for reading, line in ((rows, 4), (issues, 1)):
        assert len(reading.records) == 2 and reading.refused is not None
        assert reading.refused.line == line and "more than 2" in reading.refused.reason
