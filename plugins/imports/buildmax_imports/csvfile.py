"""The CSV importer: a UTF-8 CSV file with a header row naming its
columns (any order, any case), one task a row; ``docs/imports.md`` lists
the columns.

``id`` and ``title`` are required; ``body``, ``criteria``, ``state``
(``ready``, ``held``, ``done`` or ``canceled``; ``open``, ``in_progress``
and ``closed`` are read too), ``priority`` (-1000..1000), ``kind``
(``code``, ``review``, ``integration``, ``general``), ``labels``,
``prerequisites`` and ``related`` (each separated by ``;``), ``parent``,
``assignee``, ``url``, ``created_at``, ``closed_at`` and ``close_reason``
are read when present. A column of another name is reported once, on the
header's line, and not imported.
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Iterator
from typing import BinaryIO

from buildmax_hookspecs import (
    TASK_KINDS,
    TASK_PRIORITIES,
    SourceLink,
    SourceProblem,
    SourceRecord,
    SourceRefused,
)

from .reading import MAX_RECORDS, Line, labels, lines, some

COLUMNS = (
    "id",
    "title",
    "body",
    "criteria",
    "state",
    "priority",
    "kind",
    "labels",
    "prerequisites",
    "parent",
    "related",
    "assignee",
    "url",
    "created_at",
    "closed_at",
    "close_reason",
)
#: The words read in ``state``, and what each becomes.
STATES = {
    "": "ready",
    "ready": "ready",
    "open": "ready",
    "held": "held",
    "in_progress": "held",
    "done": "done",
    "closed": "done",
    "canceled": "canceled",
    "cancelled": "canceled",
}
_STATE_WORDS = ", ".join(word for word in STATES if word)
SEPARATOR = ";"


class CsvImporter:
    """Reads a CSV file with the columns of :data:`COLUMNS`."""

    name = "csv"
    title = "CSV file with a header row (columns: docs/imports.md)"

    def read(self, source: BinaryIO) -> Iterator[SourceRecord | SourceProblem]:
        """Each row of the file, or the problem of its lines."""
        spanned: list[Line] = []  # the lines of the row being read, and only those
        rows = csv.reader(_texts(lines(source), spanned), strict=True)
        try:
            header = next(rows)
        except StopIteration:
            raise SourceRefused(1, "the file is empty") from None
        except csv.Error as exc:
            _refuse_json(spanned)
            _refuse_cut(spanned)
            raise SourceRefused(1, f"not CSV: {exc}") from None
        _refuse_json(spanned)
        columns = _header(header, spanned)
        extra = sorted({c for c in columns if c and c not in COLUMNS})
        if extra:
            yield SourceProblem(1, f"columns not imported: {some(extra)}")
        last = spanned[-1].number
        count = 0
        while True:
            spanned.clear()
            try:
                row = next(rows)
            except StopIteration:
                return
            except csv.Error as exc:
                # After a broken quote no row can be told from the text of a
                # cell: the rest of the file is not read as rows.
                _refuse_cut(spanned)
                raise SourceRefused(last + 1, f"not CSV from here: {exc}") from None
            start, last = spanned[0].number, spanned[-1].number
            _refuse_cut(spanned)
            bad = next((line for line in spanned if line.problem is not None), None)
            if bad is not None:
                yield SourceProblem(bad.number, f"{bad.problem}: the row is left out")
                continue
            if not any(cell.strip() for cell in row):
                continue
            count += 1
            if count > MAX_RECORDS:
                raise SourceRefused(start, f"more than {MAX_RECORDS:,} rows: split the file")
            yield _record(dict(zip(columns, row, strict=False)), len(row), len(columns), start)


def _texts(source: Iterator[Line], spanned: list[Line]) -> Iterator[str]:
    """The lines' text for the CSV reader (a line too long as an empty
    one), each kept in ``spanned`` so a row knows its lines."""
    for line in source:
        spanned.append(line)
        yield line.text + "\n"


def _refuse_cut(spanned: list[Line]) -> None:
    """Refuse the rest of the file at a line too long to keep: its quotes
    are lost with it."""
    cut = next((line for line in spanned if line.cut), None)
    if cut is not None:
        raise SourceRefused(cut.number, f"{cut.problem}: the rows after it cannot be told apart")


def _refuse_json(read: list[Line]) -> None:
    if read and read[0].text.lstrip().startswith(("{", "[")):
        raise SourceRefused(1, "JSON, not CSV (beads? --format beads; GitHub's? --format github)")


def _header(cells: list[str], spanned: list[Line]) -> list[str]:
    bad = next((line for line in spanned if line.problem is not None), None)
    if bad is not None:
        raise SourceRefused(bad.number, f"the header row: {bad.problem}")
    columns = [cell.strip().lower() for cell in cells]
    for required in ("id", "title"):
        if required not in columns:
            named = some([c for c in columns if c]) or "none"
            raise SourceRefused(1, f"the header names no {required!r} column (it names {named})")
    taken = {c for c, n in Counter(columns).items() if n > 1 and c}
    if taken:
        raise SourceRefused(1, f"the header row names {', '.join(sorted(taken))} twice")
    return columns


def _record(
    row: dict[str, str], cells: int, columns: int, line: int
) -> SourceRecord | SourceProblem:
    source_id = row.get("id", "").strip()
    if not source_id:
        return SourceProblem(line, "no id")
    title = row.get("title", "").strip()
    if not title:
        return SourceProblem(line, "no title", source_id)
    warnings: list[str] = []
    if cells > columns:
        warnings.append(f"{cells - columns} cells past the header's columns not imported")
    state_word = row.get("state", "").strip().lower()
    if state_word not in STATES:
        return SourceProblem(line, f"state {state_word!r} is none of {_STATE_WORDS}", source_id)
    kind = row.get("kind", "").strip().lower() or "general"
    if kind not in TASK_KINDS:
        return SourceProblem(line, f"kind {kind!r} is none of {', '.join(TASK_KINDS)}", source_id)
    priority_text = row.get("priority", "").strip() or "0"
    try:
        priority = int(priority_text)
    except ValueError:
        return SourceProblem(line, f"priority {priority_text!r} is not a whole number", source_id)
    low, high = TASK_PRIORITIES
    if not low <= priority <= high:
        return SourceProblem(line, f"priority {priority} is outside {low}..{high}", source_id)
    links = [SourceLink("prerequisite", ref) for ref in _split(row.get("prerequisites", ""))]
    parent = row.get("parent", "").strip()
    if parent:
        links.append(SourceLink("parent", parent))
    links += [SourceLink("related", ref) for ref in _split(row.get("related", ""))]
    return SourceRecord(
        source_id=source_id,
        line=line,
        title=title,
        body=row.get("body", ""),
        criteria=row.get("criteria", ""),
        state=STATES[state_word],
        source_state=state_word,
        priority=priority,
        kind=kind,
        labels=labels(_split(row.get("labels", "")), warnings),
        assignee=row.get("assignee", "").strip() or None,
        created_at=row.get("created_at", "").strip() or None,
        closed_at=row.get("closed_at", "").strip() or None,
        close_reason=row.get("close_reason", "").strip() or None,
        url=row.get("url", "").strip() or None,
        links=tuple(dict.fromkeys(links)),
        warnings=tuple(warnings),
    )


def _split(value: str) -> list[str]:
    return [part.strip() for part in value.split(SEPARATOR) if part.strip()]


IMPORTER = CsvImporter()
