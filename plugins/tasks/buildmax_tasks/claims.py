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

import contextlib
import functools
import json
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from buildmax_hookspecs import AttemptRef, RunEnvironmentRefused, Verdict

from buildmax.clock import to_rfc3339
from buildmax.conflicts import insert_ignoring_conflict
from buildmax.ids import new_id
from buildmax.problems import NotFound
from buildmax.tables import keyed_insert

from .attempt_tokens import issue_attempt_token
from .change import Change, change
from .diagnostics import CLAIMS
from .engine import stage_engine, stranded
from .holds import CLAIMABLE, describe_hold, holds_covering, literal, pending_decisions
from .lifecycle import UNRESERVE, mark_claimed, retire_lapsed
from .problems import (
    ClaimVetoed,
    ResourceReserved,
    RunEnvironmentUnresolved,
    StageNotLoaded,
    TaskClaimed,
    TaskHeld,
    TaskNotClaimable,
    TaskParked,
)
from .records import (
    AGENT_REVISION_SELECT,
    ATTEMPT_SELECT,
    agent_revision_ref,
    load_task,
    load_task_by_pk,
    task_ref,
)
from .rows import AgentRevisionRow, AttemptRow, TaskRow
from .tables import agent_revisions, agents, attempts, reservations, tasks

if TYPE_CHECKING:
    from buildmax.access import SpaceAccess
    from buildmax.app import BuildMax
    from buildmax.auth import Caller


@dataclass
class Claim:
    """A successful claim: the attempt row, its task, and the token secret."""

    task: TaskRow
    attempt: AttemptRow
    token_id: str
    token: str


@dataclass(frozen=True)
class ClaimFilters:
    """What claim-next and the ready queue may pick."""

    project_pk: int | None = None
    kind: str | None = None
    label: str | None = None
    agent_pk: int | None = None

    def shape(self) -> tuple[bool, bool, bool, bool]:
        """Which filters are set: the ready statement is built once per shape."""
        return (
            self.project_pk is not None,
            self.kind is not None,
            self.label is not None,
            self.agent_pk is not None,
        )

    def params(self) -> dict[str, Any]:
        """Values for the set filters' bindparams."""
        values: dict[str, Any] = {}
        if self.project_pk is not None:
            values["project_pk"] = self.project_pk
        if self.kind is not None:
            values["kind"] = self.kind
        if self.label is not None:
            values["label"] = "%" + _escape_like(json.dumps(self.label)) + "%"
        if self.agent_pk is not None:
            values["agent_pk"] = self.agent_pk
        return values


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


@functools.cache
def ready_statement(
    shape: tuple[bool, bool, bool, bool], *, after: bool = False, lock: bool = False
) -> Any:
    """The space's ready queue: the keys (``id``, ``priority``, ``ready_at``)
    of claimable tasks by priority, then age. Built once per filter shape
    (bindparams ``space_pk``, ``now``, ``limit``, the filters' and, with
    ``after``, the key of the last row seen: ``after_priority``,
    ``after_ready_at``, ``after_id``).

    Served by the partial index ``task_tasks_ready`` on both engines: it
    reads ``task_tasks`` alone (the rows are loaded by key afterwards) and
    its state is a literal, so the planner matches the index's predicate."""
    project, kind, label, agent = shape
    query = sa.select(tasks.c.id.label("pk"), tasks.c.priority, tasks.c.ready_at).where(
        tasks.c.space_id == sa.bindparam("space_pk", type_=sa.BigInteger),
        tasks.c.state == literal("ready"),
        *CLAIMABLE,
    )
    if project:
        query = query.where(tasks.c.project_id == sa.bindparam("project_pk", type_=sa.BigInteger))
    if kind:
        query = query.where(tasks.c.kind == sa.bindparam("kind"))
    if label:
        query = query.where(tasks.c.labels.like(sa.bindparam("label"), escape="\\"))
    if agent:
        query = query.where(tasks.c.agent_id == sa.bindparam("agent_pk", type_=sa.BigInteger))
    if after:
        # An index range (priority <= p) in index order, minus the rows of
        # priority p already seen: no OR, so no bitmap scan and no sort.
        priority: Any = sa.bindparam("after_priority", type_=sa.BigInteger)
        seen = sa.tuple_(tasks.c.ready_at, tasks.c.id) <= sa.tuple_(
            sa.bindparam("after_ready_at", type_=sa.BigInteger),
            sa.bindparam("after_id", type_=sa.BigInteger),
        )
        query = query.where(
            tasks.c.priority <= priority, ~sa.and_(tasks.c.priority == priority, seen)
        )
    query = query.order_by(tasks.c.priority.desc(), tasks.c.ready_at, tasks.c.id).limit(
        sa.bindparam("limit", type_=sa.Integer)
    )
    if lock:
        query = query.with_for_update(skip_locked=True, of=tasks)
    return query


def ready_params(
    space_pk: int,
    now: int,
    filters: ClaimFilters,
    limit: int,
    after: tuple[int, int, int] | None = None,
) -> dict[str, Any]:
    """The bindparams of :func:`ready_statement`."""
    values = {"space_pk": space_pk, "now": now, "limit": limit, **filters.params()}
    if after is not None:
        values.update(after_priority=after[0], after_ready_at=after[1], after_id=after[2])
    return values


def ready_key(row: Any) -> tuple[int, int, int]:
    """A ready row's position in the queue (for paging past it)."""
    return (row["priority"], row["ready_at"], row["pk"])


class Skip(Exception):
    """A claim-next candidate that cannot be claimed by this caller now."""

    def __init__(self, problem: Exception) -> None:
        super().__init__(str(problem))
        self.problem = problem


_linked = tasks.alias("linked")
#: Lock the subject of a linked work item (no row for any other task).
_LOCK_SUBJECT_OF = (
    sa.select(tasks.c.id)
    .where(
        tasks.c.id
        == sa.select(_linked.c.subject_task_id)
        .where(_linked.c.public_id == sa.bindparam("public_id"))
        .scalar_subquery()
    )
    .with_for_update(of=tasks)
)
#: Lock a subject unless another transaction holds it.
_TRY_LOCK_SUBJECT = (
    sa.select(tasks.c.id)
    .where(tasks.c.id == sa.bindparam("pk", type_=sa.BigInteger))
    .with_for_update(skip_locked=True)
)


async def claim_named(ch: Change, caller_pk: int, task_id: str, lease_ms: int) -> Claim:
    """Claim one task by public id, or raise the problem that refuses it.

    The subject of linked stage work is locked first (rows are locked in one
    order everywhere: subject, then its work item), so the claims of one
    subject's work items are serialised and a claim check sees the others'
    attempts (one reviewer, one slot)."""
    if ch.tx.dialect == "postgresql":
        await ch.tx.fetch_all(_LOCK_SUBJECT_OF, {"public_id": task_id})
    task = await load_task(ch.tx, task_id, space_pk=ch.space_pk, for_update=True)
    if task is None:
        raise NotFound("no such task in this space")
    try:
        return await _claim(ch, caller_pk, task, lease_ms, skipped=0, queued=False)
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
    postgres = ch.tx.dialect == "postgresql"
    # One candidate first (the usual case claims it); then small batches on
    # SQLite, where nobody else can lock them meanwhile.
    batch = 1
    skipped = examined = 0
    after: tuple[int, int, int] | None = None
    while examined < scan_limit:
        statement = ready_statement(filters.shape(), after=after is not None, lock=postgres)
        params = ready_params(
            ch.space_pk, ch.now, filters, min(batch, scan_limit - examined), after
        )
        candidates = await ch.tx.fetch_all(statement, params)
        if not candidates:
            break
        batch = 1 if postgres else 10
        for candidate in candidates:
            examined += 1
            after = ready_key(candidate)
            task = await load_task_by_pk(ch.tx, candidate["pk"])
            if postgres and task.subject_task_pk is not None:
                # The work item is locked already: its subject must not be
                # waited for (that order is the other way round elsewhere).
                locked = await ch.tx.fetch_val(_TRY_LOCK_SUBJECT, {"pk": task.subject_task_pk})
                if locked is None:
                    skipped += 1
                    continue
            try:
                claim = await _claim(ch, caller_pk, task, lease_ms, skipped=skipped, queued=True)
            except Skip:
                skipped += 1
                continue
            return claim, skipped
    return None, skipped


#: An active attempt whose lease ran out before ``now``: what recovery
#: retires, wherever it finds one (in the space, holding a task or a resource).
LAPSED = sa.and_(
    attempts.c.state == literal("active"),
    attempts.c.lease_expires_at <= sa.bindparam("now"),
)
_LAPSED_IN_SPACE = (
    ATTEMPT_SELECT.where(
        LAPSED, attempts.c.space_id == sa.bindparam("space_pk", type_=sa.BigInteger)
    )
    .order_by(attempts.c.lease_expires_at)
    .limit(sa.bindparam("limit", type_=sa.Integer))
)
_LAPSED_OF_TASK = (
    sa.select(attempts.c.id)
    .join(tasks, tasks.c.id == attempts.c.task_id)
    .where(
        LAPSED,
        tasks.c.public_id == sa.bindparam("public_id"),
        tasks.c.space_id == sa.bindparam("space_pk"),
    )
)
#: The attempt holding a resource of the space.
_HOLDER = ATTEMPT_SELECT.join(
    reservations, reservations.c.attempt_public_id == attempts.c.public_id
).where(
    reservations.c.space_id == sa.bindparam("space_pk"),
    reservations.c.resource == sa.bindparam("resource"),
)
_LAPSED_HOLDER = _HOLDER.where(LAPSED)


async def retire_lapsed_in_space(ch: Change, limit: int) -> int:
    """Retire up to ``limit`` lapsed attempts of the space; how many."""
    rows = await ch.tx.fetch_all(
        _LAPSED_IN_SPACE, {"now": ch.now, "space_pk": ch.space_pk, "limit": limit}
    )
    for attempt in map(AttemptRow.of, rows):
        task = await load_task_by_pk(ch.tx, attempt.task_pk, for_update=True)
        await retire_lapsed(ch, attempt, task)
    return len(rows)


_INSERT_ATTEMPT = keyed_insert(attempts)
_POINT_AT = (
    sa.update(tasks)
    .where(tasks.c.id == sa.bindparam("pk"))
    .values(current_attempt_id=sa.bindparam("attempt_pk"))
)


async def _claim(
    ch: Change,
    caller_pk: int,
    task: TaskRow,
    lease_ms: int,
    *,
    skipped: int,
    queued: bool,
) -> Claim:
    """Claim ``task`` (its row locked) for ``caller_pk``. ``queued`` tasks
    came from the ready query, which already left out held and parked ones."""
    task = await _claimable(ch, task, queued)
    attempt_id = new_id("at")
    await _reserve(ch, task, attempt_id)
    agent_revision = await _agent_revision(ch, task)
    attempt = AttemptRef(
        id=attempt_id,
        task_id=task.id,
        space_id=ch.space_id,
        generation=task.generation + 1,
        claimant_id=str(ch.actor.principal_id),
        claimant_kind=ch.actor.kind,
        state="active",
        lease_expires_at=ch.now + lease_ms,
        agent_revision_id=agent_revision.id if agent_revision else None,
    )
    environment = await _resolved_environment(ch, task, attempt, agent_revision)
    # The guard: only a ready task becomes claimed, whoever else tries.
    generation = await mark_claimed(ch, task.pk)
    if generation is None:
        raise Skip(TaskNotClaimable("the task was claimed meanwhile"))
    issued = await issue_attempt_token(ch, caller_pk, attempt_id)
    row: dict[str, Any] = {
        "id": attempt_id,
        "task_pk": task.pk,
        "space_pk": ch.space_pk,
        "generation": generation,
        "claimant_pk": caller_pk,
        "agent_revision_pk": agent_revision.pk if agent_revision else None,
        "state": "active",
        "lease_expires_at": attempt.lease_expires_at,
        "run_environment": json.dumps(environment, separators=(",", ":"), sort_keys=True),
        "progress": None,
        "token_id": issued.public_id,
        "hold_refused_at": None,
        "charged": 0,
        "end_reason": None,
        "created_at": ch.now,
        "renewed_at": None,
        "ended_at": None,
    }
    attempt_pk = await ch.tx.fetch_val(_INSERT_ATTEMPT, row)
    await ch.tx.execute(_POINT_AT, {"pk": task.pk, "attempt_pk": attempt_pk})
    await _announce_claim(ch, attempt, generation, skipped)
    CLAIMS.after_commit(ch.app, ch.tx)
    claimed = replace(
        task,
        state="claimed",
        generation=generation,
        current_attempt_pk=attempt_pk,
        current_attempt_id=attempt_id,
        updated_at=ch.now,
    )
    shown = AttemptRow(
        pk=attempt_pk,
        **row,
        task_id=task.id,
        subject_task_pk=task.subject_task_pk,
        space_id=ch.space_id,
        claimant_id=attempt.claimant_id,
        claimant_kind=ch.actor.kind,
        agent_revision_id=attempt.agent_revision_id,
    )
    return Claim(claimed, shown, issued.public_id, issued.secret)


async def _claimable(ch: Change, task: TaskRow, queued: bool) -> TaskRow:
    """``task`` (fresh, once a lapsed attempt holding it is retired) if
    this caller may claim it now; :class:`Skip` with the problem if not."""
    if task.state == "claimed":
        task = await _retire_if_lapsed(ch, task)
    if task.state != "ready":
        raise Skip(TaskNotClaimable(f"the task is {task.state}, not ready", state=task.state))
    if not queued:
        await _refuse_held_or_parked(ch, task)
    if task.human_only and ch.actor.kind != "human":
        raise Skip(ClaimVetoed("this work item is reserved for a human", plugin="tasks"))
    if stranded(stage_engine(ch.app), task):
        raise Skip(
            StageNotLoaded(
                f"this is work of the {task.stage!r} stage, whose plugin is not loaded",
                stage=task.stage,
            )
        )
    for verdict in await ch.app.hooks.claim_check(ch.tx, task_ref(task), ch.actor):
        if isinstance(verdict, Verdict) and verdict.outcome == "deny":
            raise Skip(ClaimVetoed(verdict.reason or "a claim check refused this claim"))
    return task


async def _resolved_environment(
    ch: Change, task: TaskRow, attempt: AttemptRef, agent_revision: AgentRevisionRow | None
) -> dict[str, Any]:
    """The new attempt's run environment; :class:`Skip` (its reservations
    released) when the plugins cannot resolve it."""
    try:
        return await _run_environment(ch, task, attempt, agent_revision)
    except RunEnvironmentRefused as exc:
        await ch.tx.execute(UNRESERVE, {"attempt_public_id": attempt.id})
        raise Skip(
            RunEnvironmentUnresolved(f"the run environment cannot be resolved: {exc}")
        ) from None


async def _announce_claim(ch: Change, attempt: AttemptRef, generation: int, skipped: int) -> None:
    """The claim's audit event and stream event."""
    await ch.audit(
        "task.claimed",
        "task",
        attempt.task_id,
        attempt_id=attempt.id,
        generation=generation,
        lease_expires_at=to_rfc3339(attempt.lease_expires_at),
        agent_revision_id=attempt.agent_revision_id,
        skipped=skipped,
    )
    await ch.event(
        "task.claimed",
        task_id=attempt.task_id,
        attempt_id=attempt.id,
        generation=generation,
        claimant_id=ch.actor.principal_id,
    )


async def _refuse_held_or_parked(ch: Change, task: TaskRow) -> None:
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
    parked = await pending_decisions(ch.tx, task.pk, ch.now)
    if parked:
        raise Skip(
            TaskParked(
                "the task waits for a decision to be answered",
                decisions=[d.id for d in parked],
            )
        )


async def recover_before_claim(
    app: BuildMax, caller: Caller, access: SpaceAccess, task_id: str
) -> None:
    """Retire the lapsed attempt holding ``task_id``, if there is one, in a
    transaction of its own before the claim: the recovery stands even when
    the claim that follows is refused (a task whose attempts are spent is
    then failed, whatever the reaper does)."""
    async with app.db.read() as conn:
        lapsed = await conn.fetch_val(
            _LAPSED_OF_TASK,
            {"public_id": task_id, "space_pk": access.pk, "now": app.clock.now_ms()},
        )
    if lapsed is None:
        return
    async with app.db.write() as tx:
        ch = change(app, tx, caller, access)
        task = await load_task(tx, task_id, space_pk=ch.space_pk, for_update=True)
        if task is not None and task.state == "claimed":
            with contextlib.suppress(Skip):
                await _retire_if_lapsed(ch, task)


async def _retire_if_lapsed(ch: Change, task: TaskRow) -> TaskRow:
    """A claimed task whose attempt's lease lapsed is recovered here."""
    row = await ch.tx.fetch_one(
        ATTEMPT_SELECT.where(attempts.c.task_id == task.pk, attempts.c.state == "active")
    )
    if row is None:
        return task
    attempt = AttemptRow.of(row)
    if attempt.lease_expires_at > ch.now:
        raise Skip(
            TaskClaimed(
                "another attempt holds this task",
                holder={
                    "attempt_id": attempt.id,
                    "principal_id": attempt.claimant_id,
                    "lease_expires_at": to_rfc3339(attempt.lease_expires_at),
                },
            )
        )
    await retire_lapsed(ch, attempt, task)
    return await load_task_by_pk(ch.tx, task.pk, for_update=True)


_RESERVE_STATEMENTS: dict[str, Any] = {}


def _reserve_statement(dialect: str) -> Any:
    statement = _RESERVE_STATEMENTS.get(dialect)
    if statement is None:
        statement = (
            insert_ignoring_conflict(dialect, reservations)
            .values({c.name: sa.bindparam(c.name) for c in reservations.c if c.name != "id"})
            .returning(reservations.c.id)
        )
        _RESERVE_STATEMENTS[dialect] = statement
    return statement


async def _reserve(ch: Change, task: TaskRow, attempt_id: str) -> None:
    """Reserve every resource the task names, or none (the unique constraint
    on (space, resource) decides; a conflict names the holder). A holder
    whose lease lapsed is retired first, so it never blocks a claim."""
    statement = _reserve_statement(ch.tx.dialect)
    for resource in json.loads(task.resources):
        values = {
            "space_id": ch.space_pk,
            "resource": resource,
            "attempt_public_id": attempt_id,
            "created_at": ch.now,
        }
        row = await ch.tx.fetch_val(statement, values)
        if row is None and await _retire_lapsed_holder(ch, resource):
            row = await ch.tx.fetch_val(statement, values)
        if row is None:
            await ch.tx.execute(UNRESERVE, {"attempt_public_id": attempt_id})
            raise Skip(
                ResourceReserved(
                    f"the resource {resource!r} is reserved by another attempt",
                    resource=resource,
                    holder=await _holder(ch, resource),
                )
            )


async def _retire_lapsed_holder(ch: Change, resource: str) -> bool:
    """Retire the attempt holding ``resource`` if its lease lapsed; whether it did."""
    row = await ch.tx.fetch_one(
        _LAPSED_HOLDER, {"space_pk": ch.space_pk, "resource": resource, "now": ch.now}
    )
    if row is None:
        return False
    holder = AttemptRow.of(row)
    holder_task = await load_task_by_pk(ch.tx, holder.task_pk, for_update=True)
    await retire_lapsed(ch, holder, holder_task)
    return True


async def _holder(ch: Change, resource: str) -> dict[str, Any] | None:
    row = await ch.tx.fetch_one(_HOLDER, {"space_pk": ch.space_pk, "resource": resource})
    if row is None:
        return None
    holder = AttemptRow.of(row)
    return {
        "attempt_id": holder.id,
        "task_id": holder.task_id,
        "principal_id": holder.claimant_id,
        "lease_expires_at": to_rfc3339(holder.lease_expires_at),
    }


async def _agent_revision(ch: Change, task: TaskRow) -> AgentRevisionRow | None:
    if task.agent_pk is None:
        return None
    row = await ch.tx.fetch_one(
        AGENT_REVISION_SELECT.where(
            agent_revisions.c.id
            == sa.select(agents.c.current_revision_id)
            .where(agents.c.id == task.agent_pk)
            .scalar_subquery()
        )
    )
    return AgentRevisionRow.of(row) if row is not None else None


async def _run_environment(
    ch: Change, task: TaskRow, attempt: AttemptRef, agent_revision: AgentRevisionRow | None
) -> dict[str, Any]:
    ref = agent_revision_ref(agent_revision) if agent_revision else None
    merged: dict[str, Any] = {}
    answers = await ch.app.hooks.run_environment(
        ch.tx, task=task_ref(task), attempt=attempt, agent_revision=ref
    )
    for answer in answers:
        for key, value in dict(answer).items():
            if key in merged:
                raise RunEnvironmentRefused(f"two plugins both answered {key!r}")
            merged[key] = value
    return merged
