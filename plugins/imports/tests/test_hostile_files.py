"""Files made to break a reader: each is read, reported or refused with a
line and a reason, never an exception of another kind, never a record a
file does not hold, and never in time that grows with the square of it."""

from __future__ import annotations

import io
import json

import pytest
from buildmax_hookspecs import TASK_LABELS, TASK_LINKS, SourceProblem, SourceRecord
from buildmax_imports import beads, csvfile, github, reading
from buildmax_imports.sources import MAX_WARNINGS, read

pytestmark = pytest.mark.engine_independent

DEEP = "[" * 5000 + "]" * 5000
HUGE_NUMBER = "1" + "0" * 5000


def beads_of(*lines: str) -> list[object]:
    result = read(beads.IMPORTER, io.BytesIO("".join(line + "\n" for line in lines).encode()))
    assert result.refused is None, result.refused
    return [*result.records, *result.problems]


def test_beads_lines_no_json_reader_takes_are_problems_of_their_line() -> None:
    found = beads_of(
        '{"id": "ok", "title": "t"}',
        DEEP,
        '{"id": "n", "title": "t", "priority": ' + HUGE_NUMBER + "}",
        '{"id": "s", "title": "t", "status": ["open"]}',
        '{"id": "s2", "title": "t", "status": {}}',
    )
    records = [f for f in found if isinstance(f, SourceRecord)]
    problems = [f for f in found if isinstance(f, SourceProblem)]
    assert [r.source_id for r in records] == ["ok", "s", "s2"]
    assert all(r.state == "held" and "unknown" in r.state_reason for r in records[1:])
    assert [p.line for p in problems] == [2, 3]
    assert problems[0].reason == "not JSON: nested too deeply"
    assert problems[1].reason.startswith("not JSON: Exceeds the limit (4300 digits)")


def test_a_beads_file_of_blank_lines_is_refused() -> None:
    for data in (b"\n\n  \n", b"\xef\xbb\xbf"):
        refused = read(beads.IMPORTER, io.BytesIO(data)).refused
        assert refused is not None and "no issue in the file" in refused.reason


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("[" + DEEP + "]", "nested too deeply"),
        ('[{"number": ' + HUGE_NUMBER + "}]", "Exceeds the limit"),
    ],
)
def test_a_gh_list_no_json_reader_takes_is_refused(text: str, reason: str) -> None:
    refused = read(github.IMPORTER, io.BytesIO(text.encode())).refused
    assert refused is not None and reason in refused.reason


def test_a_gh_issue_whose_url_is_not_its_own_says_so() -> None:
    issues = [
        {"number": 2, "title": "t", "state": "OPEN", "url": "https://github.com/o/r/issues/99"},
        {"number": 3, "title": "t", "state": "OPEN", "url": "https://github.com/o/r/pull/3"},
    ]
    records = read(github.IMPORTER, io.BytesIO(json.dumps(issues).encode())).records
    assert [r.source_id for r in records] == ["o/r#2", "#3"]
    assert all("is not that of issue" in r.warnings[0] for r in records)


def test_a_broken_quote_in_a_csv_cell_never_makes_a_row_of_its_text() -> None:
    data = (
        b'id,title,body\nT-1,Real task,"He said "hi" there\nT-666,Injected task\n'
        b'end of note"\nT-2,Second real,x\n'
    )
    result = read(csvfile.IMPORTER, io.BytesIO(data))
    assert "T-666" not in [r.source_id for r in result.records]
    assert result.refused is not None and result.refused.line == 2
    assert "not CSV from here" in result.refused.reason


def test_a_bad_byte_in_a_multi_line_csv_cell_leaves_out_that_row_only() -> None:
    data = (
        b'id,title,body\nT-1,Real task,"Notes \xe9t\xe9\nT-666,Injected task\n"\n'
        b"T-2,Second real,x\n"
    )
    result = read(csvfile.IMPORTER, io.BytesIO(data))
    assert [r.source_id for r in result.records] == ["T-2"]
    assert result.records[0].line == 5
    assert result.problems == [
        SourceProblem(2, "not UTF-8 text: 0xe9 at byte 22 of the line: the row is left out")
    ]


def test_a_csv_line_too_long_to_keep_refuses_the_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reading, "MAX_LINE_BYTES", 100)
    data = b'id,title,body\n1,one,"first\n' + b"x" * 300 + b'"\n2,two,x\n'
    result = read(csvfile.IMPORTER, io.BytesIO(data))
    assert result.records == []
    assert result.refused is not None and result.refused.line == 3
    assert "cannot be told apart" in result.refused.reason


def test_records_no_task_could_hold_are_problems_of_their_line() -> None:
    data = "id,title,body\n" + "\n".join(
        [
            "ok,fine,",
            "nul,a\x00b,",
            "long," + "t" * 501 + ",",
            "x" * 201 + ",id too long,",
            "big,fine," + "b" * 100_001,
        ]
    )
    result = read(csvfile.IMPORTER, io.BytesIO(data.encode()))
    assert [r.source_id for r in result.records] == ["ok"]
    assert [(p.line, p.reason) for p in result.problems] == [
        (3, "title holds a NUL character"),
        (4, "title is 501 characters (at most 500)"),
        (5, "source_id is 201 characters (at most 200)"),
        (6, "body is 100,001 characters (at most 100,000)"),
    ]
    assert len(result.problems[2].source_id or "") == 200


def test_half_a_surrogate_pair_in_json_is_no_text() -> None:
    found = beads_of('{"id": "a", "title": "t\\ud800"}')
    assert found == [SourceProblem(1, "title holds half of a surrogate pair: not text", "a")]


def test_a_record_of_many_labels_links_and_columns_is_read_in_linear_time() -> None:
    many = 15_000
    line = json.dumps(
        {
            "id": "a",
            "title": "t",
            "labels": [f"l{n}" for n in range(many)],
            "dependencies": [{"depends_on_id": f"d{n}", "type": "related"} for n in range(many)]
            + [{"depends_on_id": 1}] * 100,
        }
    )
    (record,) = beads_of(line)
    assert isinstance(record, SourceRecord)
    assert len(record.labels) == TASK_LABELS and len(record.links) == TASK_LINKS
    assert record.warnings[0] == f"{many} links: the first 100 are kept, {many - 100} left out"
    assert len(record.warnings) == MAX_WARNINGS + 1
    header = ",".join(["id", "title", *(f"c{n}" for n in range(many))])
    result = read(csvfile.IMPORTER, io.BytesIO(f"{header}\n1,t\n".encode()))
    assert result.records[0].source_id == "1"
    assert result.problems[0].reason.endswith(f"and {many - 10} more")


def test_a_csv_header_over_a_line_too_long_to_keep_is_refused_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reading, "MAX_LINE_BYTES", 100)
    data = b'id,title,"note\n' + b"x" * 300 + b'"\nT-1,Real,"\nT-666,Injected\n"\n'
    result = read(csvfile.IMPORTER, io.BytesIO(data))
    assert result.records == []
    assert result.refused is not None and result.refused.line == 2


def test_a_file_of_endless_lines_or_problems_is_refused_not_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    noise = read(beads.IMPORTER, io.BytesIO(b'{"id": "a", "title": "t"}\n' + b"1\n" * 1500))
    assert len(noise.problems) == 1000 and noise.refused is not None
    assert noise.refused.line == 1002 and "more than 1,000 problems" in noise.refused.reason
    monkeypatch.setattr(reading, "MAX_LINES", 1000)
    blank = read(csvfile.IMPORTER, io.BytesIO(b"id,title\n" + b"\n" * 5000))
    assert blank.refused is not None and blank.refused.line == 1001
    assert "more than 1,000 lines" in blank.refused.reason


def test_words_a_message_names_are_printable() -> None:
    found = beads_of(
        '{"id": "a", "title": "t", "x\\u0000y": 1, "\\ud800": 2}',
        '{"id": "b\\ud800", "title": ""}',
    )
    record, problem = found
    assert isinstance(record, SourceRecord) and record.source_id == "a"
    assert "\x00" not in record.warnings[0] and "x\ufffdy" in record.warnings[0]
    assert isinstance(problem, SourceProblem) and problem.source_id is not None
    problem.source_id.encode("utf-8")  # no half of a surrogate pair left


def test_the_line_limit_is_the_lines_whatever_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reading, "MAX_LINE_BYTES", 40)
    line = b'{"id": "a", "title": "' + b"t" * 16 + b'"}'
    assert len(line) == 40
    for end in (b"\n", b"\r\n", b""):
        (record,) = read(beads.IMPORTER, io.BytesIO(line + end)).records
        assert record.title == "t" * 16
    longer = read(beads.IMPORTER, io.BytesIO(line[:-2] + b'x"}\r\n' + line + b"\n"))
    assert [p.line for p in longer.problems] == [1] and len(longer.records) == 1


def test_a_file_whose_lines_end_in_cr_alone_is_refused_saying_so() -> None:
    for importer in (beads.IMPORTER, csvfile.IMPORTER):
        data = (
            b"id,title\r1,a\r2,b\r"
            if importer is csvfile.IMPORTER
            else b'{"id": "a", "title": "t"}\r{"id": "b", "title": "t"}\r'
        )
        refused = read(importer, io.BytesIO(data)).refused
        assert refused is not None and "CR alone" in refused.reason
