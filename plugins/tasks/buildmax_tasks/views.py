"""API representations of tasks, attempts and submissions.

A task's ``parked`` flag, the holds covering it and its pending decisions
are derived when it is shown (never stored); a page of tasks costs two
extra queries, not two per task.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Transaction

from .engine import StageEngine, stranded
from .holds import describe_hold, literal
from .records import HOLD_SELECT, submission_artifact_ids
from .rows import AttemptRow, HoldRow, SubmissionRow, TaskRow
from .schemas import AttemptOut, SubmissionOut, TaskOut
from .tables import decisions, holds

TASK_OUT = TaskOut()
#: States in which holds and decisions matter to a task.
LIVE_STATES = ("open", "ready", "claimed", "waiting")
#: The space's pending decisions (few: each parks a task until a person answers).
_PENDING_IN_SPACE = (
    sa.select(decisions.c.task_id.label("task_pk"), decisions.c.public_id.label("id"))
    .where(
        decisions.c.space_id == sa.bindparam("space_pk"),
        decisions.c.state == literal("pending"),
        sa.or_(decisions.c.expires_at.is_(None), decisions.c.expires_at > sa.bindparam("now")),
    )
    .order_by(decisions.c.id)
)
#: The space's live holds, in the order they were placed (a task shows them so).
_LIVE_HOLDS = HOLD_SELECT.where(
    holds.c.space_id == sa.bindparam("space_pk"), holds.c.lifted_at.is_(None)
).order_by(holds.c.id)
ATTEMPT_OUT = AttemptOut()
SUBMISSION_OUT = SubmissionOut()


async def render_tasks(
    conn: Transaction, rows: list[TaskRow], now: int, engine: StageEngine
) -> list[dict[str, Any]]:
    """Tasks as the API shows them."""
    if not rows:
        return []
    space_pk = rows[0].space_pk
    pending: defaultdict[int, list[str]] = defaultdict(list)
    described: list[tuple[HoldRow, dict[str, Any]]] = []
    task_pks = [r.pk for r in rows if r.state in LIVE_STATES]
    if not task_pks:
        return [task_body(row, [], [], engine) for row in rows]
    live = await conn.fetch_all(_LIVE_HOLDS, {"space_pk": space_pk})
    described = [(h, await describe_hold(conn, h)) for h in map(HoldRow.of, live)]
    shown = set(task_pks)
    for row in await conn.fetch_all(_PENDING_IN_SPACE, {"space_pk": space_pk, "now": now}):
        if row["task_pk"] in shown:
            pending[row["task_pk"]].append(row["id"])
    rendered = []
    for task in rows:
        covering = [
            view
            for hold, view in described
            if hold.scope_type == "space"
            or (hold.scope_type == "project" and hold.scope_pk == task.project_pk)
            or (hold.scope_type == "task" and hold.scope_pk == task.pk)
        ]
        rendered.append(task_body(task, covering, pending[task.pk], engine))
    return rendered


def task_body(
    row: TaskRow,
    covering: list[dict[str, Any]],
    pending: list[str],
    engine: StageEngine,
) -> dict[str, Any]:
    """One task's API body."""
    live_state = row.state in LIVE_STATES
    body: dict[str, Any] = TASK_OUT.dump(
        {
            "id": row.id,
            "project_id": row.project_id,
            "kind": row.kind,
            "title": row.title,
            "body": row.body,
            "criteria": row.criteria,
            "revision": row.revision,
            "priority": row.priority,
            "labels": json.loads(row.labels),
            "agent_id": row.agent_id,
            "state": row.state,
            "parked": live_state and bool(covering or pending),
            "held_by": covering if live_state else [],
            "pending_decisions": pending,
            "stage": row.stage,
            "stage_missing": stranded(engine, row),
            "slot": row.slot,
            "human_only": bool(row.human_only),
            "subject_task_id": row.subject_task_id,
            "submission_id": row.subject_submission_id,
            "generation": row.generation,
            "max_attempts": row.max_attempts,
            "attempts_used": row.attempts_used,
            "current_attempt_id": row.current_attempt_id,
            "current_submission_id": row.current_submission_id,
            "finding_ids": json.loads(row.finding_ids),
            "outcome_reason": row.outcome_reason,
            "resources": json.loads(row.resources),
            "source": (
                None
                if row.source_system is None
                else {"system": row.source_system, "id": row.source_id}
            ),
            "links": json.loads(row.links),
            "ready_at": row.ready_at,
            "created_at": row.created_at,
            "updated_at": row.updated_at,
        }
    )
    return body


def attempt_body(row: AttemptRow) -> dict[str, Any]:
    """One attempt's API body."""
    body: dict[str, Any] = ATTEMPT_OUT.dump(
        {
            "id": row.id,
            "task_id": row.task_id,
            "generation": row.generation,
            "claimant_id": row.claimant_id,
            "agent_revision_id": row.agent_revision_id,
            "state": row.state,
            "lease_expires_at": row.lease_expires_at,
            "run_environment": json.loads(row.run_environment),
            "progress": json.loads(row.progress) if row.progress else None,
            "end_reason": row.end_reason,
            "created_at": row.created_at,
            "renewed_at": row.renewed_at,
            "ended_at": row.ended_at,
        }
    )
    return body


def submission_body(row: SubmissionRow) -> dict[str, Any]:
    """One submission's API body."""
    body: dict[str, Any] = SUBMISSION_OUT.dump(
        {
            "id": row.id,
            "task_id": row.task_id,
            "attempt_id": row.attempt_id,
            "generation": row.generation,
            "task_revision": row.task_revision,
            "submitted_by": row.submitted_by_id,
            "summary": row.summary,
            "candidate": json.loads(row.candidate),
            "evidence": json.loads(row.evidence),
            "artifacts": submission_artifact_ids(row),
            "verdict": row.verdict,
            "created_at": row.created_at,
        }
    )
    return body
