"""The importers every plugin offers, and a file read through one of them.

:func:`importers` gathers the ``buildmax_importers`` of every plugin by
name (a name offered twice is an error naming both plugins); :func:`read`
reads a file with one, keeping every record and every problem, and adds
the problems an importer may not see: an id the file holds twice, and a
record that no task could hold (too long, or text that is no text: a NUL
character, half of a surrogate pair). What any importer returns is checked
so, a third party's as much as the built-ins'.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field, fields, replace
from typing import BinaryIO

from buildmax_hookspecs import (
    IMPORT_STATES,
    LABEL_PATTERN,
    SOURCE_ID_CHARS,
    TASK_KINDS,
    TASK_LABELS,
    TASK_LINKS,
    TASK_PRIORITIES,
    TASK_TEXT_CHARS,
    TASK_TITLE_CHARS,
    WORD_PATTERN,
    Importer,
    SourceLink,
    SourceProblem,
    SourceRecord,
    SourceRefused,
)

from buildmax.hooks import Hooks

from .reading import printable


class ImporterDeclarationError(RuntimeError):
    """A plugin offered something that is not an importer, or a name taken."""


def importers(hooks: Hooks) -> dict[str, Importer]:
    """Every importer the loaded plugins offer, by name."""
    found: dict[str, tuple[str, Importer]] = {}
    for plugin, offered in hooks.importers():
        for importer in offered:
            if not isinstance(importer, Importer) or not isinstance(importer.name, str):
                raise ImporterDeclarationError(
                    f"plugin {plugin!r} offered {importer!r}, not an importer"
                )
            if not re.fullmatch(WORD_PATTERN, importer.name):
                raise ImporterDeclarationError(
                    f"plugin {plugin!r} offered an importer named {importer.name!r}: a name "
                    "is a lowercase word (letters, digits, '-'; at most 32), as a task's "
                    "source names it"
                )
            if importer.name in found:
                raise ImporterDeclarationError(
                    f"importer {importer.name!r} is offered by plugins "
                    f"{found[importer.name][0]!r} and {plugin!r}"
                )
            found[importer.name] = (plugin, importer)
    return {name: importer for name, (_, importer) in sorted(found.items())}


@dataclass
class Reading:
    """What a file held: its records, in file order, each id once, and
    every problem, by line; ``refused`` when the file could not be read as
    a whole (it says where and why), and then ``records`` hold what was read
    before."""

    records: list[SourceRecord] = field(default_factory=list)
    problems: list[SourceProblem] = field(default_factory=list)
    refused: SourceRefused | None = None


#: The longest each text of a record may be: what a task holds.
LIMITS = {
    "source_id": SOURCE_ID_CHARS,
    "title": TASK_TITLE_CHARS,
    "body": TASK_TEXT_CHARS,
    "criteria": TASK_TEXT_CHARS,
}
#: The texts of a record, each a string.
TEXTS = ("source_id", "title", "body", "criteria", "state", "kind", "source_state", "state_reason")
#: The most warnings a record keeps (then how many more there were).
MAX_WARNINGS = 20
#: Past this many problems a file is refused: it is not what it was read as.
MAX_PROBLEMS = 1000


def read(importer: Importer, source: BinaryIO) -> Reading:
    """``source`` read with ``importer``; a record whose id came before
    is a problem (the first is kept), and so is one no task could hold."""
    reading = Reading()
    first: dict[str, int] = {}
    try:
        for item in importer.read(source):
            if isinstance(item, SourceProblem):
                _problem(reading, item)
                continue
            if not isinstance(item, SourceRecord) or type(item.line) is not int:
                raise SourceRefused(
                    getattr(item, "line", 0) if type(getattr(item, "line", 0)) is int else 0,
                    f"the importer {importer.name!r} gave {type(item).__name__}, not a record "
                    "with its line: a fault of the importer's plugin",
                )
            unfit = _unfit(item)
            if unfit is not None:
                _problem(reading, SourceProblem(item.line, unfit, item.source_id))
            elif item.source_id in first:
                _problem(
                    reading,
                    SourceProblem(
                        item.line,
                        f"id {item.source_id!r} again (first on line {first[item.source_id]}): "
                        "left out",
                        item.source_id,
                    ),
                )
            else:
                first[item.source_id] = item.line
                reading.records.append(_bounded(item))
    except SourceRefused as refused:
        reading.refused = refused
    reading.problems.sort(key=lambda problem: problem.line)
    return reading


def _unfit(record: SourceRecord) -> str | None:
    """Why no task could hold ``record``, or ``None``."""
    for name in TEXTS:
        if not isinstance(getattr(record, name), str):
            return f"{name} is not text"
    if not all(isinstance(label, str) for label in record.labels):
        return "a label is not text"
    if not all(
        isinstance(link, SourceLink) and isinstance(link.kind, str) and isinstance(link.target, str)
        for link in record.links
    ):
        return "a link is not a kind and the id of a record"
    if not record.source_id.strip():
        return "the record has no id"
    if not record.title.strip():
        return "the record has no title"
    for name, text in _strings(record):
        if "\x00" in text:
            return f"{name} holds a NUL character"
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return f"{name} holds half of a surrogate pair: not text"
    for name, most in LIMITS.items():
        length = len(getattr(record, name))
        if length > most:
            return f"{name} is {length:,} characters (at most {most:,})"
    return _unplaceable(record)


def _unplaceable(record: SourceRecord) -> str | None:
    """What of ``record`` is no value a task takes (a third party's importer
    may give anything), or ``None``."""
    low, high = TASK_PRIORITIES
    if record.state not in IMPORT_STATES:
        return f"state {printable(str(record.state))[:40]!r} is none of {', '.join(IMPORT_STATES)}"
    if record.kind not in TASK_KINDS:
        return f"kind {printable(str(record.kind))[:40]!r} is none of {', '.join(TASK_KINDS)}"
    if type(record.priority) is not int or not low <= record.priority <= high:
        return (
            f"priority {printable(str(record.priority))[:40]} is not a whole number {low}..{high}"
        )
    if len(record.labels) > TASK_LABELS:
        return f"{len(record.labels)} labels (at most {TASK_LABELS})"
    for label in record.labels:
        if not re.fullmatch(LABEL_PATTERN, label):
            return f"label {printable(label)[:80]!r} is not a label a task carries"
    for link in record.links:
        if not re.fullmatch(WORD_PATTERN, link.kind):
            return f"a link's kind {printable(link.kind)[:40]!r} is not a lowercase word"
        if not 1 <= len(link.target) <= SOURCE_ID_CHARS:
            return f"a link names an id of {len(link.target):,} characters"
    return None


def _strings(record: SourceRecord) -> Iterator[tuple[str, str]]:
    """Every text of ``record`` (its links' too), with its field's name."""
    for part in fields(record):
        value = getattr(record, part.name)
        for item in value if isinstance(value, tuple) else (value,):
            pieces = (item.kind, item.target) if isinstance(item, SourceLink) else (item,)
            yield from ((part.name, piece) for piece in pieces if isinstance(piece, str))


def _problem(reading: Reading, problem: SourceProblem) -> None:
    """Keep ``problem`` as a message may name it: its words printable, its
    id no longer than an id may be; refuse the file past
    :data:`MAX_PROBLEMS`."""
    if len(reading.problems) == MAX_PROBLEMS:
        raise SourceRefused(
            problem.line,
            f"more than {MAX_PROBLEMS:,} problems: is it the file, and the format, meant?",
        )
    named = problem.source_id
    shown = printable(named)[:SOURCE_ID_CHARS] if isinstance(named, str) else None
    line = problem.line if type(problem.line) is int else 0  # a third party's may be anything
    reading.problems.append(SourceProblem(line, printable(str(problem.reason))[:1000], shown))


def _bounded(record: SourceRecord) -> SourceRecord:
    """``record`` with at most :data:`~buildmax_hookspecs.TASK_LINKS`
    prerequisites and as many other links (the first; a warning says how
    many more) and at most :data:`MAX_WARNINGS` warnings."""
    prerequisites = [link for link in record.links if link.kind == "prerequisite"]
    others = [link for link in record.links if link.kind != "prerequisite"]
    warnings = []  # what is cut here first: never among the warnings cut below
    for what, links in (("prerequisites", prerequisites), ("links", others)):
        if len(links) > TASK_LINKS:
            warnings.append(
                f"{len(links)} {what}: the first {TASK_LINKS} are kept, "
                f"{len(links) - TASK_LINKS} left out"
            )
            del links[TASK_LINKS:]
    warnings += record.warnings
    if len(warnings) > MAX_WARNINGS:
        more = f"and {len(warnings) - MAX_WARNINGS} more warnings"
        warnings = [*warnings[:MAX_WARNINGS], more]
    if len(prerequisites) + len(others) == len(record.links) and warnings == list(record.warnings):
        return record
    return replace(record, links=(*prerequisites, *others), warnings=tuple(warnings))
