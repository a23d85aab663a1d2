"""Operations on an active attempt, each fenced by its generation.

Renew, checkpoint, release, fail, submit and cancel load the attempt under
a row lock and refuse, changing nothing, when the caller is not its owner,
the generation is not the attempt's, the attempt has ended or its lease has
lapsed. Only the owner acts on an active attempt; a space admin or owner
may override with a reason, and the audit trail says so.
"""

from __future__ import annotations

import json
from dataclasses import replace
from types import MappingProxyType
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import SubmissionRef, Transaction, Verdict

from buildmax.clock import to_rfc3339
from buildmax.ids import new_id
from buildmax.problems import NotFound, ValidationFailed
from buildmax.tables import keyed_insert

from .authority import Authority
from .change import Change
from .engine import StageEngine
from .holds import describe_hold, holds_covering
from .lifecycle import after_attempt, end_attempt, finish
from .problems import (
    AttemptEnded,
    LeaseLapsed,
    NotAttemptOwner,
    StaleGeneration,
    SubmissionRefused,
    TaskHeld,
)
from .records import ATTEMPT_SELECT, attempt_ref, load_attempt, load_task_by_pk, task_ref
from .rows import AttemptRow, SubmissionRow, TaskRow
from .tables import attempts, checkpoints, submission_artifacts, submissions, tasks


async def fenced(
    ch: Change,
    attempt_id: str,
    generation: int,
    authority: Authority,
    *,
    allow_lapsed: bool = False,
) -> tuple[AttemptRow, TaskRow]:
    """The attempt and its task, locked, if the caller may act on it now.

    Sets ``ch.admin_override`` when an admin or owner acts on someone
    else's attempt."""
    attempt, task = await locked(ch, attempt_id)
    if authority.scope_id is not None and authority.scope_id != attempt_id:
        raise NotAttemptOwner("this token is scoped to another attempt")
    if attempt.claimant_pk != authority.principal_pk:
        if authority.scope_id is not None or not authority.may_override:
            raise NotAttemptOwner(
                "only the attempt's owner acts on it (a space admin or owner may override "
                "with override_reason)"
            )
        if not authority.override_reason:
            raise ValidationFailed(
                "acting on another principal's attempt needs override_reason",
                errors={"override_reason": ["Required to override the attempt's owner."]},
            )
        ch.override(authority.override_reason)
    if generation != attempt.generation:
        raise StaleGeneration(
            f"generation {generation} is not this attempt's ({attempt.generation})",
            generation=attempt.generation,
        )
    if attempt.state != "active":
        raise AttemptEnded(f"the attempt is {attempt.state}", state=attempt.state)
    if attempt.lease_expires_at <= ch.now and not allow_lapsed:
        raise LeaseLapsed(
            f"the lease lapsed at {to_rfc3339(attempt.lease_expires_at)}",
            lease_expires_at=to_rfc3339(attempt.lease_expires_at),
        )
    return attempt, task


async def locked(ch: Change, attempt_id: str) -> tuple[AttemptRow, TaskRow]:
    """The attempt of ``ch``'s space and its task, their rows locked until
    the transaction ends, as committed once the locks are held; 404 when
    there is no such attempt in the space."""
    attempt = await load_attempt(ch.tx, attempt_id, space_pk=ch.space_pk)
    if attempt is None:
        raise NotFound("no such attempt in this space")
    # Rows are locked in one order everywhere: subject task, task, attempt.
    # The task row's lock serialises every change to its attempts.
    if attempt.subject_task_pk is not None:
        await ch.tx.fetch_all(
            sa.select(tasks.c.id).where(tasks.c.id == attempt.subject_task_pk).with_for_update()
        )
    task = await load_task_by_pk(ch.tx, attempt.task_pk, for_update=True)
    assert task is not None
    if ch.tx.dialect == "postgresql" and _maybe_stale(attempt, task, ch.now):
        # Changed while we waited for the lock: read what committed.
        attempt = await load_attempt(ch.tx, attempt_id, space_pk=ch.space_pk)
        assert attempt is not None
    return attempt, task


def _maybe_stale(attempt: AttemptRow, task: TaskRow, now: int) -> bool:
    """Whether an attempt read before its task's lock was taken may be out of
    date. Every change that ends an attempt also changes its task's state or
    current attempt, so an attempt still current on the locked task row is
    still active; only a renewal (a later lease) could have been missed."""
    if attempt.state != "active":
        return False  # ended attempts never change again
    current = task.state == "claimed" and task.current_attempt_pk == attempt.pk
    return not current or attempt.lease_expires_at <= now


async def stopped_hold(ch: Change, task: TaskRow) -> dict[str, Any] | None:
    """The stopped hold covering a task, described, or ``None``."""
    for hold in await holds_covering(ch.tx, task):
        if hold.strength == "stopped":
            return await describe_hold(ch.tx, hold)
    return None


def hold_refusal(hold: dict[str, Any], what: str) -> TaskHeld:
    """The problem for an action a stopped hold refuses."""
    return TaskHeld(
        f"a stopped hold on the {hold['scope']['type']} refuses {what}: {hold['reason']}",
        hold=hold,
    )


_RENEW = (
    sa.update(attempts)
    .where(attempts.c.id == sa.bindparam("attempt_pk"))
    # A renewal that succeeds ends any hold's excuse: a later lapse is charged.
    .values(
        lease_expires_at=sa.bindparam("expires"),
        renewed_at=sa.bindparam("now"),
        hold_refused_at=None,
    )
)
_RENEW_WITH_PROGRESS = _RENEW.values(progress=sa.bindparam("new_progress"))


async def renew(
    ch: Change, attempt: AttemptRow, task: TaskRow, lease_ms: int, progress: Any
) -> AttemptRow:
    """Extend the lease from now; keep the latest progress report."""
    hold = await stopped_hold(ch, task)
    if hold is not None:
        raise hold_refusal(hold, "renewals")
    expires = ch.now + lease_ms
    reported = None if progress is None else json.dumps(progress, separators=(",", ":"))
    await ch.tx.execute(
        _RENEW if reported is None else _RENEW_WITH_PROGRESS,
        {
            "attempt_pk": attempt.pk,
            "new_progress": reported,
            "expires": expires,
            "now": ch.now,
        },
    )
    await ch.audit(
        "attempt.renewed",
        "attempt",
        attempt.id,
        generation=attempt.generation,
        lease_expires_at=to_rfc3339(expires),
    )
    await ch.event(
        "attempt.renewed",
        attempt_id=attempt.id,
        lease_expires_at=to_rfc3339(expires),
    )
    return replace(
        attempt,
        lease_expires_at=expires,
        renewed_at=ch.now,
        hold_refused_at=None,
        progress=attempt.progress if reported is None else reported,
    )


async def mark_hold_refused(ch: Change, attempt_id: str, generation: int) -> None:
    """Remember that a stopped hold refused this attempt's renewal, so the
    lapse that follows is not charged against the task's attempts."""
    await ch.tx.execute(
        sa.update(attempts)
        .where(
            attempts.c.public_id == attempt_id,
            attempts.c.generation == generation,
            attempts.c.state == "active",
            attempts.c.hold_refused_at.is_(None),
        )
        .values(hold_refused_at=ch.now)
    )


async def checkpoint(ch: Change, attempt: AttemptRow, data: Any) -> dict[str, Any]:
    """Append a checkpoint to the attempt."""
    pk = await ch.tx.fetch_val(
        checkpoints.insert()
        .values(
            attempt_id=attempt.pk,
            data=json.dumps(data, separators=(",", ":")),
            created_at=ch.now,
        )
        .returning(checkpoints.c.id)
    )
    count = await ch.tx.fetch_val(
        sa.select(sa.func.count()).where(checkpoints.c.attempt_id == attempt.pk)
    )
    await ch.audit("attempt.checkpointed", "attempt", attempt.id, generation=attempt.generation)
    await ch.event("attempt.checkpointed", attempt_id=attempt.id, number=count)
    return {"number": int(count), "created_at": ch.now, "pk": pk}


async def checkpoints_of(
    conn: Transaction, attempt_pk: int, limit: int, before: int | None
) -> list[dict[str, Any]]:
    """Up to ``limit`` of an attempt's checkpoints, newest first, each with
    its number (its place among the attempt's, from 1); ``before``: only
    those numbered lower."""
    numbered = (
        sa.select(
            checkpoints.c.data,
            checkpoints.c.created_at,
            sa.func.row_number().over(order_by=checkpoints.c.id).label("number"),
        )
        .where(checkpoints.c.attempt_id == attempt_pk)
        .subquery()
    )
    query = sa.select(numbered).order_by(numbered.c.number.desc()).limit(limit)
    if before is not None:
        query = query.where(numbered.c.number < before)
    return [
        {"number": int(r["number"]), "data": json.loads(r["data"]), "created_at": r["created_at"]}
        for r in await conn.fetch_all(query)
    ]


async def give_up(
    ch: Change,
    attempt: AttemptRow,
    task: TaskRow,
    state: str,
    reason: str | None,
) -> str:
    """End an attempt without a submission (``released``, ``failed`` or
    ``canceled``); only ``failed`` is charged. The task's new state."""
    charged = state == "failed"
    await _end(ch, attempt, task, state, reason, charged=charged)
    if task.state == "claimed" and task.current_attempt_pk == attempt.pk:
        return await after_attempt(ch, task, charged=charged)
    return task.state


_INSERT_SUBMISSION = keyed_insert(submissions)


async def submit(
    ch: Change,
    engine: StageEngine,
    attempt: AttemptRow,
    task: TaskRow,
    body: dict[str, Any],
) -> tuple[SubmissionRow, dict[str, Any]]:
    """Record the submission, end the attempt, and let the stage engine move
    the task on. The submission row and what the engine did.

    Every ``buildmax_submission_check`` is asked first; a refusal is 422
    ``submission-refused`` with nothing written."""
    unknown = engine.unknown_extensions(body["extensions"])
    if unknown:
        raise ValidationFailed(
            "the submission carries data no loaded plugin takes", errors={"extensions": unknown}
        )
    public_id = new_id("sb")
    await _check_submission(ch, attempt, task, public_id, body)
    stored: dict[str, Any] = {
        "id": public_id,
        "task_pk": task.pk,
        "attempt_pk": attempt.pk,
        "generation": attempt.generation,
        "task_revision": task.revision,
        "submitted_by_pk": attempt.claimant_pk,
        "summary": body["summary"],
        "candidate": json.dumps(body["candidate"], separators=(",", ":"), sort_keys=True),
        "evidence": json.dumps(body["evidence"], separators=(",", ":"), sort_keys=True),
        "verdict": None,
        "created_at": ch.now,
    }
    pk = await ch.tx.fetch_val(_INSERT_SUBMISSION, stored)
    artifact_ids = (
        json.dumps(body["artifacts"], separators=(",", ":")) if body["artifacts"] else None
    )
    if artifact_ids is not None:
        await ch.tx.execute(
            submission_artifacts.insert().values(submission_id=pk, artifact_ids=artifact_ids)
        )
    await end_attempt(ch, attempt, "submitted", None, charge=False)
    await ch.audit(
        "attempt.submitted",
        "attempt",
        attempt.id,
        task_id=task.id,
        generation=attempt.generation,
        submission_id=public_id,
    )
    await ch.event(
        "attempt.submitted",
        attempt_id=attempt.id,
        task_id=task.id,
        submission_id=public_id,
    )
    submission = SubmissionRow(
        pk=pk,
        **stored,
        task_id=task.id,
        attempt_id=attempt.id,
        submitted_by_id=attempt.claimant_id,
        artifact_ids=artifact_ids,
        extensions=body["extensions"],
    )
    task = replace(task, current_submission_pk=pk, current_submission_id=public_id, state="claimed")
    outcome = await engine.submitted(
        ch,
        task,
        replace(attempt, state="submitted"),
        submission,
        {"current_submission_id": pk, "finding_ids": "[]"},
    )
    return submission, outcome


async def _check_submission(
    ch: Change,
    attempt: AttemptRow,
    task: TaskRow,
    public_id: str,
    body: dict[str, Any],
) -> None:
    """Ask every ``buildmax_submission_check`` about the submission about to
    be written; :class:`SubmissionRefused` with every refusal's reason."""
    submission = SubmissionRef(
        id=public_id,
        task_id=task.id,
        attempt_id=attempt.id,
        generation=attempt.generation,
        task_revision=task.revision,
        submitted_by=attempt.claimant_id,
        summary=body["summary"],
        candidate=body["candidate"],
        evidence=body["evidence"],
        artifacts=tuple(body["artifacts"]),
        extensions=MappingProxyType(body["extensions"]),
    )
    verdicts = await ch.app.hooks.submission_check(
        ch.tx,
        task=task_ref(task),
        attempt=attempt_ref(attempt),
        submission=submission,
        actor=ch.actor,
    )
    refusals = [
        v.reason or "a submission check refused it"
        for v in verdicts
        if isinstance(v, Verdict) and v.outcome == "deny"
    ]
    if refusals:
        raise SubmissionRefused("; ".join(refusals))


async def cancel_task(ch: Change, task: TaskRow, reason: str) -> None:
    """Cancel a task for good (its active attempt too)."""
    active = await ch.tx.fetch_one(
        ATTEMPT_SELECT.where(attempts.c.task_id == task.pk, attempts.c.state == "active")
    )
    if active is not None:
        await _end(ch, AttemptRow.of(active), task, "canceled", reason, charged=False)
    await finish(ch, task, "canceled", reason)


async def _end(
    ch: Change,
    attempt: AttemptRow,
    task: TaskRow,
    state: str,
    reason: str | None,
    *,
    charged: bool,
) -> None:
    """End an attempt without a submission, audited and announced."""
    await end_attempt(ch, attempt, state, reason, charge=charged)
    await ch.audit(
        f"attempt.{state}",
        "attempt",
        attempt.id,
        task_id=task.id,
        generation=attempt.generation,
        reason=reason,
    )
    await ch.event(f"attempt.{state}", attempt_id=attempt.id, task_id=task.id)
