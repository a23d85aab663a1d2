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

import json
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import App, TaskRef, Transaction
from wcmatch import glob

from buildmax.tables import spaces

from .tables import lessons, revisions

#: The most lessons a claim offers, and the most bytes of their JSON.
MAX_OFFERED = 5
MAX_OFFERED_BYTES = 8 * 1024
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
    .select_from(
        lessons.join(
            revisions,
            sa.and_(
                revisions.c.lesson_id == lessons.c.id, revisions.c.number == lessons.c.revision
            ),
        )
    )
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


#: How a lesson's path globs read: ``*`` and ``?`` within one folder, ``**``
#: across folders, ``{a,b}`` either, and names starting with a dot matched too.
_GLOB = glob.GLOBSTAR | glob.BRACE | glob.DOTGLOB


def path_applies(applies_to: Mapping[str, Any], path: str) -> bool:
    """Whether a lesson's paths (none: any) admit ``path``: a glob matches
    the whole of it (``src/*.py``, ``src/**``, ``**/*.sql``), or names a
    folder it is under (``src/auth``)."""
    globs = applies_to.get("paths") or []
    return not globs or any(
        glob.globmatch(path, pattern, flags=_GLOB) or path.startswith(pattern.rstrip("/") + "/")
        for pattern in globs
    )


def _pick(rows: list[dict[str, Any]], task: TaskRef) -> list[dict[str, Any]]:
    """The applicable lessons, those tagged with a label of the task first,
    then the project's before the common ones, then by usefulness; cut to
    :data:`MAX_OFFERED` and :data:`MAX_OFFERED_BYTES` (a long text is
    shortened and marked ``truncated``)."""
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
    for _, row in chosen[:MAX_OFFERED]:
        item = {
            "id": row["public_id"],
            "kind": row["kind"],
            "revision": row["revision"],
            "collection": "common" if row["project_id"] is None else "project",
            "title": row["title"],
            "text": row["text"],
            "score": row["score"],
        }
        size = len(json.dumps(item, ensure_ascii=False).encode())
        if size > budget:
            room = budget - (size - len(row["text"].encode())) - 64
            if room < 200:
                break
            item["text"] = row["text"].encode()[:room].decode(errors="ignore") + "…"
            item["truncated"] = True
        offered.append(item)
        budget -= len(json.dumps(item, ensure_ascii=False).encode())
    return offered
