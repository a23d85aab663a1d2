"""Human decisions: a question on a task that parks it until answered.

Opened by a member or by a stage plugin through ``TaskQueue``; answered by
whoever ``answerable_by`` allows (``human``: human members only, so an
agent can never answer for a person).
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from buildmax_hookspecs import Actor

from buildmax.ids import new_id
from buildmax.problems import Forbidden, NotFound, ValidationFailed

from .change import Change
from .problems import InvalidState
from .records import DECISION_SELECT
from .rows import DecisionRow, TaskRow
from .tables import decisions


async def open_decision(
    ch: Change,
    task: TaskRow,
    *,
    question: str,
    options: list[str],
    answerable_by: str,
    expires_at: int | None,
    opened_by: int | None,
) -> str:
    """Open a decision on ``task``; its public id."""
    if answerable_by not in ("human", "member"):
        raise ValueError("answerable_by is 'human' or 'member'")
    if not options or len(set(options)) != len(options):
        raise ValueError("a decision needs distinct options")
    public_id = new_id("dc")
    await ch.tx.execute(
        decisions.insert().values(
            public_id=public_id,
            space_id=ch.space_pk,
            task_id=task.pk,
            question=question,
            options=json.dumps(options),
            answerable_by=answerable_by,
            state="pending",
            opened_by=opened_by,
            created_at=ch.now,
            expires_at=expires_at,
        )
    )
    await ch.audit(
        "decision.opened",
        "decision",
        public_id,
        task_id=task.id,
        answerable_by=answerable_by,
        option_count=len(options),
    )
    await ch.event("decision.opened", decision_id=public_id, task_id=task.id)
    return public_id


#: A decision of the space, locked.
_TO_ANSWER = DECISION_SELECT.where(
    decisions.c.public_id == sa.bindparam("public_id"),
    decisions.c.space_id == sa.bindparam("space_pk"),
).with_for_update(of=decisions)


async def answer_decision(
    ch: Change,
    decision_id: str,
    answerer_pk: int,
    answerer: Actor,
    answer: str,
    comment: str | None,
) -> None:
    """Answer the pending decision ``decision_id`` with one of its options:
    404 when the space has none such, 403 when it needs a human and
    ``answerer`` is not one, 409 once answered or expired, 422 for an
    answer that is not an option."""
    found = await ch.tx.fetch_one(_TO_ANSWER, {"public_id": decision_id, "space_pk": ch.space_pk})
    if found is None:
        raise NotFound("no such decision in this space")
    row = DecisionRow.of(found)
    if row.answerable_by == "human" and answerer.kind != "human":
        raise Forbidden("this decision needs a human's answer")
    if row.state != "pending":
        raise InvalidState(f"the decision is already {row.state}")
    if row.expires_at is not None and row.expires_at <= ch.now:
        raise InvalidState("the decision has expired")
    if answer not in json.loads(row.options):
        raise ValidationFailed(
            "the answer must be one of the options", errors={"answer": ["Not an option."]}
        )
    await ch.tx.execute(
        sa.update(decisions)
        .where(decisions.c.id == row.pk)
        .values(
            state="answered",
            answer=answer,
            comment=comment,
            answered_by=answerer_pk,
            answered_at=ch.now,
        )
    )
    await ch.audit("decision.answered", "decision", decision_id, task_id=row.task_id, answer=answer)
    await ch.event("decision.answered", decision_id=decision_id, task_id=row.task_id, answer=answer)
