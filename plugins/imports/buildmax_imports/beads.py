"""The beads importer: a beads JSONL export (``.beads/issues.jsonl``), one
issue a line, read into BuildMax's terms as ``docs/imports.md`` maps them.

- ``title``; ``description`` (with ``design`` and ``notes`` after it, under
  their own headings) is the task's body, ``acceptance_criteria`` its
  criteria.
- ``status``: ``open`` is ready; ``closed`` done; ``in_progress`` and
  ``hooked`` (someone was at it), ``deferred`` and ``pinned`` held, so that
  no agent takes work that may still be going on elsewhere, until a person
  lifts the hold; ``blocked`` ready behind its blockers (held when the
  export names none); ``tombstone`` (deleted) is left out and said so.
- ``priority`` 0 (critical) to 4 (lowest) is 200, 100, 0, -100, -200.
- ``issue_type``: ``bug``, ``feature``, ``task`` and ``chore`` are code,
  ``merge-request`` integration, anything else general; the type is kept as
  the label ``type:<issue_type>``.
- ``dependencies``: ``blocks`` become prerequisites; ``parent-child``,
  ``related``, ``discovered-from`` (and any other type) are kept as links.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, BinaryIO

from buildmax_hookspecs import WORD_PATTERN, SourceLink, SourceProblem, SourceRecord, SourceRefused

from .reading import MAX_RECORDS, labels, lines, printable, text, unknown

#: Fields of a beads issue this importer reads or knows it leaves out.
KNOWN = frozenset(
    {
        "id",
        "title",
        "description",
        "design",
        "acceptance_criteria",
        "notes",
        "status",
        "priority",
        "issue_type",
        "assignee",
        "labels",
        "dependencies",
        "created_at",
        "updated_at",
        "closed_at",
        "close_reason",
        # Read by beads, of no use to a task: left out without a word.
        "created_by",
        "estimated_minutes",
        "due_at",
        "defer_until",
        "compaction_level",
        "compacted_at",
        "original_size",
        "content_hash",
        "source_repo",
    }
)
#: What each beads status becomes, and why when it is not plain.
HELD = "held, so that no agent takes work that may still be going on; lift the hold to release it"
STATES: dict[str, tuple[str, str]] = {
    "open": ("ready", ""),
    "closed": ("done", ""),
    "in_progress": ("held", f"in progress in beads: {HELD}"),
    "hooked": ("held", f"attached to an agent in beads: {HELD}"),
    "deferred": ("held", "deferred in beads: held until a person releases it"),
    "pinned": ("held", "pinned in beads (a context marker): held until a person releases it"),
    "blocked": ("ready", "blocked in beads: it waits for its prerequisites"),
}
#: beads issue types that are code work, and the one that is integration.
CODE_TYPES = frozenset({"bug", "feature", "task", "chore"})
#: What each beads dependency type becomes.
LINKS = {"blocks": "prerequisite", "parent-child": "parent"}


class BeadsImporter:
    """Reads a beads JSONL export (``bd export``, ``.beads/issues.jsonl``)."""

    name = "beads"
    title = "beads JSONL export (.beads/issues.jsonl)"

    def read(self, source: BinaryIO) -> Iterator[SourceRecord | SourceProblem]:
        """Each issue of the export, or the problem of its line."""
        first = True
        count = 0
        for line in lines(source):
            if line.problem is not None:
                yield SourceProblem(line.number, line.problem)
                continue
            if not line.text.strip():
                continue
            try:
                value = json.loads(line.text)
            except (ValueError, RecursionError) as exc:
                if first:
                    raise SourceRefused(line.number, _not_beads(line.text)) from None
                yield SourceProblem(line.number, f"not JSON: {_json_error(exc)}")
                continue
            if not isinstance(value, dict):
                if first:
                    raise SourceRefused(line.number, _not_beads(line.text))
                yield SourceProblem(line.number, "not a JSON object")
                continue
            first = False
            count += 1
            if count > MAX_RECORDS:
                raise SourceRefused(line.number, f"more than {MAX_RECORDS:,} issues: split it")
            yield issue(value, line.number)
        if first:
            raise SourceRefused(1, "no issue in the file: not a beads export")


def _json_error(exc: ValueError | RecursionError) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at column {exc.colno}"
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    return str(exc).split(";")[0]


def _not_beads(first_line: str) -> str:
    stripped = first_line.lstrip()
    if stripped.startswith("["):
        return "a JSON array, not an issue a line: not a beads export (GitHub's? --format github)"
    return "not a JSON object: not a beads export (a CSV file? --format csv)"


def issue(value: dict[str, Any], line: int) -> SourceRecord | SourceProblem:
    """One beads issue as a record, or why it cannot be one."""
    source_id = value.get("id")
    if not isinstance(source_id, str) or not source_id.strip():
        return SourceProblem(line, "no id (a non-empty string)")
    title = value.get("title")
    if not isinstance(title, str) or not title.strip():
        return SourceProblem(line, "no title (a non-empty string)", source_id)
    status = value.get("status", "open")
    if not isinstance(status, str):
        status = repr(status)[:80]
    if status == "tombstone":
        return SourceProblem(line, "deleted in beads (tombstone): left out", source_id)
    warnings = unknown(set(value), KNOWN)
    links = _links(value.get("dependencies"), source_id, warnings)
    state, reason = STATES.get(status, ("held", f"status {status!r} unknown: held"))
    if status == "blocked" and not any(link.kind == "prerequisite" for link in links):
        state, reason = "held", "blocked in beads, by nothing in the export: held"
    issue_type = text(value.get("issue_type")) or "task"
    return SourceRecord(
        source_id=source_id,
        line=line,
        title=title.strip(),
        body=_body(value),
        criteria=text(value.get("acceptance_criteria")) or "",
        state=state,
        source_state=str(status),
        state_reason=reason,
        priority=_priority(value.get("priority", 2), warnings),
        kind=_kind(issue_type),
        labels=labels([*_strings(value.get("labels"), warnings), f"type:{issue_type}"], warnings),
        assignee=text(value.get("assignee")) or None,
        created_at=text(value.get("created_at")),
        closed_at=text(value.get("closed_at")),
        close_reason=text(value.get("close_reason")) or None,
        links=links,
        warnings=tuple(warnings),
    )


def _body(value: dict[str, Any]) -> str:
    parts = [text(value.get("description")) or ""]
    for field, heading in (("design", "Design"), ("notes", "Notes")):
        extra = text(value.get(field))
        if extra:
            parts.append(f"## {heading}\n\n{extra}")
    return "\n\n".join(part for part in parts if part)


def _priority(value: Any, warnings: list[str]) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 4:
        return (2 - value) * 100
    warnings.append(f"priority {value!r} is not 0-4: imported as 0 (beads' 2)")
    return 0


def _kind(issue_type: str) -> str:
    if issue_type in CODE_TYPES:
        return "code"
    return "integration" if issue_type == "merge-request" else "general"


def _strings(value: Any, warnings: list[str]) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        warnings.append("labels is not a list of strings: left out")
        return []
    return list(value)


def _links(value: Any, source_id: str, warnings: list[str]) -> tuple[SourceLink, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        warnings.append("dependencies is not a list: left out")
        return ()
    found: dict[SourceLink, None] = {}
    for number, dependency in enumerate(value, 1):
        if not isinstance(dependency, dict) or not isinstance(dependency.get("depends_on_id"), str):
            warnings.append(f"dependency {number} names no depends_on_id: left out")
            continue
        owner = dependency.get("issue_id", source_id)
        if owner != source_id:
            warnings.append(
                f"dependency {number} is of issue {str(owner)[:80]!r}, not this one: left out"
            )
            continue
        kind = dependency.get("type", "blocks")
        if not isinstance(kind, str) or not kind:
            warnings.append(f"dependency {number} has no type: left out")
            continue
        kind = LINKS.get(kind, kind)
        if not re.fullmatch(WORD_PATTERN, kind):
            warnings.append(
                f"dependency {number} is of type {printable(kind)[:40]!r}, not a word: "
                "kept as a related link"
            )
            kind = "related"
        found[SourceLink(kind, dependency["depends_on_id"])] = None
    return tuple(found)


IMPORTER = BeadsImporter()
