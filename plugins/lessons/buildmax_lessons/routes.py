"""Lessons over HTTP, under ``/v1/spaces/{space}/lessons``.

``POST /lessons`` makes one (members); ``GET /lessons`` lists and searches
(viewers); ``GET /lessons/{id}`` shows one as it stands, superseded or not;
``/revisions`` lists and adds corrections, ``/supersede`` names a
replacement, ``/votes`` records and lists usefulness votes. An attempt's
token reads, makes and votes on lessons of its attempt's space (404 in
any other), so an agent at work needs no other.
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import TaskQueue, Transaction
from quart import Blueprint, Response

from buildmax.access import SpaceAccess
from buildmax.apidoc import api, query_args
from buildmax.auth import Caller
from buildmax.bodies import json_response
from buildmax.clock import to_rfc3339
from buildmax.current import current_buildmax
from buildmax.fulltext import RANKED_MATCHES, QueryRefused, parse_query
from buildmax.idempotency import Reply, Work
from buildmax.internal import InternalApi
from buildmax.pagination import page_body, page_request
from buildmax.problems import BadCursor, NotFound, Problem, ValidationFailed

from . import lessons as domain
from .problems import BadSource
from .schemas import (
    LessonCorrection,
    LessonIn,
    LessonOut,
    LessonPage,
    LessonQuery,
    LessonRevisionPage,
    LessonSupersession,
    LessonVoteIn,
    LessonVotePage,
)
from .search import Filters, listing, search
from .tables import revisions, votes

blueprint = Blueprint("lessons", __name__)

ATTEMPT_SCOPE = ("attempt",)
TAGS = ["lessons"]


async def _project_id(conn: Transaction, access: SpaceAccess, ref: str | None) -> str | None:
    """The public id of project ``ref`` of the space (404 when none), or
    ``None`` for none named."""
    if ref is None:
        return None
    project = await current_buildmax().services.get(TaskQueue).project(conn, access.public_id, ref)
    if project is None:
        raise NotFound("no such project in this space")
    return project.id


async def _own_space(caller: Caller, access: SpaceAccess) -> None:
    """An attempt's token reaches the lessons of its attempt's space only:
    404 in any other, as if the space did not exist."""
    if caller.actor.scope_type != "attempt":
        return
    app = current_buildmax()
    async with app.db.read() as conn:
        attempt = await app.services.get(TaskQueue).attempt(conn, str(caller.actor.scope_id))
    if attempt is None or attempt.space_id != access.public_id:
        raise NotFound("no such space")


async def _check_artifacts(caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> None:
    """Every artifact a source names is one of the space's (through the
    artifacts plugin's route, as the caller): 422 naming the first that is not."""
    api_ = InternalApi(current_buildmax(), caller)
    for number, source in enumerate(data.get("sources") or ()):
        if source["type"] != "artifact":
            continue
        try:
            await api_.get(f"/v1/spaces/{access.public_id}/artifacts/{source['id']}")
        except Problem as refused:
            if refused.status != 404:
                raise
            raise BadSource(
                f"no artifact {source['id']!r} in this space",
                errors={"sources": {str(number): ["No such artifact in this space."]}},
            ) from None


async def _shown(conn: Transaction, access: SpaceAccess, row: dict[str, Any]) -> dict[str, Any]:
    replaced = await domain.supersedes(conn, access.pk, row["public_id"])
    return domain.view(row, access.public_id, replaced)


@blueprint.post("/v1/spaces/<space>/lessons")
@api(
    "Publish a lesson in a project or the space's common collection (members)",
    body=LessonIn,
    response=LessonOut,
    status=201,
    scopes=ATTEMPT_SCOPE,
    idempotent=True,
    role="member",
    action="lessons.write",
    tags=TAGS,
)
async def create_lesson(caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """``project`` (id or name) puts it in that project; without one it is
    the space's common collection, offered in every project. Sources name
    records of this space (task, attempt, submission, artifact) or a URL."""
    app = current_buildmax()
    await _own_space(caller, access)
    await _check_artifacts(caller, access, data)

    async def work(tx: Transaction) -> Reply:
        project_id = await _project_id(tx, access, data["project"])
        await domain.check_sources(app, tx, access.public_id, data["sources"])
        public_id = await domain.create(
            app,
            tx,
            caller.actor,
            (access.pk, access.public_id),
            project_id,
            data,
            admin_override=access.admin_override,
        )
        return Reply(201, await _shown(tx, access, await domain.find(tx, access.pk, public_id)))

    return work


@blueprint.get("/v1/spaces/<space>/lessons")
@api(
    "List or search the space's lessons (viewers)",
    response=LessonPage,
    query=LessonQuery,
    scopes=ATTEMPT_SCOPE,
    role="viewer",
    action="lessons.read",
    tags=TAGS,
)
async def list_lessons(caller: Caller, access: SpaceAccess) -> Response:
    """Without ``q``, newest first. With ``q`` (words and ``"phrases"``,
    all required, stemmed: ``failing`` finds ``fails``), the most relevant
    first (of the newest 1,000 that match and pass the filters), then the
    most useful, then the most recently changed; each item's
    ``match.snippet`` marks the matched words between U+0002 and U+0003.
    Superseded lessons are left out unless ``superseded`` is ``include`` or
    ``only``. ``project`` keeps that
    project's lessons and (unless ``common=exclude``) the common ones."""
    app = current_buildmax()
    await _own_space(caller, access)
    args = query_args()
    text = args.get("q")
    try:
        parsed = parse_query(text) if text is not None else None
    except QueryRefused as exc:
        raise ValidationFailed(str(exc), errors={"q": [str(exc)]}) from None
    page = page_request((int,) if parsed is not None else (str,))
    # A search ranks up to a thousand lessons, and a path filter may read
    # many rows: no read for the event loop's connection.
    searching = parsed is not None or args.get("path") is not None
    async with app.db.read(background=searching) as conn:
        filters = Filters(
            project_id=await _project_id(conn, access, args.get("project")),
            common=args.get("common", "include"),
            kind=args.get("kind"),
            task_kind=args.get("task_kind"),
            tag=args.get("tag"),
            path=args.get("path"),
            superseded=args.get("superseded", "exclude"),
        )
        if parsed is None:
            after = page.after[0] if page.after is not None else None
            rows, cursor = await listing(conn, access.pk, filters, page.limit, after)
        else:
            offset = page.after[0] if page.after is not None else 0
            if not 0 <= offset < RANKED_MATCHES:
                raise BadCursor("the cursor is not one this server issued")
            rows, cursor = await search(conn, access.pk, parsed, filters, page.limit, offset)
        items = []
        for row in rows:
            item = domain.view(row, access.public_id)
            if "match" in row:
                item["match"] = row["match"]
            items.append(item)
    return json_response({"items": items, "next_cursor": cursor})


@blueprint.get("/v1/spaces/<space>/lessons/<lesson>")
@api(
    "Show a lesson as it stands, superseded or not (viewers)",
    response=LessonOut,
    scopes=ATTEMPT_SCOPE,
    role="viewer",
    action="lessons.read",
    tags=TAGS,
)
async def show_lesson(lesson: str, caller: Caller, access: SpaceAccess) -> Response:
    """Its current revision, usefulness, what superseded it and what it supersedes."""
    app = current_buildmax()
    await _own_space(caller, access)
    async with app.db.read() as conn:
        row = await domain.find(conn, access.pk, lesson)
        return json_response(await _shown(conn, access, row))


@blueprint.get("/v1/spaces/<space>/lessons/<lesson>/revisions")
@api(
    "Every revision of a lesson, newest first (viewers)",
    response=LessonRevisionPage,
    scopes=ATTEMPT_SCOPE,
    role="viewer",
    action="lessons.read",
    tags=TAGS,
)
async def list_revisions(lesson: str, caller: Caller, access: SpaceAccess) -> Response:
    """Each with its author and the reason it was corrected."""
    app = current_buildmax()
    await _own_space(caller, access)
    page = page_request((int,))
    async with app.db.read() as conn:
        row = await domain.find(conn, access.pk, lesson)
        query = (
            sa.select(revisions)
            .where(revisions.c.lesson_id == row["id"])
            .order_by(revisions.c.number.desc())
            .limit(page.limit + 1)
        )
        if page.after is not None:
            query = query.where(revisions.c.number < page.after[0])
        found = [dict(r) for r in await conn.fetch_all(query)]
    items = [_revision_view(r) for r in found]
    return json_response(page_body(items, found, page.limit, lambda r: (r["number"],)))


def _revision_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "number": row["number"],
        "kind": row["kind"],
        "title": row["title"],
        "text": row["text"],
        "applies_to": json.loads(row["applies_to"]),
        "sources": json.loads(row["sources"]),
        "author_id": row["author_id"],
        "author_kind": row["author_kind"],
        "reason": row["reason"],
        "created_at": to_rfc3339(row["created_at"]),
    }


@blueprint.post("/v1/spaces/<space>/lessons/<lesson>/revisions")
@api(
    "Correct a lesson: a new revision, made against the current one (members)",
    body=LessonCorrection,
    response=LessonOut,
    status=201,
    scopes=ATTEMPT_SCOPE,
    idempotent=True,
    role="member",
    action="lessons.write",
    tags=TAGS,
)
async def correct_lesson(
    lesson: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]
) -> Work:
    """Name the current ``revision`` (409 ``lesson-changed`` when another
    correction came first) and the ``reason``; give only what changes. The
    votes start afresh on the new revision. A superseded lesson is not
    corrected (409 ``lesson-superseded``): correct its replacement."""
    app = current_buildmax()
    await _own_space(caller, access)
    await _check_artifacts(caller, access, data)

    async def work(tx: Transaction) -> Reply:
        if "sources" in data:
            await domain.check_sources(app, tx, access.public_id, data["sources"])
        row = await domain.correct(
            app,
            tx,
            caller.actor,
            (access.pk, access.public_id),
            lesson,
            data,
            admin_override=access.admin_override,
        )
        return Reply(201, await _shown(tx, access, row))

    return work


@blueprint.post("/v1/spaces/<space>/lessons/<lesson>/supersede")
@api(
    "Mark a lesson superseded by another (members)",
    body=LessonSupersession,
    response=LessonOut,
    scopes=ATTEMPT_SCOPE,
    idempotent=True,
    role="member",
    action="lessons.write",
    tags=TAGS,
)
async def supersede_lesson(
    lesson: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]
) -> Work:
    """``by`` is the replacement, a live lesson of this space. The
    superseded lesson leaves default lists and searches and claims' offers;
    its id still shows it, with ``superseded_by``."""
    app = current_buildmax()
    await _own_space(caller, access)

    async def work(tx: Transaction) -> Reply:
        row = await domain.supersede(
            app,
            tx,
            caller.actor,
            (access.pk, access.public_id),
            lesson,
            data["by"],
            data["reason"],
            admin_override=access.admin_override,
        )
        return Reply(200, await _shown(tx, access, row))

    return work


@blueprint.post("/v1/spaces/<space>/lessons/<lesson>/votes")
@api(
    "Vote on a lesson's usefulness: helpful, not_helpful or wrong (members)",
    body=LessonVoteIn,
    response=LessonOut,
    scopes=ATTEMPT_SCOPE,
    idempotent=True,
    role="member",
    action="lessons.vote",
    tags=TAGS,
)
async def vote_lesson(
    lesson: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]
) -> Work:
    """One vote per principal on each revision: voting again replaces it.
    The vote is on the current revision (naming another is 409
    ``lesson-changed``)."""
    app = current_buildmax()
    await _own_space(caller, access)

    async def work(tx: Transaction) -> Reply:
        row = await domain.vote(
            app,
            tx,
            caller.actor,
            (access.pk, access.public_id),
            lesson,
            data,
            admin_override=access.admin_override,
        )
        return Reply(200, await _shown(tx, access, row))

    return work


@blueprint.get("/v1/spaces/<space>/lessons/<lesson>/votes")
@api(
    "The usefulness votes on a lesson, newest revision first, with who cast them (viewers)",
    response=LessonVotePage,
    scopes=ATTEMPT_SCOPE,
    role="viewer",
    action="lessons.read",
    tags=TAGS,
)
async def list_votes(lesson: str, caller: Caller, access: SpaceAccess) -> Response:
    """Votes on every revision (each names its revision)."""
    app = current_buildmax()
    await _own_space(caller, access)
    page = page_request((int, str))
    async with app.db.read() as conn:
        row = await domain.find(conn, access.pk, lesson)
        query = (
            sa.select(votes)
            .where(votes.c.lesson_id == row["id"])
            .order_by(votes.c.revision.desc(), votes.c.principal_id)
            .limit(page.limit + 1)
        )
        if page.after is not None:
            revision, principal = page.after
            query = query.where(
                sa.or_(
                    votes.c.revision < revision,
                    sa.and_(votes.c.revision == revision, votes.c.principal_id > principal),
                )
            )
        found = [dict(r) for r in await conn.fetch_all(query)]
    items = [
        {
            "principal_id": r["principal_id"],
            "revision": r["revision"],
            "vote": r["vote"],
            "note": r["note"],
            "created_at": to_rfc3339(r["created_at"]),
            "updated_at": to_rfc3339(r["updated_at"]),
        }
        for r in found
    ]
    return json_response(
        page_body(items, found, page.limit, lambda r: (r["revision"], r["principal_id"]))
    )
