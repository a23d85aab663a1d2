"""Task and attempt state transitions shared by every operation.

These functions are the only code that changes ``task_tasks.state`` and
``task_attempts.state``; each runs inside the caller's :class:`Change`.
The stage engine (a task waiting in a stage) and the dependency graph (a
task that gains an unfinished prerequisite) change it through
:func:`set_task`.
A row's first state is written where the row is inserted: a task's in
:func:`buildmax_tasks.tasks.create_task` (``ready`` or ``open``) and in the
stage engine (linked work, ``ready``), an attempt's by the claim that
inserts it (``active``, after :func:`mark_claimed`).
"""

from __future__ import annotations

import functools
from typing import Any

import sqlalchemy as sa

from buildmax.tokens import end_scope

from .change import Change
from .diagnostics import LEASES_RECOVERED
from .holds import literal
from .records import ATTEMPT_SELECT
from .rows import AttemptRow, TaskRow
from .tables import attempts, dependencies, reservations, tasks

#: States in which a task is finished for good (until an explicit retry).
TERMINAL = ("done", "canceled", "failed")
#: Linked work that is still due.
UNFINISHED = ("open", "ready", "claimed")


async def prerequisites_done(ch: Change, task_pk: int) -> bool:
    """True when every prerequisite of the task is done."""
    prereq = tasks.alias("prereq")
    undone = await ch.tx.fetch_val(
        sa.select(sa.func.count())
        .select_from(dependencies.join(prereq, prereq.c.id == dependencies.c.prerequisite_id))
        .where(dependencies.c.task_id == task_pk, prereq.c.state != "done")
    )
    return int(undone or 0) == 0


@functools.cache
def _task_update(columns: frozenset[str]) -> Any:
    """``UPDATE task_tasks SET <columns>`` built once per set of columns."""
    return (
        sa.update(tasks)
        .where(tasks.c.id == sa.bindparam("task_pk"))
        .values({name: sa.bindparam(f"new_{name}") for name in columns})
    )


async def set_task(ch: Change, task_pk: int, **values: Any) -> None:
    """Write task columns and its ``updated_at``."""
    values["updated_at"] = ch.now
    params = {f"new_{name}": value for name, value in values.items()}
    params["task_pk"] = task_pk
    await ch.tx.execute(_task_update(frozenset(values)), params)


_MARK_CLAIMED = (
    sa.update(tasks)
    .where(tasks.c.id == sa.bindparam("pk"), tasks.c.state == literal("ready"))
    .values(state="claimed", generation=tasks.c.generation + 1, updated_at=sa.bindparam("now"))
    .returning(tasks.c.generation)
)


async def mark_claimed(ch: Change, task_pk: int) -> int | None:
    """``ready`` to ``claimed`` with the next generation, which it returns;
    ``None`` when the task is not ready (the guard against two owners: only
    one claim finds it ready, whoever else tries)."""
    generation = await ch.tx.fetch_val(_MARK_CLAIMED, {"pk": task_pk, "now": ch.now})
    return None if generation is None else int(generation)


async def reopen(ch: Change, task: TaskRow, **values: Any) -> str:
    """Make a task claimable again: ``ready``, or ``open`` while a
    prerequisite is not done. Returns the new state."""
    state = "ready" if await prerequisites_done(ch, task.pk) else "open"
    await set_task(ch, task.pk, state=state, ready_at=ch.now, **values)
    await ch.event("task.state", task_id=task.id, state=state)
    return state


_DEPENDENT_IDS = sa.select(dependencies.c.task_id).where(
    dependencies.c.prerequisite_id == sa.bindparam("task_pk")
)
_OPEN_DEPENDENTS = (
    sa.select(tasks.c.id)
    .where(tasks.c.id.in_(_DEPENDENT_IDS), tasks.c.state == "open")
    .order_by(tasks.c.id)
    .with_for_update()
)
_prereq = tasks.alias("prereq")
_edge = dependencies.alias("edge")
_RELEASE_DEPENDENTS = (
    sa.update(tasks)
    .where(
        tasks.c.id.in_(_DEPENDENT_IDS),
        tasks.c.state == "open",
        ~sa.exists(
            sa.select(_edge.c.prerequisite_id)
            .select_from(_edge.join(_prereq, _prereq.c.id == _edge.c.prerequisite_id))
            .where(_edge.c.task_id == tasks.c.id, _prereq.c.state != "done")
        ),
    )
    .values(state="ready", ready_at=sa.bindparam("now"), updated_at=sa.bindparam("now"))
    .returning(tasks.c.public_id.label("id"))
)


async def release_dependents(ch: Change, task_pk: int) -> list[str]:
    """After ``task_pk`` is done: every ``open`` dependent whose prerequisites
    are now all done becomes ``ready``. Returns their public ids.

    The dependents' rows are locked first, so two prerequisites finishing at
    once on PostgreSQL cannot each miss the other (the second waits, then
    its check sees the first committed)."""
    waiting = await ch.tx.fetch_all(_OPEN_DEPENDENTS, {"task_pk": task_pk})
    if not waiting:
        return []
    rows = await ch.tx.fetch_all(_RELEASE_DEPENDENTS, {"task_pk": task_pk, "now": ch.now})
    ready = sorted(r["id"] for r in rows)
    for public_id in ready:
        await ch.event("task.state", task_id=public_id, state="ready")
    return ready


def leave_stage(task: TaskRow) -> dict[str, Any]:
    """A finished task leaves the stage it waited in; linked stage work keeps
    the stage it belongs to (it is part of the work item's identity)."""
    return {} if task.subject_task_pk is not None else {"stage": None}


async def complete(ch: Change, task: TaskRow, **values: Any) -> list[str]:
    """Mark a task done (writing ``values`` too) and release its dependents;
    their public ids."""
    await set_task(ch, task.pk, state="done", outcome_reason=None, **leave_stage(task), **values)
    await ch.audit("task.done", "task", task.id)
    await ch.event("task.state", task_id=task.id, state="done")
    return await release_dependents(ch, task.pk)


async def finish(ch: Change, task: TaskRow, state: str, reason: str) -> None:
    """End a task as ``failed`` or ``canceled`` (with its unfinished linked work)."""
    await set_task(ch, task.pk, state=state, outcome_reason=reason, **leave_stage(task))
    await ch.audit(f"task.{state}", "task", task.id, reason=reason)
    await ch.event("task.state", task_id=task.id, state=state)
    if task.current_submission_pk is not None:
        await cancel_linked_work(ch, task.current_submission_pk, reason)


_END_ATTEMPT = (
    sa.update(attempts)
    .where(attempts.c.id == sa.bindparam("attempt_pk"), attempts.c.state == "active")
    .values(
        state=sa.bindparam("new_state"),
        ended_at=sa.bindparam("now"),
        end_reason=sa.bindparam("reason"),
        charged=sa.bindparam("charged"),
    )
    .returning(attempts.c.id)
)
#: Expires an attempt only if its lease still lapsed when the row is written
#: (a renewal that committed meanwhile wins).
_EXPIRE_ATTEMPT = _END_ATTEMPT.where(attempts.c.lease_expires_at <= sa.bindparam("now"))
#: Ends every reservation of an attempt.
UNRESERVE = sa.delete(reservations).where(
    reservations.c.attempt_public_id == sa.bindparam("attempt_public_id")
)


async def end_attempt(
    ch: Change,
    attempt: AttemptRow,
    state: str,
    reason: str | None,
    *,
    charge: bool,
    only_if_lapsed: bool = False,
) -> bool:
    """End an active attempt: its state, its reservations, its scoped tokens.
    ``only_if_lapsed`` ends it only while its lease is still lapsed.

    Returns ``False`` (and changes nothing) when it was no longer active."""
    ended = await ch.tx.fetch_val(
        _EXPIRE_ATTEMPT if only_if_lapsed else _END_ATTEMPT,
        {
            "attempt_pk": attempt.pk,
            "new_state": state,
            "now": ch.now,
            "reason": reason,
            "charged": int(charge),
        },
    )
    if ended is None:
        return False
    await ch.tx.execute(UNRESERVE, {"attempt_public_id": attempt.id})
    await end_scope(ch.tx, "attempt", attempt.id, now=ch.now)
    return True


async def after_attempt(ch: Change, task: TaskRow, *, charged: bool) -> str:
    """The task of an attempt that ended without a submission: back to the
    queue, or ``failed`` once a charged attempt spends its budget."""
    used = task.attempts_used + (1 if charged else 0)
    if charged and used >= task.max_attempts:
        await set_task(ch, task.pk, attempts_used=used)
        await finish(ch, task, "failed", f"all {task.max_attempts} attempts were spent")
        return "failed"
    return await reopen(ch, task, attempts_used=used)


async def retire_lapsed(ch: Change, attempt: AttemptRow, task: TaskRow) -> str:
    """Expire an attempt whose lease lapsed, and put its task back.

    The lapse is charged against ``max_attempts`` unless a stopped hold
    refused the attempt's renewal. Returns the task's new state."""
    charge = attempt.hold_refused_at is None
    if not await end_attempt(
        ch, attempt, "expired", "the lease lapsed", charge=charge, only_if_lapsed=True
    ):
        return task.state
    LEASES_RECOVERED.after_commit(ch.app, ch.tx)
    await ch.audit(
        "attempt.expired",
        "attempt",
        attempt.id,
        task_id=task.id,
        generation=attempt.generation,
        charged=charge,
    )
    await ch.event("attempt.expired", attempt_id=attempt.id, task_id=task.id)
    if task.state == "claimed" and task.current_attempt_pk == attempt.pk:
        return await after_attempt(ch, task, charged=charge)
    return task.state


async def cancel_linked_work(ch: Change, submission_pk: int, reason: str) -> list[str]:
    """Cancel the unfinished stage work of a submission (and end its active
    attempts); the public ids of the canceled tasks."""
    rows = await ch.tx.fetch_all(
        sa.select(tasks.c.id.label("pk"), tasks.c.public_id.label("id"))
        .where(tasks.c.subject_submission_id == submission_pk, tasks.c.state.in_(UNFINISHED))
        .order_by(tasks.c.id)
        .with_for_update()
    )
    for row in rows:
        active = await ch.tx.fetch_all(
            ATTEMPT_SELECT.where(attempts.c.task_id == row["pk"], attempts.c.state == "active")
        )
        for attempt in map(AttemptRow.of, active):
            await end_attempt(ch, attempt, "canceled", reason, charge=False)
            await ch.audit(
                "attempt.canceled",
                "attempt",
                attempt.id,
                task_id=attempt.task_id,
                generation=attempt.generation,
                reason=reason,
            )
            await ch.event("attempt.canceled", attempt_id=attempt.id, task_id=attempt.task_id)
        await set_task(ch, row["pk"], state="canceled", outcome_reason=reason)
        await ch.audit("task.canceled", "task", row["id"], reason=reason)
        await ch.event("task.state", task_id=row["id"], state="canceled")
    return [r["id"] for r in rows]
