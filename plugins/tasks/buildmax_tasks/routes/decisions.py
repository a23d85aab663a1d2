"""Decisions: open, list, answer."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Transaction
from quart import Blueprint, Response

from buildmax.access import SpaceAccess
from buildmax.apidoc import api, query_args
from buildmax.auth import Caller
from buildmax.bodies import json_response
from buildmax.current import current_buildmax
from buildmax.idempotency import Reply, Work
from buildmax.pagination import older_than, page_body, page_request
from buildmax.problems import ValidationFailed

from ..change import change
from ..decisions import answer_decision, open_decision
from ..lifecycle import TERMINAL
from ..problems import InvalidState
from ..records import DECISION_SELECT, task_or_404
from ..rows import DecisionRow
from ..schemas import (
    DecisionAnswer,
    DecisionCreate,
    DecisionListQuery,
    DecisionOut,
    DecisionPage,
)
from ..tables import decisions

blueprint = Blueprint("tasks_decisions", __name__)
DECISION_OUT = DecisionOut()


def _render(row: DecisionRow, now: int) -> dict[str, Any]:
    state = row.state
    if state == "pending" and row.expires_at is not None and row.expires_at <= now:
        state = "expired"
    return DECISION_OUT.dump(  # type: ignore[no-any-return]
        {
            "id": row.id,
            "task_id": row.task_id,
            "question": row.question,
            "options": json.loads(row.options),
            "answerable_by": row.answerable_by,
            "state": state,
            "answer": row.answer,
            "comment": row.comment,
            "opened_by": row.opened_by_id,
            "answered_by": row.answered_by_id,
            "created_at": row.created_at,
            "expires_at": row.expires_at,
            "answered_at": row.answered_at,
        }
    )


@blueprint.post("/v1/spaces/<space>/tasks/<task>/decisions")
@api(
    "Ask a decision about a task (members); it parks the task until answered",
    body=DecisionCreate,
    response=DecisionOut,
    status=201,
    idempotent=True,
    role="member",
    action="tasks.decision.open",
    tags=["decisions"],
)
async def create(task: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """``answerable_by``: ``human`` (default; human members only) or ``member``."""
    app = current_buildmax()
    if len(set(data["options"])) != len(data["options"]):
        raise ValidationFailed("options must be distinct", errors={"options": ["Duplicates."]})

    async def work(tx: Transaction) -> Reply:
        ch = change(app, tx, caller, access)
        row = await task_or_404(tx, access.pk, task, for_update=True)
        if row.state in TERMINAL:
            raise InvalidState(f"the task is {row.state}")
        expires = data["expires_in_seconds"]
        public_id = await open_decision(
            ch,
            row,
            question=data["question"],
            options=data["options"],
            answerable_by=data["answerable_by"],
            expires_at=ch.now + expires * 1000 if expires else None,
            opened_by=caller.principal_pk,
        )
        made = await tx.fetch_one(DECISION_SELECT.where(decisions.c.public_id == public_id))
        assert made is not None
        return Reply(201, _render(DecisionRow.of(made), ch.now))

    return work


@blueprint.get("/v1/spaces/<space>/decisions")
@api(
    "List decisions, pending ones unless state=all|answered (viewers)",
    response=DecisionPage,
    query=DecisionListQuery,
    role="viewer",
    action="tasks.read",
    tags=["decisions"],
)
async def list_decisions(access: SpaceAccess) -> Response:
    """Newest first; ``task`` filters by task."""
    app = current_buildmax()
    page = page_request()
    now = app.clock.now_ms()
    query = (
        DECISION_SELECT.where(decisions.c.space_id == access.pk)
        .order_by(decisions.c.id.desc())
        .limit(page.limit + 1)
    )
    filters = query_args()
    state = filters["state"]
    if state == "pending":
        query = query.where(
            decisions.c.state == "pending",
            sa.or_(decisions.c.expires_at.is_(None), decisions.c.expires_at > now),
        )
    elif state == "answered":
        query = query.where(decisions.c.state == "answered")
    if page.after is not None:
        query = query.where(older_than(decisions, page.after[0]))
    async with app.db.read() as conn:
        task = filters.get("task")
        if task is not None:
            query = query.where(
                decisions.c.task_id == (await task_or_404(conn, access.pk, task)).pk
            )
        rows = [DecisionRow.of(r) for r in await conn.fetch_all(query)]
    items = [_render(r, now) for r in rows]
    return json_response(page_body(items, rows, page.limit, lambda r: (r.id,)))


@blueprint.post("/v1/spaces/<space>/decisions/<decision>/answer")
@api(
    "Answer a decision (a human member, or any member when allowed)",
    body=DecisionAnswer,
    response=DecisionOut,
    idempotent=True,
    role="member",
    action="tasks.decision.answer",
    tags=["decisions"],
)
async def answer(decision: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """The answer must be one of the options; the task is claimable again
    once no other decision or hold parks it."""
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        ch = change(app, tx, caller, access)
        await answer_decision(
            ch, decision, caller.principal_pk, caller.actor, data["answer"], data["comment"]
        )
        made = await tx.fetch_one(DECISION_SELECT.where(decisions.c.public_id == decision))
        assert made is not None
        return Reply(200, _render(DecisionRow.of(made), ch.now))

    return work
