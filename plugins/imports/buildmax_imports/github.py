"""The GitHub importer: the JSON array that ``gh issue list --state all
--json number,title,body,state,labels,assignees,createdAt,closedAt,url``
prints (``stateReason`` is read too when it is asked for).

An issue's source id is ``owner/repo#number`` (from its ``url``; ``#number``
without one). ``body`` is the task's body (GitHub has no acceptance
criteria); ``OPEN`` is ready, ``CLOSED`` done, or canceled when its
``stateReason`` is ``NOT_PLANNED``; label names are labels; the first
assignee's login is kept (a task has one). GitHub's list carries no
dependencies, so an imported issue has no prerequisite or link.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, BinaryIO

from buildmax_hookspecs import SourceProblem, SourceRecord, SourceRefused

from .reading import MAX_FILE_BYTES, MAX_RECORDS, labels, text, unknown

#: The fields read (the ``--json`` list above, plus ``stateReason`` and ``id``).
KNOWN = frozenset(
    {
        "number",
        "title",
        "body",
        "state",
        "stateReason",
        "labels",
        "assignees",
        "createdAt",
        "closedAt",
        "url",
        "id",
    }
)
_ISSUE_URL = re.compile(r"^https://[^/]+/([^/]+/[^/]+)/issues/(\d+)$")
_SPACE = re.compile(r"\s*")


class GithubImporter:
    """Reads the JSON of ``gh issue list --json ...`` (module docstring)."""

    name = "github"
    title = "GitHub issues, as gh issue list --state all --json ... prints them (docs/imports.md)"

    def read(self, source: BinaryIO) -> Iterator[SourceRecord | SourceProblem]:
        """Each issue of the list, or the problem of the line it starts on."""
        data = source.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise SourceRefused(1, f"the file is larger than {MAX_FILE_BYTES // 1024 // 1024} MiB")
        if data.startswith(b"\xef\xbb\xbf"):
            data = data[3:]
        try:
            document = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            raise SourceRefused(line, f"not UTF-8 text: byte 0x{data[exc.start]:02x}") from None
        for count, (line, value) in enumerate(_items(document), 1):
            if count > MAX_RECORDS:
                raise SourceRefused(line, f"more than {MAX_RECORDS:,} issues: split the file")
            yield issue(value, line)


def _items(document: str) -> Iterator[tuple[int, Any]]:
    """Each element of the JSON array ``document``, with the line it
    starts on; :class:`SourceRefused` when it is not an array of JSON."""
    decoder = json.JSONDecoder()
    at = _SPACE.match(document, 0).end()  # type: ignore[union-attr]
    if at == len(document):
        raise SourceRefused(1, "the file is empty")
    if document[at] != "[":
        raise SourceRefused(
            document.count("\n", 0, at) + 1,
            "not a JSON array: not GitHub's issue list (a beads export? --format beads)",
        )
    counted, line = 0, 1
    at = _SPACE.match(document, at + 1).end()  # type: ignore[union-attr]
    if document.startswith("]", at):
        return
    while True:
        line += document.count("\n", counted, at)
        counted = at
        try:
            value, end = decoder.raw_decode(document, at)
        except json.JSONDecodeError as exc:
            raise SourceRefused(exc.lineno, f"not JSON: {exc.msg} at column {exc.colno}") from None
        except RecursionError:
            raise SourceRefused(line, "not JSON we read: nested too deeply") from None
        except ValueError as exc:  # a number past Python's digits, say
            raise SourceRefused(line, f"not JSON we read: {str(exc).split(';')[0]}") from None
        yield line, value
        at = _SPACE.match(document, end).end()  # type: ignore[union-attr]
        if document.startswith(",", at):
            at = _SPACE.match(document, at + 1).end()  # type: ignore[union-attr]
            continue
        if document.startswith("]", at) and not document[at + 1 :].strip():
            return
        where = document.count("\n", 0, at) + 1
        raise SourceRefused(where, "not JSON: the array does not end after its last element")


def issue(value: Any, line: int) -> SourceRecord | SourceProblem:
    """One issue of the list as a record, or why it cannot be one."""
    if not isinstance(value, dict):
        return SourceProblem(line, "not a JSON object")
    number = value.get("number")
    if not isinstance(number, int) or isinstance(number, bool) or number < 1:
        return SourceProblem(line, "no number (a whole number from 1)")
    url = text(value.get("url"))
    found = _ISSUE_URL.match(url or "")
    source_id = f"{found.group(1)}#{number}" if found else f"#{number}"
    warnings = unknown(set(value), KNOWN)
    if url is not None and (found is None or found.group(2) != str(number)):
        warnings.append(f"url {url[:200]!r} is not that of issue {number}: its id is {source_id}")
    title = value.get("title")
    if not isinstance(title, str) or not title.strip():
        return SourceProblem(line, "no title (a non-empty string)", source_id)
    state = value.get("state")
    if state == "OPEN":
        mapped, reason = "ready", ""
    elif state == "CLOSED":
        not_planned = value.get("stateReason") == "NOT_PLANNED"
        mapped, reason = ("canceled", "closed as not planned") if not_planned else ("done", "")
    else:
        return SourceProblem(
            line, f"state {str(state)[:80]!r} is neither OPEN nor CLOSED", source_id
        )
    names = _names(value.get("labels"), "name", "labels", warnings)
    logins = _names(value.get("assignees"), "login", "assignees", warnings)
    if len(logins) > 1:
        warnings.append(f"assignees {', '.join(logins[1:])} not imported (a task has one)")
    return SourceRecord(
        source_id=source_id,
        line=line,
        title=title.strip(),
        body=text(value.get("body")) or "",
        state=mapped,
        source_state=str(state),
        state_reason=reason,
        kind="code",
        labels=labels(names, warnings),
        assignee=logins[0] if logins else None,
        created_at=text(value.get("createdAt")),
        closed_at=text(value.get("closedAt")),
        url=url,
        warnings=tuple(warnings),
    )


def _names(value: Any, key: str, field: str, warnings: list[str]) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(
        isinstance(item, dict) and isinstance(item.get(key), str) for item in value
    ):
        warnings.append(f"{field} is not a list of objects with a {key!r}: left out")
        return []
    return [item[key] for item in value]


IMPORTER = GithubImporter()
