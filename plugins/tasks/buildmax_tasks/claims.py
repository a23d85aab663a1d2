"""Claims: one short write transaction makes exactly one owner.

The transaction rechecks readiness, holds and decisions, asks the claim
checks, reserves the task's resources (all or none, guarded by a unique
constraint), resolves the run environment, bumps the generation with a
conditional update (``WHERE state = 'ready'``: the guard against two
owners), inserts the attempt (a partial unique index allows one active
attempt per task), issues a token scoped to the attempt, and audits.
A lapsed attempt in the way is retired in the same transaction, so
correctness never waits for the reaper.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import AttemptRef, RunEnvironmentRefused, Verdict

from buildmax.clock import to_rfc3339
from buildmax.conflicts import insert_ignoring_conflict
from buildmax.ids import new_id
from buildmax.schema import principals
from buildmax.tokens import issue_token

from .change import Change
from .holds import claimable, describe_hold, holds_covering, pending_decisions
from .lifecycle import retire_lapsed
from .problems import (
    ClaimVetoed,
    ResourceReserved,
    RunEnvironmentUnresolved,
    TaskClaimed,
    TaskHeld,
    TaskNotClaimable,
    TaskParked,
)
from .records import (
    AGENT_REVISION_SELECT,
    ATTEMPT_SELECT,
    agent_revision_ref,
    load_attempt,
    load_task,
    load_task_by_pk,
    task_ref,
)
from .schema import agent_revisions, agents, attempts, reservations, tasks


@dataclass
class Claim:
    """A successful claim: the attempt row, its task, and the token secret."""

    task: dict[str, Any]
    attempt: dict[str, Any]
    token_id: str
    token: str


@dataclass
class ClaimFilters:
    """What claim-next and the ready queue may pick."""

    project_pk: int | None = None
    kind: str | None = None
    label: str | None = None
    agent_pk: int | None = None
    extra: list[Any] = field(default_factory=list)

    def conditions(self) -> list[Any]:
        """SQL conditions on ``task_tasks``."""
        conditions = list(self.extra)
        if self.project_pk is not None:
            conditions.append(tasks.c.project_id == self.project_pk)
        if self.kind is not None:
            conditions.append(tasks.c.kind == self.kind)
        if self.label is not None:
            conditions.append(tasks.c.labels.contains(json.dumps(self.label), autoescape=True))
        if self.agent_pk is not None:
            conditions.append(tasks.c.agent_id == self.agent_pk)
        return conditions


def ready_query(space_pk: int, now: int, filters: ClaimFilters) -> Any:
    """The space's ready queue: claimable tasks by priority, then age.

    Served by the partial index ``task_tasks_ready`` on both engines."""
    return (
        sa.select(tasks.c.id, tasks.c.public_id)
        .where(tasks.c.space_id == space_pk, tasks.c.state == "ready")
        .where(*claimable(space_pk, now), *filters.conditions())
        .order_by(tasks.c.priority.desc(), tasks.c.ready_at, tasks.c.id)
    )


class Skip(Exception):
    """A claim-next candidate that cannot be claimed by this caller now."""

    def __init__(self, problem: Exception) -> None:
        super().__init__(str(problem))
        self.problem = problem


async def claim_named(ch: Change, caller_pk: int, task_id: str, lease_ms: int) -> Claim:
    """Claim one task by public id, or raise the problem that refuses it."""
    task = await load_task(ch.tx, task_id, space_pk=ch.space_pk, for_update=True)
    if task is None:
        from buildmax.problems import NotFound

        raise NotFound("no such task in this space")
    try:
        return await _claim(ch, caller_pk, task, lease_ms, skipped=0)
    except Skip as skip:
        raise skip.problem from None


async def claim_next(
    ch: Change, caller_pk: int, filters: ClaimFilters, lease_ms: int, scan_limit: int
) -> tuple[Claim | None, int]:
    """Claim the first claimable task matching ``filters``; the claim (or
    ``None``) and how many candidates were skipped on the way.

    On PostgreSQL candidates are locked with ``FOR UPDATE SKIP LOCKED``, so
    concurrent claimers take different tasks instead of queueing on one. They
    are locked one at a time: a batch would hide every row of it from the
    other claimers until this transaction ends, and they would answer that
    nothing is ready while ready tasks wait."""
    await retire_lapsed_in_space(ch, limit=20)
    skipped = 0
    seen: list[int] = []
    batch = 1 if ch.tx.dialect == "postgresql" else 20
    while len(seen) < scan_limit:
        query = ready_query(ch.space_pk, ch.now, filters).limit(min(batch, scan_limit - len(seen)))
        if seen:
            query = query.where(tasks.c.id.not_in(seen))
        if ch.tx.dialect == "postgresql":
            query = query.with_for_update(skip_locked=True, of=tasks)
        candidates = await ch.tx.fetch_all(query)
        if not candidates:
            break
        for candidate in candidates:
            seen.append(candidate["id"])
            task = await load_task_by_pk(ch.tx, candidate["id"])
            if task is None or task["state"] != "ready":
                continue
            try:
                return await _claim(ch, caller_pk, task, lease_ms, skipped=skipped), skipped
            except Skip:
                skipped += 1
    return None, skipped


async def retire_lapsed_in_space(ch: Change, limit: int) -> int:
    """Retire up to ``limit`` lapsed attempts of the space; how many."""
    rows = await ch.tx.fetch_all(
        ATTEMPT_SELECT.where(
            attempts.c.state == "active",
            attempts.c.lease_expires_at <= ch.now,
            attempts.c.space_id == ch.space_pk,
        )
        .order_by(attempts.c.lease_expires_at)
        .limit(limit)
    )
    for row in rows:
        task = await load_task_by_pk(ch.tx, row["task_id"], for_update=True)
        if task is not None:
            await retire_lapsed(ch, dict(row), task)
    return len(rows)


async def _claim(
    ch: Change, caller_pk: int, task: dict[str, Any], lease_ms: int, *, skipped: int
) -> Claim:
    if task["state"] == "claimed":
        task = await _retire_if_lapsed(ch, task)
    if task["state"] != "ready":
        raise Skip(TaskNotClaimable(f"the task is {task['state']}, not ready", state=task["state"]))
    held = await holds_covering(ch.tx, task)
    if held:
        described = await describe_hold(ch.tx, held[0])
        raise Skip(
            TaskHeld(
                f"a {described['strength']} hold on the {described['scope']['type']} "
                f"refuses claims: {described['reason']}",
                hold=described,
            )
        )
    parked = await pending_decisions(ch.tx, task["id"], ch.now)
    if parked:
        raise Skip(
            TaskParked(
                "the task waits for a decision to be answered",
                decisions=[d["public_id"] for d in parked],
            )
        )
    if task["human_only"] and ch.actor.kind != "human":
        raise Skip(ClaimVetoed("this work item is reserved for a human", plugin="tasks"))
    ref = task_ref(task)
    for verdict in await ch.app.plugins.acall(
        "buildmax_claim_check", tx=ch.tx, task=ref, principal=ch.actor
    ):
        if isinstance(verdict, Verdict) and verdict.outcome == "deny":
            raise Skip(ClaimVetoed(verdict.reason or "a claim check refused this claim"))
    attempt_id = new_id("at")
    lease_expires_at = ch.now + lease_ms
    await _reserve(ch, task, attempt_id)
    agent_revision = await _agent_revision(ch, task)
    generation = task["generation"] + 1
    attempt_ref = AttemptRef(
        id=attempt_id,
        task_id=task["public_id"],
        space_id=ch.space_id,
        generation=generation,
        claimant_id=str(ch.actor.principal_id),
        claimant_kind=ch.actor.kind,
        state="active",
        lease_expires_at=lease_expires_at,
        agent_revision_id=agent_revision["public_id"] if agent_revision else None,
    )
    try:
        environment = await _run_environment(ch, attempt_ref, agent_revision)
    except RunEnvironmentRefused as exc:
        await ch.tx.execute(
            sa.delete(reservations).where(reservations.c.attempt_public_id == attempt_id)
        )
        raise Skip(
            RunEnvironmentUnresolved(f"the run environment cannot be resolved: {exc}")
        ) from None
    # The guard: only a ready task becomes claimed, whoever else tries.
    bumped = await ch.tx.fetch_val(
        sa.update(tasks)
        .where(tasks.c.id == task["id"], tasks.c.state == "ready")
        .values(state="claimed", generation=tasks.c.generation + 1, updated_at=ch.now)
        .returning(tasks.c.generation)
    )
    if bumped is None:
        raise Skip(TaskNotClaimable("the task was claimed meanwhile"))
    attempt_pk = await ch.tx.fetch_val(
        attempts.insert()
        .values(
            public_id=attempt_id,
            task_id=task["id"],
            space_id=ch.space_pk,
            generation=bumped,
            claimant_id=caller_pk,
            agent_revision_id=agent_revision["id"] if agent_revision else None,
            state="active",
            lease_expires_at=lease_expires_at,
            run_environment=json.dumps(environment, separators=(",", ":"), sort_keys=True),
            created_at=ch.now,
        )
        .returning(attempts.c.id)
    )
    issued = await issue_token(
        ch.tx,
        principal_pk=caller_pk,
        now=ch.now,
        name=f"attempt {attempt_id}",
        origin="claim",
        scope_type="attempt",
        scope_id=attempt_id,
    )
    await ch.tx.execute(
        sa.update(attempts).where(attempts.c.id == attempt_pk).values(token_id=issued.public_id)
    )
    await ch.tx.execute(
        sa.update(tasks)
        .where(tasks.c.id == task["id"])
        .values(current_attempt_id=attempt_pk, finding_ids=task["finding_ids"])
    )
    await ch.audit(
        "task.claimed",
        "task",
        task["public_id"],
        attempt_id=attempt_id,
        generation=bumped,
        lease_expires_at=to_rfc3339(lease_expires_at),
        agent_revision_id=attempt_ref.agent_revision_id,
        skipped=skipped,
    )
    await ch.event(
        "task.claimed",
        task_id=task["public_id"],
        attempt_id=attempt_id,
        generation=bumped,
        claimant_id=ch.actor.principal_id,
    )
    attempt = await load_attempt(ch.tx, attempt_id)
    fresh = await load_task_by_pk(ch.tx, task["id"])
    assert attempt is not None and fresh is not None
    return Claim(fresh, attempt, issued.public_id, issued.secret)


async def _retire_if_lapsed(ch: Change, task: dict[str, Any]) -> dict[str, Any]:
    """A claimed task whose attempt's lease lapsed is recovered here."""
    attempt = await ch.tx.fetch_one(
        ATTEMPT_SELECT.where(attempts.c.task_id == task["id"], attempts.c.state == "active")
    )
    if attempt is None:
        return task
    if attempt["lease_expires_at"] > ch.now:
        raise Skip(
            TaskClaimed(
                "another attempt holds this task",
                holder={
                    "attempt_id": attempt["public_id"],
                    "principal_id": attempt["claimant_public_id"],
                    "lease_expires_at": to_rfc3339(attempt["lease_expires_at"]),
                },
            )
        )
    await retire_lapsed(ch, dict(attempt), task)
    fresh = await load_task_by_pk(ch.tx, task["id"], for_update=True)
    assert fresh is not None
    return fresh


async def _reserve(ch: Change, task: dict[str, Any], attempt_id: str) -> None:
    """Reserve every resource the task names, or none (the unique constraint
    on (space, resource) decides; a conflict names the holder)."""
    taken: list[str] = []
    for resource in task["resources"]:
        row = await ch.tx.fetch_val(
            insert_ignoring_conflict(ch.tx.dialect, reservations)
            .values(
                space_id=ch.space_pk,
                resource=resource,
                attempt_public_id=attempt_id,
                created_at=ch.now,
            )
            .returning(reservations.c.id)
        )
        if row is None:
            if taken:
                await ch.tx.execute(
                    sa.delete(reservations).where(reservations.c.attempt_public_id == attempt_id)
                )
            raise Skip(
                ResourceReserved(
                    f"the resource {resource!r} is reserved by another attempt",
                    resource=resource,
                    holder=await _holder(ch, resource),
                )
            )
        taken.append(resource)


async def _holder(ch: Change, resource: str) -> dict[str, Any] | None:
    holding = attempts.alias("holding")
    holder_task = tasks.alias("holder_task")
    row = await ch.tx.fetch_one(
        sa.select(
            holding.c.public_id,
            holding.c.lease_expires_at,
            holder_task.c.public_id.label("task_public_id"),
            principals.c.public_id.label("principal_public_id"),
        )
        .select_from(
            reservations.join(holding, holding.c.public_id == reservations.c.attempt_public_id)
            .join(holder_task, holder_task.c.id == holding.c.task_id)
            .join(principals, principals.c.id == holding.c.claimant_id)
        )
        .where(reservations.c.space_id == ch.space_pk, reservations.c.resource == resource)
    )
    if row is None:
        return None
    return {
        "attempt_id": row["public_id"],
        "task_id": row["task_public_id"],
        "principal_id": row["principal_public_id"],
        "lease_expires_at": to_rfc3339(row["lease_expires_at"]),
    }


async def _agent_revision(ch: Change, task: dict[str, Any]) -> dict[str, Any] | None:
    if task["agent_id"] is None:
        return None
    row = await ch.tx.fetch_one(
        AGENT_REVISION_SELECT.where(
            agent_revisions.c.id
            == sa.select(agents.c.current_revision_id)
            .where(agents.c.id == task["agent_id"])
            .scalar_subquery()
        )
    )
    return dict(row) if row is not None else None


async def _run_environment(
    ch: Change, attempt: AttemptRef, agent_revision: dict[str, Any] | None
) -> dict[str, Any]:
    ref = agent_revision_ref(agent_revision) if agent_revision else None
    merged: dict[str, Any] = {}
    for answer in await ch.app.plugins.acall(
        "buildmax_run_environment", tx=ch.tx, attempt=attempt, agent_revision=ref
    ):
        for key, value in dict(answer).items():
            if key in merged:
                raise RunEnvironmentRefused(f"two plugins both answered {key!r}")
            merged[key] = value
    return merged
