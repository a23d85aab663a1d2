"""The review and integrate stages: what the stage engine asks of them.

The tasks plugin creates the stages' work items and applies verdicts; this
module records the activities, reviews, findings and integrations, checks
independence, and answers with a :class:`Verdict`. Tasks are read and
steered only through the ``TaskQueue`` service.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import (
    SYSTEM_ACTOR,
    Actor,
    App,
    AttemptRef,
    StageSpec,
    SubmissionRef,
    TaskQueue,
    TaskRef,
    Transaction,
    Verdict,
)

from buildmax.ids import new_id
from buildmax.spaces import space_pk
from buildmax.tables import bound_insert

from .candidates import IntegrationIn, ReviewIn, parse
from .problems import HumanReviewRefused, NotIndependent, ReviewStale
from .tables import activities, findings, integrations, reviews, waiting

REVIEW = StageSpec(
    "review",
    order=100,
    work_kind="review",
    slots="approvals_required",
    human_slot="human_review_required",
    description=(
        "Review the submitted candidate against the task's criteria and record a decision "
        "(approve, request_changes with findings, or reject) with `buildmax review`."
    ),
)
INTEGRATE = StageSpec(
    "integrate",
    order=200,
    work_kind="integration",
    slots=1,
    reserves_target=True,
    description=(
        "Integrate the approved candidate into the project's target and hand in the outcome: "
        '{"outcome": "merged", "before": REF, "after": REF} or '
        '{"outcome": "failed", "reason": TEXT}.'
    ),
)
STAGES = (REVIEW, INTEGRATE)
KIND_OF_STAGE = {REVIEW.name: "review", INTEGRATE.name: "integration"}


_INSERT_ACTIVITY = bound_insert(
    activities,
    "space_id",
    "kind",
    "subject_task_id",
    "submission_id",
    "work_task_id",
    "slot",
    "human_only",
    "task_revision",
    "criteria_sha256",
    "target",
    "decision_id",
    "created_at",
).returning(activities.c.id)
_INSERT_WAITING = bound_insert(waiting, "activity_id", "space_id", "created_at")


async def stage_entered(
    app: App, tx: Transaction, subject: TaskRef, stage: str, work: Sequence[TaskRef], actor: Actor
) -> None:
    """Record one activity per work item; with a policy that does not allow
    automatic integration, park each integration on a human's decision."""
    kind = KIND_OF_STAGE.get(stage)
    if kind is None or not work:
        return
    queue = app.services.get(TaskQueue)
    submission_id = work[0].submission_id
    assert submission_id is not None, "stage work names its submission"
    submission = await queue.submission(tx, submission_id)
    assert submission is not None
    policy = await queue.policy(tx, subject.project_id)
    now = app.clock.now_ms()
    pk = await space_pk(tx, subject.space_id)
    assert pk is not None, "the space of a task exists"
    # The subject's earlier submissions were given up (changes, a failed
    # integration, a retry): their review work waits no more.
    await _stop_waiting(
        tx,
        sa.and_(
            activities.c.subject_task_id == subject.id,
            activities.c.submission_id != submission_id,
        ),
    )
    for item in work:
        target = item.resources[0] if kind == "integration" and item.resources else None
        decision_id = None
        if kind == "integration" and policy.get("integration") != "automatic":
            decision_id = await queue.open_decision(
                tx,
                item.id,
                question=f"Integrate {subject.title!r} ({subject.id}) into {target}?",
                options=["integrate"],
                actor=SYSTEM_ACTOR,
            )
        activity_pk = await tx.fetch_val(
            _INSERT_ACTIVITY,
            {
                "space_id": pk,
                "kind": kind,
                "subject_task_id": subject.id,
                "submission_id": submission_id,
                "work_task_id": item.id,
                "slot": item.slot or 0,
                "human_only": int(item.human_only),
                "task_revision": submission.task_revision,
                "criteria_sha256": subject.criteria_sha256,
                "target": target,
                "decision_id": decision_id,
                "created_at": now,
            },
        )
        if kind == "review":
            await tx.execute(
                _INSERT_WAITING, {"activity_id": activity_pk, "space_id": pk, "created_at": now}
            )


async def _stop_waiting(tx: Transaction, which: Any) -> None:
    """Delete the ``review_waiting`` rows of the activities ``which`` selects."""
    await tx.execute(
        waiting.delete().where(waiting.c.activity_id.in_(sa.select(activities.c.id).where(which)))
    )


async def not_independent(
    tx: Transaction, queue: TaskQueue, task: TaskRef, principal_id: str | None
) -> str | None:
    """Why ``principal_id`` may not review ``task`` (a review work item), or
    ``None``: the submitter of the work under review, and a principal who
    holds or handed in another review slot of the same submission, are not
    independent."""
    assert task.submission_id is not None
    submission = await queue.submission(tx, task.submission_id)
    if submission is not None and submission.submitted_by == principal_id:
        return "the reviewer handed in the work under review"
    for other in await queue.linked_work(tx, task.submission_id):
        if other.id == task.id or other.stage != task.stage:
            continue
        for attempt in await queue.attempts(tx, other.id):
            if attempt.claimant_id == principal_id and attempt.state in ("active", "submitted"):
                return (
                    f"the reviewer already holds review slot {(other.slot or 0) + 1} "
                    "of this submission"
                )
    return None


async def claim_check(app: App, tx: Transaction, task: TaskRef, principal: Actor) -> Verdict | None:
    """Refuse a review slot to a principal who is not independent."""
    if task.stage != REVIEW.name or task.submission_id is None:
        return None
    reason = await not_independent(tx, app.services.get(TaskQueue), task, principal.principal_id)
    return Verdict("deny", reason) if reason else None


async def attempt_submitted(
    app: App,
    tx: Transaction,
    task: TaskRef,
    attempt: AttemptRef,
    submission: SubmissionRef,
    actor: Actor,
) -> Verdict | None:
    """Judge review or integration work handed in (other work: no opinion)."""
    if task.subject_task_id is None or task.stage not in KIND_OF_STAGE:
        return None
    if actor.principal_id != attempt.claimant_id:
        raise HumanReviewRefused(
            "stage work is handed in by the principal who claimed it; an override cannot "
            "record a review or an integration for them"
        )
    activity = await tx.fetch_one(sa.select(activities).where(activities.c.work_task_id == task.id))
    assert activity is not None, "every stage work item has its activity"
    if task.stage == REVIEW.name:
        return await _review(app, tx, task, attempt, submission, actor, dict(activity))
    return await _integration(app, tx, task, attempt, submission, actor, dict(activity))


async def _review(
    app: App,
    tx: Transaction,
    task: TaskRef,
    attempt: AttemptRef,
    submission: SubmissionRef,
    actor: Actor,
    activity: dict[str, Any],
) -> Verdict:
    queue = app.services.get(TaskQueue)
    review = parse(ReviewIn(), submission.candidate, "review")
    human = attempt.claimant_kind == "human"
    if review["human"] and not human:
        raise HumanReviewRefused("an agent cannot record a human review")
    if task.human_only and not human:
        raise HumanReviewRefused("this review slot is reserved for a human")
    reason = await not_independent(tx, queue, task, attempt.claimant_id)
    if reason is not None:
        raise NotIndependent(reason)
    subject = await queue.task(tx, activity["subject_task_id"])
    assert subject is not None
    if review["decision"] == "approve" and stale(subject, activity):
        raise ReviewStale(
            f"the subject's criteria changed since the work was submitted (revision "
            f"{activity['task_revision']}, now {subject.revision}): request changes or "
            "reject instead",
            revision=subject.revision,
            submitted_against=activity["task_revision"],
        )
    now = app.clock.now_ms()
    review_id = new_id("rv")
    review_pk = await tx.fetch_val(
        reviews.insert()
        .values(
            public_id=review_id,
            space_id=activity["space_id"],
            activity_id=activity["id"],
            subject_task_id=activity["subject_task_id"],
            submission_id=activity["submission_id"],
            attempt_id=attempt.id,
            reviewer_id=attempt.claimant_id,
            reviewer_kind=attempt.claimant_kind,
            decision=review["decision"],
            summary=submission.summary,
            task_revision=activity["task_revision"],
            created_at=now,
        )
        .returning(reviews.c.id)
    )
    if review["decision"] == "approve":
        await tx.execute(waiting.delete().where(waiting.c.activity_id == activity["id"]))
    else:
        # Changes or a rejection: the submission's other slots are given up.
        await _stop_waiting(tx, activities.c.submission_id == activity["submission_id"])
    finding_ids = []
    for finding in review["findings"]:
        finding_ids.append(new_id("fd"))
        await tx.execute(
            findings.insert().values(
                public_id=finding_ids[-1],
                space_id=activity["space_id"],
                review_id=review_pk,
                subject_task_id=activity["subject_task_id"],
                severity=finding["severity"],
                path=finding["path"],
                line=finding["line"],
                text=finding["text"],
                created_at=now,
            )
        )
    await app.audit.record(
        tx,
        actor,
        "review.recorded",
        space_id=task.space_id,
        target_type="review",
        target_id=review_id,
        details={
            "task_id": task.id,
            "subject_id": activity["subject_task_id"],
            "submission_id": activity["submission_id"],
            "decision": review["decision"],
            "human": human,
            "finding_ids": finding_ids,
        },
    )
    return await _review_verdict(tx, review["decision"], submission, activity, finding_ids)


async def _review_verdict(
    tx: Transaction,
    decision: str,
    submission: SubmissionRef,
    activity: dict[str, Any],
    finding_ids: list[str],
) -> Verdict:
    if decision == "reject":
        return Verdict("reject", submission.summary or "a reviewer rejected the work")
    if decision == "request_changes":
        return Verdict(
            "changes",
            submission.summary or "a reviewer requested changes",
            finding_ids=tuple(finding_ids),
        )
    slots, approvals = await _approvals(tx, activity["submission_id"])
    return Verdict("pass" if approvals >= slots else "pending")


async def _approvals(tx: Transaction, submission_id: str) -> tuple[int, int]:
    """(review slots, approvals recorded) of one submission."""
    slots = await tx.fetch_val(
        sa.select(sa.func.count())
        .select_from(activities)
        .where(activities.c.submission_id == submission_id, activities.c.kind == "review")
    )
    approvals = await tx.fetch_val(
        sa.select(sa.func.count())
        .select_from(reviews)
        .where(reviews.c.submission_id == submission_id, reviews.c.decision == "approve")
    )
    return int(slots or 0), int(approvals or 0)


async def _integration(
    app: App,
    tx: Transaction,
    task: TaskRef,
    attempt: AttemptRef,
    submission: SubmissionRef,
    actor: Actor,
    activity: dict[str, Any],
) -> Verdict:
    outcome = parse(IntegrationIn(), submission.candidate, "integration")
    integration_id = new_id("ig")
    target = activity["target"] or ""
    await tx.execute(
        integrations.insert().values(
            public_id=integration_id,
            space_id=activity["space_id"],
            activity_id=activity["id"],
            subject_task_id=activity["subject_task_id"],
            submission_id=activity["submission_id"],
            attempt_id=attempt.id,
            integrator_id=attempt.claimant_id,
            integrator_kind=attempt.claimant_kind,
            target=target,
            outcome=outcome["outcome"],
            before_ref=outcome["before"],
            after_ref=outcome["after"],
            reason=outcome["reason"],
            created_at=app.clock.now_ms(),
        )
    )
    await app.audit.record(
        tx,
        actor,
        "integration.recorded",
        space_id=task.space_id,
        target_type="integration",
        target_id=integration_id,
        details={
            "task_id": task.id,
            "subject_id": activity["subject_task_id"],
            "submission_id": activity["submission_id"],
            "target": target,
            "outcome": outcome["outcome"],
            "before": outcome["before"],
            "after": outcome["after"],
        },
    )
    if outcome["outcome"] == "merged":
        return Verdict("pass")
    return Verdict("changes", f"integration into {target} failed: {outcome['reason']}")


def stale(subject: TaskRef, activity: Mapping[str, Any]) -> bool:
    """Whether the subject's acceptance criteria changed since the work of
    ``activity`` was submitted."""
    return bool(subject.criteria_sha256 != activity["criteria_sha256"])


def activity_view(row: Mapping[str, Any]) -> dict[str, Any]:
    """An activity row's public fields."""
    return {
        "kind": row["kind"],
        "task_id": row["work_task_id"],
        "subject_id": row["subject_task_id"],
        "submission_id": row["submission_id"],
        "slot": row["slot"],
        "human_only": bool(row["human_only"]),
        "task_revision": row["task_revision"],
        "target": row["target"],
        "decision_id": row["decision_id"],
    }
