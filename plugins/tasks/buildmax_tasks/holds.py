"""Holds and parking: what keeps ready work from being claimed.

A hold covers a space, a project or a task. ``suspended`` refuses new
claims and lets active attempts finish; ``stopped`` also refuses renewals
(submit is still accepted, so finished work is not lost). A pending
decision parks its task. Neither is a stored task state: the ready queue
excludes held scopes and parked tasks by query, so placing or lifting a
hold rewrites no task row.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Transaction

from buildmax.ids import new_id
from buildmax.problems import NotFound, ValidationFailed

from .change import Change
from .problems import InvalidState
from .records import DECISION_SELECT, HOLD_SELECT, find_project, task_or_404
from .rows import DecisionRow, HoldRow, TaskRow
from .tables import decisions, holds, projects, tasks


def literal(value: str) -> Any:
    """A constant SQL string (so a partial index's predicate matches)."""
    return sa.literal_column(f"'{value}'")


def _live_holds_of(scope_type: str) -> Any:
    return sa.select(holds.c.scope_pk).where(
        holds.c.space_id == sa.bindparam("space_pk", type_=sa.BigInteger),
        holds.c.scope_type == literal(scope_type),
        holds.c.lifted_at.is_(None),
    )


#: Conditions that keep held and parked tasks out of the ready queue; they
#: take the ``space_pk`` and ``now`` bindparams.
CLAIMABLE = [
    ~sa.exists(
        sa.select(holds.c.id).where(
            holds.c.space_id == sa.bindparam("space_pk", type_=sa.BigInteger),
            holds.c.scope_type == literal("space"),
            holds.c.lifted_at.is_(None),
        )
    ),
    tasks.c.project_id.not_in(_live_holds_of("project")),
    tasks.c.id.not_in(_live_holds_of("task")),
    tasks.c.id.not_in(
        sa.select(decisions.c.task_id).where(
            decisions.c.space_id == sa.bindparam("space_pk", type_=sa.BigInteger),
            decisions.c.state == literal("pending"),
            sa.or_(
                decisions.c.expires_at.is_(None),
                decisions.c.expires_at > sa.bindparam("now", type_=sa.BigInteger),
            ),
        )
    ),
]


_COVERING = HOLD_SELECT.where(
    holds.c.space_id == sa.bindparam("space_pk", type_=sa.BigInteger),
    holds.c.lifted_at.is_(None),
    sa.or_(
        holds.c.scope_type == literal("space"),
        sa.and_(
            holds.c.scope_type == literal("project"),
            holds.c.scope_pk == sa.bindparam("project_pk"),
        ),
        sa.and_(holds.c.scope_type == literal("task"), holds.c.scope_pk == sa.bindparam("task_pk")),
    ),
).order_by(holds.c.strength.desc(), holds.c.id)

_PENDING = DECISION_SELECT.where(
    decisions.c.task_id == sa.bindparam("task_pk"),
    decisions.c.state == literal("pending"),
    sa.or_(
        decisions.c.expires_at.is_(None),
        decisions.c.expires_at > sa.bindparam("now", type_=sa.BigInteger),
    ),
).order_by(decisions.c.id)


async def holds_covering(conn: Transaction, task: TaskRow) -> list[HoldRow]:
    """The live holds covering a task (space, its project, itself): by strength
    name, ``suspended`` before ``stopped``, then oldest first."""
    rows = await conn.fetch_all(
        _COVERING,
        {"space_pk": task.space_pk, "project_pk": task.project_pk, "task_pk": task.pk},
    )
    return [HoldRow.of(r) for r in rows]


async def pending_decisions(conn: Transaction, task_pk: int, now: int) -> list[DecisionRow]:
    """A task's pending, unexpired decisions."""
    rows = await conn.fetch_all(_PENDING, {"task_pk": task_pk, "now": now})
    return [DecisionRow.of(r) for r in rows]


async def scope_public_id(conn: Transaction, scope_type: str, scope_pk: int | None) -> str | None:
    """The public id of a hold's scope (``None`` for a space hold)."""
    if scope_type == "project":
        return await conn.fetch_val(  # type: ignore[no-any-return]
            sa.select(projects.c.public_id).where(projects.c.id == scope_pk)
        )
    if scope_type == "task":
        return await conn.fetch_val(  # type: ignore[no-any-return]
            sa.select(tasks.c.public_id).where(tasks.c.id == scope_pk)
        )
    return None


async def describe_hold(conn: Transaction, hold: HoldRow) -> dict[str, Any]:
    """A hold as problems and task views show it."""
    return {
        "id": hold.id,
        "scope": {
            "type": hold.scope_type,
            "id": await scope_public_id(conn, hold.scope_type, hold.scope_pk),
        },
        "strength": hold.strength,
        "reason": hold.reason,
    }


async def place_hold(
    ch: Change, creator_pk: int, scope: str, target: str | None, strength: str, reason: str
) -> str:
    """A hold of ``strength`` on the space, or on the project or task
    ``target`` names (422 for a target the scope does not take); its public
    id."""
    scope_pk = None
    target_id = ch.space_id
    if scope == "space":
        if target is not None:
            raise ValidationFailed(
                "a space hold names no target", errors={"target": ["Omit for a space hold."]}
            )
    elif target is None:
        raise ValidationFailed(f"a {scope} hold needs a target", errors={"target": ["Required."]})
    elif scope == "project":
        project = await find_project(ch.tx, ch.space_pk, target)
        scope_pk, target_id = project.pk, project.id
    else:
        task = await task_or_404(ch.tx, ch.space_pk, target)
        scope_pk, target_id = task.pk, task.id
    public_id = new_id("hd")
    await ch.tx.execute(
        holds.insert().values(
            public_id=public_id,
            space_id=ch.space_pk,
            scope_type=scope,
            scope_pk=scope_pk,
            strength=strength,
            reason=reason,
            created_by=creator_pk,
            created_at=ch.now,
        )
    )
    await ch.audit(
        "hold.created",
        "hold",
        public_id,
        scope_type=scope,
        scope_id=target_id,
        strength=strength,
        reason=reason,
    )
    await ch.event(
        "hold.created", hold_id=public_id, scope_type=scope, scope_id=target_id, strength=strength
    )
    return public_id


async def lift_hold(ch: Change, lifter_pk: int, hold_id: str) -> None:
    """Lift the live hold ``hold_id``: 404 when the space has no such hold,
    409 when it was lifted already."""
    lifted = await ch.tx.fetch_val(
        sa.update(holds)
        .where(
            holds.c.public_id == hold_id,
            holds.c.space_id == ch.space_pk,
            holds.c.lifted_at.is_(None),
        )
        .values(lifted_at=ch.now, lifted_by=lifter_pk)
        .returning(holds.c.id)
    )
    if lifted is None:
        exists = await ch.tx.fetch_val(
            sa.select(holds.c.id).where(
                holds.c.public_id == hold_id, holds.c.space_id == ch.space_pk
            )
        )
        if exists is None:
            raise NotFound("no such hold in this space")
        raise InvalidState("the hold was already lifted")
    await ch.audit("hold.lifted", "hold", hold_id)
    await ch.event("hold.lifted", hold_id=hold_id)
