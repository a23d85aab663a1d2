"""The lessons a claim offers: the most useful live lessons of the task's
project and of the common collection that apply to the task, bounded in
number and bytes, recorded on the attempt's run environment.

A claim is a hot path: a space whose task's project (and common
collection) has no live lesson costs it no statement once this process has
seen that. The absence is remembered for :data:`ABSENCE_MS` (another
server process may add the first lesson meanwhile; one made here forgets it
at once); a presence is never remembered, so a lesson is offered from the
first claim after it commits on this process, and within
:data:`ABSENCE_MS` on any other.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import App, TaskRef, Transaction

from buildmax.tables import spaces

from .tables import CURRENT_REVISION, lessons, revisions

#: The most lessons a claim offers, and the most bytes of their JSON.
MAX_OFFERED = 5
MAX_OFFERED_BYTES = 8 * 1024
#: The most bytes one lesson takes of them (a long one leaves room for others).
MAX_ONE_OFFER_BYTES = MAX_OFFERED_BYTES // 2
#: The shortest text a shortened offer keeps (else it is left out).
MIN_TEXT = 200
#: How many of the most useful lessons a claim weighs before it picks.
CANDIDATES = 50
#: How long this process trusts that a project has no live lesson.
ABSENCE_MS = 10_000
#: The most (space, project) absences remembered.
_MAX_REMEMBERED = 10_000
_KEY = "lessons.absent"


def _absences(app: App) -> dict[tuple[str, str], int]:
    found: dict[tuple[str, str], int] = app.extensions.setdefault(_KEY, {})
    return found


def forget_absence(app: App, space_id: str) -> None:
    """A lesson of ``space_id`` committed here: its claims look again."""
    absent = _absences(app)
    for key in [k for k in absent if k[0] == space_id]:
        del absent[key]


_CANDIDATES = (
    sa.select(
        lessons.c.public_id,
        lessons.c.project_id,
        lessons.c.kind,
        lessons.c.revision,
        lessons.c.score,
        revisions.c.title,
        revisions.c.text,
        revisions.c.applies_to,
    )
    .select_from(lessons.join(revisions, CURRENT_REVISION))
    .join(spaces, spaces.c.id == lessons.c.space_id)
)


async def offered(app: App, tx: Transaction, task: TaskRef) -> dict[str, Any] | None:
    """``{"lessons": [...]}`` for a claim of ``task``, or ``None`` (and no
    statement when this process knows the project has no live lesson)."""
    key = (task.space_id, task.project_id)
    absent = _absences(app)
    now = app.clock.now_ms()
    seen = absent.get(key)
    if seen is not None and 0 <= now - seen < ABSENCE_MS:
        return None
    rows = await tx.fetch_all(_candidates(task))
    if not rows:
        if len(absent) >= _MAX_REMEMBERED:
            absent.clear()
        absent[key] = now
        return None
    absent.pop(key, None)
    picked = _pick([dict(r) for r in rows], task)
    return {"lessons": picked} if picked else None


def _candidates(task: TaskRef) -> Any:
    return (
        _CANDIDATES.where(
            spaces.c.public_id == task.space_id,
            sa.or_(lessons.c.project_id == task.project_id, lessons.c.project_id.is_(None)),
            lessons.c.superseded_by.is_(None),
        )
        .order_by(lessons.c.score.desc(), lessons.c.id.desc())
        .limit(CANDIDATES)
    )


def applies(applies_to: Mapping[str, Any], task: TaskRef) -> bool:
    """Whether a lesson's applicability admits ``task``: its task kinds
    (none: any) and its tags (none: any; else one of the task's labels)."""
    kinds, tags = applies_to.get("task_kinds") or [], applies_to.get("tags") or []
    if kinds and task.kind not in kinds:
        return False
    return not tags or bool(set(tags) & set(task.labels))


def path_applies(applies_to: Mapping[str, Any], path: str) -> bool:
    """Whether a lesson's paths (none: any) admit ``path``: a glob matches
    the whole of it (``src/*.py``, ``src/**``, ``**/*.sql``), or names a
    folder it is under (``src/auth``)."""
    globs = applies_to.get("paths") or []
    return not globs or any(
        glob_matches(path, pattern) or path.startswith(pattern.rstrip("/") + "/")
        for pattern in globs
    )


def glob_matches(path: str, pattern: str) -> bool:
    """Whether the glob ``pattern`` matches all of ``path``, folder by
    folder: ``**`` is any number of folders, and within one, ``*`` any
    characters, ``?`` one and ``[...]`` one of a set. Matched by folders
    (at most folders(path) x folders(pattern) steps), never by one regular
    expression over the whole path, whose backtracking a pattern such as
    ``**/a*/**/a*/**/b`` turns into minutes."""
    names, parts = path.split("/"), pattern.split("/")
    known: dict[tuple[int, int], bool] = {}

    def match(at: int, part: int) -> bool:
        if (at, part) not in known:
            if part == len(parts):
                found = at == len(names)
            elif parts[part] == "**":
                found = match(at, part + 1) or (at < len(names) and match(at + 1, part))
            else:
                found = (
                    at < len(names)
                    and fnmatch.fnmatchcase(names[at], parts[part])
                    and match(at + 1, part + 1)
                )
            known[at, part] = found
        return known[at, part]

    return match(0, 0)


def _size(item: Mapping[str, Any]) -> int:
    """Bytes of ``item`` as JSON, as the attempt records it (non-ASCII
    escaped: the bound holds for the stored and the sent form)."""
    return len(json.dumps(item))


def _shortened(item: dict[str, Any], budget: int) -> dict[str, Any] | None:
    """``item`` with its text cut to fit ``budget`` bytes (marked
    ``truncated``), or ``None`` when less than :data:`MIN_TEXT` of its
    text would."""
    item = {**item, "truncated": True}
    text = item["text"]
    while text:
        item["text"] = text + "…"
        over = _size(item) - budget
        if over <= 0:
            break
        # Cut by the share of the text's bytes over budget, and a little more.
        share = over / max(1, _size({"t": text}))
        text = text[: max(0, int(len(text) * (1 - share)) - 1)]
    if len(text) < MIN_TEXT:
        return None
    return item


def _pick(rows: list[dict[str, Any]], task: TaskRef) -> list[dict[str, Any]]:
    """The applicable lessons, those tagged with a label of the task first,
    then the project's before the common ones, then by usefulness; cut to
    :data:`MAX_OFFERED` and :data:`MAX_OFFERED_BYTES`, each lesson at most
    :data:`MAX_ONE_OFFER_BYTES` (a long text is shortened and marked
    ``truncated``; one that cannot keep
    :data:`MIN_TEXT` characters is left for a shorter lesson)."""
    labels = set(task.labels)
    chosen = []
    for position, row in enumerate(rows):
        applies_to = json.loads(row["applies_to"])
        if not applies(applies_to, task):
            continue
        tagged = bool(labels & set(applies_to.get("tags") or []))
        common = row["project_id"] is None
        chosen.append(((not tagged, common, position), row))
    chosen.sort(key=lambda pair: pair[0])
    offered: list[dict[str, Any]] = []
    budget = MAX_OFFERED_BYTES
    for _, row in chosen:
        if len(offered) == MAX_OFFERED:
            break
        item = {
            "id": row["public_id"],
            "kind": row["kind"],
            "revision": row["revision"],
            "collection": "common" if row["project_id"] is None else "project",
            "title": row["title"],
            "text": row["text"],
            "score": row["score"],
        }
        room = min(budget, MAX_ONE_OFFER_BYTES)
        fitting = item if _size(item) <= room else _shortened(item, room)
        if fitting is None:
            continue  # no room for it: a shorter one may still fit
        offered.append(fitting)
        budget -= _size(fitting)
    return offered
