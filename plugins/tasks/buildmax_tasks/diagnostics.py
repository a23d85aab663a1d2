"""What an operator watches of the work queue: gauges, attention, counters.

The gauges and the attention list are read when someone looks (a scrape of
``/metrics``, ``GET /v1/diagnostics``, a space's attention page), each from
a few aggregate queries on the partial indexes the queue already keeps
(``task_tasks_ready``, ``task_attempts_lease``, ``task_decisions_pending``).
The counters are kept in the process: a claim or a recovery adds one after
its transaction commits, and adds no statement to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import sqlalchemy as sa
from buildmax_hookspecs import Attention, Gauge, Transaction

from buildmax.diagnostics import MAX_SPACES, OTHER_SPACES, per_space_gauges

from .holds import literal
from .tables import attempts, decisions, holds, tasks

if TYPE_CHECKING:
    from buildmax.app import BuildMax

#: Attention items of one kind, at most (the oldest first).
MAX_ITEMS = 100


@dataclass(frozen=True)
class Count:
    """An in-process counter of events (claims, recoveries)."""

    name: str
    help: str

    def after_commit(self, app: BuildMax, tx: Transaction) -> None:
        """Add one once ``tx`` commits (nothing when it rolls back)."""
        if app.metrics.enabled:
            tx.after_commit(app.metrics.counter(self.name, self.help).inc)


CLAIMS = Count("buildmax_claims", "Claims that made a new attempt (claim-next and claim by id)")
LEASES_RECOVERED = Count(
    "buildmax_leases_recovered",
    "Attempts whose lease lapsed, retired (by the reaper, or by a claim that found them)",
)


# -- gauges ---------------------------------------------------------------------------------------

_lapsed = attempts.c.lease_expires_at <= sa.bindparam("now", type_=sa.BigInteger)
#: Active attempts, and those of them whose lease ran out (both read the
#: partial index ``task_attempts_lease``).
_LEASES = sa.select(
    sa.func.count().label("active"),
    sa.func.count().filter(_lapsed).label("lapsed"),
).where(attempts.c.state == literal("active"))

#: A live hold covering the task: on its space, its project or itself.
_HELD = sa.exists(
    sa.select(holds.c.id).where(
        holds.c.space_id == tasks.c.space_id,
        holds.c.lifted_at.is_(None),
        sa.or_(
            holds.c.scope_type == literal("space"),
            sa.and_(
                holds.c.scope_type == literal("project"), holds.c.scope_pk == tasks.c.project_id
            ),
            sa.and_(holds.c.scope_type == literal("task"), holds.c.scope_pk == tasks.c.id),
        ),
    )
)
#: A decision that is pending now (not answered, not expired).
_OPEN_DECISION = sa.and_(
    decisions.c.state == literal("pending"),
    sa.or_(
        decisions.c.expires_at.is_(None),
        decisions.c.expires_at > sa.bindparam("now", type_=sa.BigInteger),
    ),
)
_PARKED = sa.exists(
    sa.select(decisions.c.id).where(decisions.c.task_id == tasks.c.id, _OPEN_DECISION)
)
#: The ready queue's depth per space: what ``GET /v1/spaces/{s}/ready``
#: lists (ready, neither held nor parked), every space at once.
_READY_BY_SPACE = (
    sa.select(tasks.c.space_id, sa.func.count().label("n"))
    .where(tasks.c.state == literal("ready"), ~_HELD, ~_PARKED)
    .group_by(tasks.c.space_id)
)
_PENDING_DECISIONS = sa.select(sa.func.count()).select_from(decisions).where(_OPEN_DECISION)


async def gauges(app: BuildMax, conn: Transaction) -> list[Gauge]:
    """Leases by state, the ready queue's depth per space (the
    :data:`MAX_SPACES` deepest queues by slug, the rest summed under
    ``(other)``) and the decisions waiting for an answer."""
    now = app.clock.now_ms()
    leases = await conn.fetch_one(_LEASES, {"now": now})
    assert leases is not None
    lapsed = int(leases["lapsed"])
    found = [
        Gauge(
            "buildmax_leases",
            "Active attempts by lease state: active (lease running) or lapsed (ran out, "
            "not yet retired)",
            value,
            (("state", state),),
        )
        for state, value in (("active", int(leases["active"]) - lapsed), ("lapsed", lapsed))
    ]
    depth = {
        int(r["space_id"]): int(r["n"]) for r in await conn.fetch_all(_READY_BY_SPACE, {"now": now})
    }
    found += await per_space_gauges(
        conn,
        "buildmax_ready_tasks",
        f"Claimable tasks per space (the {MAX_SPACES} deepest queues; the rest as {OTHER_SPACES})",
        depth,
    )
    pending = await conn.fetch_val(_PENDING_DECISIONS, {"now": now})
    found.append(
        Gauge("buildmax_decisions_pending", "Decisions waiting for an answer", int(pending or 0))
    )
    return found


# -- attention ------------------------------------------------------------------------------------

_LAPSED_ATTEMPTS = (
    sa.select(
        attempts.c.public_id,
        attempts.c.space_id,
        attempts.c.generation,
        attempts.c.lease_expires_at,
        tasks.c.public_id.label("task_id"),
    )
    .join(tasks, tasks.c.id == attempts.c.task_id)
    .where(attempts.c.state == literal("active"), _lapsed)
    .order_by(attempts.c.lease_expires_at, attempts.c.id)
)
_WAITING_DECISIONS = (
    sa.select(
        decisions.c.public_id,
        decisions.c.space_id,
        decisions.c.answerable_by,
        decisions.c.created_at,
        tasks.c.public_id.label("task_id"),
    )
    .join(tasks, tasks.c.id == decisions.c.task_id)
    .where(_OPEN_DECISION)
    .order_by(decisions.c.created_at, decisions.c.id)
)


async def attention(
    app: BuildMax, conn: Transaction, now: int, space_pk: int | None
) -> list[Attention]:
    """Leases that lapsed and wait for recovery, and decisions nobody has
    answered: at most :data:`MAX_ITEMS` of each, the oldest first.

    Both are shown to members: a member's claim recovers a lapsed attempt
    (and its claimant renews or resubmits), and only members may answer a
    decision (human members, unless it was opened for any member), so a
    viewer could act on neither."""
    lapsed_query = _LAPSED_ATTEMPTS.limit(MAX_ITEMS)
    decision_query = _WAITING_DECISIONS.limit(MAX_ITEMS)
    if space_pk is not None:
        lapsed_query = lapsed_query.where(attempts.c.space_id == space_pk)
        decision_query = decision_query.where(decisions.c.space_id == space_pk)
    items = [
        Attention(
            "lease.lapsed",
            f"attempt {row['public_id']} (generation {row['generation']}) of task "
            f"{row['task_id']} lost its lease; the reaper or the next claim recovers it",
            int(row["lease_expires_at"]),
            int(row["space_id"]),
            role="member",
            target=("attempt", row["public_id"]),
        )
        for row in await conn.fetch_all(lapsed_query, {"now": now})
    ]
    items += [
        Attention(
            "decision.pending",
            f"decision {row['public_id']} on task {row['task_id']} waits for an answer "
            f"from {'a human member' if row['answerable_by'] == 'human' else 'a member'}",
            int(row["created_at"]),
            int(row["space_id"]),
            role="member",
            target=("decision", row["public_id"]),
        )
        for row in await conn.fetch_all(decision_query, {"now": now})
    ]
    return items
