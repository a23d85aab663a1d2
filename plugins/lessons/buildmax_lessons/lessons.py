"""Lessons: made, corrected, superseded and voted on, each change audited
in the caller's transaction together with its full-text index entry.

A lesson's row carries what its current revision says that filters read
(kind, applicability as ``,a,b,`` lists) and the votes on that revision;
every revision is kept in ``lesson_revisions``. Sources naming a record
(task, attempt, submission, artifact) must be records of the lesson's
space: :func:`check_sources` asks the tasks plugin (``TaskQueue``) in the
transaction; artifacts are checked by the route before it (they are another
plugin's, reached through the API).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Actor, App, TaskQueue, Transaction

from buildmax.clock import to_rfc3339
from buildmax.ids import new_id
from buildmax.problems import NotFound, ValidationFailed

from .offers import forget_absence
from .problems import BadSource, LessonChanged, LessonSuperseded
from .tables import CURRENT_REVISION, SEARCH, lessons, revisions, votes

#: A lesson with its current revision.
LESSON_SELECT = sa.select(
    lessons,
    revisions.c.title,
    revisions.c.text,
    revisions.c.applies_to,
    revisions.c.sources,
    revisions.c.author_id.label("revised_by"),
    revisions.c.reason.label("correction_reason"),
).select_from(
    lessons.join(
        revisions,
        CURRENT_REVISION,
    )
)


def listed(values: Iterable[str]) -> str:
    """``,a,b,`` (empty for none): a list one ``,value,`` containment finds."""
    values = list(values)
    return "," + ",".join(values) + "," if values else ""


def contains(column: Any, value: str, dialect: str) -> Any:
    """``column`` (a :func:`listed` list) holds ``value``: case-sensitive on
    both engines (SQLite's ``LIKE`` folds ASCII case)."""
    needle = "," + value + ","
    if dialect == "sqlite":
        return sa.func.instr(column, needle) > 0
    return sa.func.strpos(column, needle) > 0


def _canonical(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


async def check_sources(
    app: App, tx: Transaction, space_id: str, sources: Sequence[Mapping[str, Any]]
) -> None:
    """Every task, attempt and submission a source names is a record of
    space ``space_id``; :class:`BadSource` (422) naming the first that is not."""
    queue = app.services.get(TaskQueue)
    for number, source in enumerate(sources):
        kind, ident = source["type"], str(source.get("id"))
        if kind == "task":
            found: Any = await queue.task(tx, ident)
        elif kind == "attempt":
            found = await queue.attempt(tx, ident)
        elif kind == "submission":
            submission = await queue.submission(tx, ident)
            found = submission and await queue.task(tx, submission.task_id)
        else:
            continue
        if found is None or found.space_id != space_id:
            raise BadSource(
                f"no {kind} {ident!r} in this space",
                errors={"sources": {str(number): ["No such record in this space."]}},
            )


async def create(
    app: App,
    tx: Transaction,
    actor: Actor,
    space: tuple[int, str],
    project_id: str | None,
    data: Mapping[str, Any],
    *,
    via: Mapping[str, Any] | None = None,
    admin_override: bool = False,
) -> str:
    """A new lesson of ``space`` (its key and public id) in ``project_id``
    (``None``: the common collection) from a validated :class:`LessonIn`;
    audited, indexed; its public id. ``via`` names the submission that
    carried it, for the audit event."""
    space_pk, space_id = space
    now = app.clock.now_ms()
    public_id = new_id("ls")
    applies = data["applies_to"]
    lesson_pk = await tx.fetch_val(
        lessons.insert()
        .values(
            public_id=public_id,
            space_id=space_pk,
            project_id=project_id,
            kind=data["kind"],
            revision=1,
            task_kinds=listed(applies["task_kinds"]),
            tags=listed(applies["tags"]),
            author_id=actor.principal_id,
            created_at=now,
            updated_at=now,
        )
        .returning(lessons.c.id)
    )
    await _add_revision(app, tx, actor, int(lesson_pk), 1, data, reason="")
    await SEARCH.put(tx, int(lesson_pk), space_pk, {"title": data["title"], "text": data["text"]})
    details: dict[str, Any] = {"project_id": project_id, "kind": data["kind"], "revision": 1}
    details.update(via or {})
    await app.audit.record(
        tx,
        actor,
        "lesson.created",
        space_id=space_id,
        target_type="lesson",
        target_id=public_id,
        details=details,
        admin_override=admin_override,
    )
    tx.after_commit(lambda: forget_absence(app, space_id))
    return public_id


async def _add_revision(
    app: App,
    tx: Transaction,
    actor: Actor,
    lesson_pk: int,
    number: int,
    data: Mapping[str, Any],
    *,
    reason: str,
) -> None:
    await tx.execute(
        revisions.insert().values(
            lesson_id=lesson_pk,
            number=number,
            kind=data["kind"],
            title=data["title"],
            text=data["text"],
            applies_to=_canonical(data["applies_to"]),
            sources=_canonical(data["sources"]),
            author_id=actor.principal_id,
            author_kind=actor.kind,
            reason=reason,
            created_at=app.clock.now_ms(),
        )
    )


async def find(
    conn: Transaction, space_pk: int, ident: str, *, for_update: bool = False
) -> dict[str, Any]:
    """The lesson ``ident`` of the space with its current revision, or 404;
    ``for_update`` locks the lesson's row first (until the transaction
    ends), so the revision read is the one a write then builds on."""
    if for_update:
        await lock(conn, space_pk, [ident])
    query = LESSON_SELECT.where(lessons.c.space_id == space_pk, lessons.c.public_id == ident)
    row = await conn.fetch_one(query)
    if row is None:
        raise NotFound("no such lesson in this space")
    return dict(row)


async def lock(tx: Transaction, space_pk: int, idents: Sequence[str]) -> None:
    """Lock the rows of the space's lessons ``idents``, in one order (so two
    writers locking the same two never wait on each other), on PostgreSQL;
    SQLite's one writer has them already. The lock is taken on the lesson
    row alone: a read joined to a revision, locked as it is changed, would
    lose the row it waited for."""
    if tx.dialect == "postgresql":
        await tx.fetch_all(
            sa.select(lessons.c.id)
            .where(lessons.c.space_id == space_pk, lessons.c.public_id.in_(sorted(idents)))
            .order_by(lessons.c.id)
            .with_for_update()
        )


def current_data(row: Mapping[str, Any]) -> dict[str, Any]:
    """The current revision's fields, as a :class:`LessonIn` would give them."""
    return {
        "kind": row["kind"],
        "title": row["title"],
        "text": row["text"],
        "applies_to": json.loads(row["applies_to"]),
        "sources": json.loads(row["sources"]),
    }


async def correct(
    app: App,
    tx: Transaction,
    actor: Actor,
    space: tuple[int, str],
    ident: str,
    data: Mapping[str, Any],
    *,
    admin_override: bool = False,
) -> dict[str, Any]:
    """A new revision of lesson ``ident``: what ``data`` (a validated
    :class:`Correction`) changes over the current revision, which it must
    name (409 ``lesson-changed`` otherwise; 409 ``lesson-superseded`` for a
    superseded lesson; 422 when nothing differs). Its votes start afresh.
    The lesson as it now stands."""
    space_pk, space_id = space
    row = await find(tx, space_pk, ident, for_update=True)
    if row["superseded_by"] is not None:
        raise LessonSuperseded(f"the lesson was superseded by {row['superseded_by']}")
    if data["revision"] != row["revision"]:
        raise LessonChanged(
            f"the lesson is at revision {row['revision']}, not {data['revision']}",
            current_revision=row["revision"],
        )
    fresh = current_data(row)
    changed = sorted(
        name for name in fresh if name in data and _canonical(data[name]) != _canonical(fresh[name])
    )
    if not changed:
        raise ValidationFailed(
            "a correction changes the kind, title, text, applies_to or sources",
            errors={"_schema": ["Nothing differs from the current revision."]},
        )
    fresh.update({name: data[name] for name in changed})
    number = row["revision"] + 1
    now = app.clock.now_ms()
    done = await tx.fetch_val(
        sa.update(lessons)
        .where(lessons.c.id == row["id"], lessons.c.revision == row["revision"])
        .values(
            revision=number,
            kind=fresh["kind"],
            task_kinds=listed(fresh["applies_to"]["task_kinds"]),
            tags=listed(fresh["applies_to"]["tags"]),
            helpful=0,
            not_helpful=0,
            wrong=0,
            score=0,
            updated_at=now,
        )
        .returning(lessons.c.id)
    )
    if done is None:
        raise LessonChanged("the lesson was corrected meanwhile")
    await _add_revision(app, tx, actor, row["id"], number, fresh, reason=data["reason"])
    await SEARCH.put(tx, row["id"], space_pk, {"title": fresh["title"], "text": fresh["text"]})
    await app.audit.record(
        tx,
        actor,
        "lesson.corrected",
        space_id=space_id,
        target_type="lesson",
        target_id=ident,
        admin_override=admin_override,
        details={"revision": number, "reason": data["reason"][:500], "changed": changed},
    )
    return await find(tx, space_pk, ident)


async def supersede(
    app: App,
    tx: Transaction,
    actor: Actor,
    space: tuple[int, str],
    ident: str,
    by: str,
    reason: str,
    *,
    admin_override: bool = False,
) -> dict[str, Any]:
    """Mark lesson ``ident`` superseded by lesson ``by`` (of the same space,
    itself live): hidden from default results, still read by its id.
    Superseding again by the same lesson answers it as it stands; by
    another is 409. The lesson as it now stands."""
    space_pk, space_id = space
    if by == ident:
        raise BadSource("a lesson cannot supersede itself", errors={"by": ["Name another lesson."]})
    await lock(tx, space_pk, [ident, by])
    row = await find(tx, space_pk, ident)
    if row["superseded_by"] == by:
        return row
    if row["superseded_by"] is not None:
        raise LessonSuperseded(f"the lesson was already superseded by {row['superseded_by']}")
    replacement = await tx.fetch_one(
        sa.select(lessons.c.id, lessons.c.superseded_by).where(
            lessons.c.space_id == space_pk, lessons.c.public_id == by
        )
    )
    if replacement is None:
        raise BadSource("no such replacement lesson in this space", errors={"by": ["Not found."]})
    if replacement["superseded_by"] is not None:
        raise LessonSuperseded(
            f"the replacement was itself superseded by {replacement['superseded_by']}"
        )
    now = app.clock.now_ms()
    await tx.execute(
        sa.update(lessons)
        .where(lessons.c.id == row["id"])
        .values(superseded_by=by, superseded_at=now, superseded_reason=reason, updated_at=now)
    )
    await app.audit.record(
        tx,
        actor,
        "lesson.superseded",
        space_id=space_id,
        target_type="lesson",
        target_id=ident,
        admin_override=admin_override,
        details={"by": by, "reason": reason[:500]},
    )
    return await find(tx, space_pk, ident)


_SCORE = {"helpful": 1, "not_helpful": -1, "wrong": -2}


async def vote(
    app: App,
    tx: Transaction,
    actor: Actor,
    space: tuple[int, str],
    ident: str,
    data: Mapping[str, Any],
    *,
    admin_override: bool = False,
) -> dict[str, Any]:
    """Record ``actor``'s vote on the lesson's current revision (a revision
    named must be it: 409 ``lesson-changed`` otherwise). One vote per
    principal and revision: voting again replaces it (the same vote again
    changes nothing). The lesson as it now stands. A superseded lesson
    takes no vote (409 ``lesson-superseded``)."""
    space_pk, space_id = space
    row = await find(tx, space_pk, ident, for_update=True)
    if row["superseded_by"] is not None:
        raise LessonSuperseded(f"the lesson was superseded by {row['superseded_by']}: vote on it")
    revision = data["revision"] if data["revision"] is not None else row["revision"]
    if revision != row["revision"]:
        raise LessonChanged(
            f"the lesson is at revision {row['revision']}: vote on it, not {revision}",
            current_revision=row["revision"],
        )
    now = app.clock.now_ms()
    earlier = await tx.fetch_one(
        sa.select(votes.c.id, votes.c.vote, votes.c.note).where(
            votes.c.lesson_id == row["id"],
            votes.c.revision == revision,
            votes.c.principal_id == actor.principal_id,
        )
    )
    if earlier is not None and (earlier["vote"], earlier["note"]) == (data["vote"], data["note"]):
        return row
    if earlier is None:
        await tx.execute(
            votes.insert().values(
                lesson_id=row["id"],
                revision=revision,
                principal_id=actor.principal_id,
                vote=data["vote"],
                note=data["note"],
                created_at=now,
                updated_at=now,
            )
        )
    else:
        await tx.execute(
            sa.update(votes)
            .where(votes.c.id == earlier["id"])
            .values(vote=data["vote"], note=data["note"], updated_at=now)
        )
    counts: dict[str, Any] = {}
    if earlier is None or earlier["vote"] != data["vote"]:
        counts[data["vote"]] = lessons.c[data["vote"]] + 1
        shift = _SCORE[data["vote"]]
        if earlier is not None:
            counts[earlier["vote"]] = lessons.c[earlier["vote"]] - 1
            shift -= _SCORE[earlier["vote"]]
        counts["score"] = lessons.c.score + shift
        await tx.execute(sa.update(lessons).where(lessons.c.id == row["id"]).values(**counts))
    await app.audit.record(
        tx,
        actor,
        "lesson.voted",
        space_id=space_id,
        target_type="lesson",
        target_id=ident,
        admin_override=admin_override,
        details={"revision": revision, "vote": data["vote"]},
    )
    return await find(tx, space_pk, ident)


async def supersedes(conn: Transaction, space_pk: int, ident: str) -> list[str]:
    """The lessons ``ident`` replaced, oldest first."""
    rows = await conn.fetch_all(
        sa.select(lessons.c.public_id)
        .where(lessons.c.space_id == space_pk, lessons.c.superseded_by == ident)
        .order_by(lessons.c.id)
        .limit(100)
    )
    return [r["public_id"] for r in rows]


def view(row: Mapping[str, Any], space_id: str, replaced: Sequence[str] = ()) -> dict[str, Any]:
    """A lesson as the API shows it."""
    return {
        "id": row["public_id"],
        "space_id": space_id,
        "project_id": row["project_id"],
        "collection": "common" if row["project_id"] is None else "project",
        "kind": row["kind"],
        "title": row["title"],
        "text": row["text"],
        "applies_to": json.loads(row["applies_to"]),
        "sources": json.loads(row["sources"]),
        "revision": row["revision"],
        "author_id": row["author_id"],
        "revised_by": row["revised_by"],
        "correction_reason": row["correction_reason"],
        "usefulness": {
            "helpful": row["helpful"],
            "not_helpful": row["not_helpful"],
            "wrong": row["wrong"],
            "score": row["score"],
        },
        "superseded_by": row["superseded_by"],
        "superseded_at": to_rfc3339(row["superseded_at"]) if row["superseded_at"] else None,
        "superseded_reason": row["superseded_reason"],
        "supersedes": list(replaced),
        "created_at": to_rfc3339(row["created_at"]),
        "updated_at": to_rfc3339(row["updated_at"]),
    }
