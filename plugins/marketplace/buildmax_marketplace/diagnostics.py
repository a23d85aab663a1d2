"""Failed materializations: what a worker reports, and what an admin sees.

A run's packages are materialized on the worker (``buildmax run
materialize``), so the server learns of a failure only when the worker
reports it (``POST /v1/attempts/{a}/materialization-failures``, with the reason's
code from :data:`buildmax_marketplace.materialize.REASONS`). Each report is
a row of ``market_materialization_failures``, one count of
``buildmax_materializations_failed_total{reason}`` and, for a day, a
``materialization.failed`` item on the space's attention list.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa
from buildmax_hookspecs import AttemptRef, Attention, Transaction

from .materialize import REASONS
from .tables import materialization_failures as failures

if TYPE_CHECKING:
    from buildmax.app import BuildMax
    from buildmax.auth import Caller

#: How long a failure stays on the attention list.
RECENT_MS = 24 * 3600 * 1000
#: ``materialization.failed`` items listed at most (the oldest first).
MAX_ITEMS = 100
#: The counter of failed materializations, by reason.
FAILED = (
    "buildmax_materializations_failed",
    "Materializations a worker reported it could not finish, by reason",
    ("reason",),
)

_RECENT = sa.select(
    failures.c.attempt_id, failures.c.space_id, failures.c.reason, failures.c.created_at
).where(failures.c.created_at > sa.bindparam("since", type_=sa.BigInteger))


async def record_failure(
    app: BuildMax, tx: Transaction, caller: Caller, attempt: AttemptRef, space_pk: int, reason: str
) -> int:
    """In ``tx``: record that ``attempt`` could not be materialized, audit
    it, and count it once ``tx`` commits; when it was recorded."""
    now = app.clock.now_ms()
    await tx.execute(
        failures.insert().values(
            space_id=space_pk,
            attempt_id=attempt.id,
            reason=reason,
            reported_by=caller.principal_pk,
            created_at=now,
        )
    )
    await app.audit.record(
        tx,
        caller.actor,
        "run.materialization_failed",
        space_id=attempt.space_id,
        target_type="attempt",
        target_id=attempt.id,
        details={"reason": reason},
    )
    if app.metrics.enabled:
        counter = app.metrics.counter(*FAILED).labels(reason)
        tx.after_commit(counter.inc)
    return now


async def attention(
    app: BuildMax, conn: Transaction, now: int, space_pk: int | None
) -> list[Attention]:
    """``materialization.failed`` for each failure of the last day, at most
    :data:`MAX_ITEMS`, the oldest first.

    Space admins see them: they activate, suspend and move the pins a
    failed run names (a package that fails its digest or the reader again
    and again is fixed there, not by the worker)."""
    query = _RECENT
    if space_pk is not None:
        query = query.where(failures.c.space_id == space_pk)
    query = query.order_by(failures.c.created_at, failures.c.id).limit(MAX_ITEMS)
    return [
        Attention(
            "materialization.failed",
            f"attempt {row['attempt_id']} could not materialize its plugin packages: "
            f"{row['reason']} ({REASONS.get(row['reason'], 'unknown reason')})",
            int(row["created_at"]),
            int(row["space_id"]),
            role="admin",
            target=("attempt", row["attempt_id"]),
        )
        for row in await conn.fetch_all(query, {"since": now - RECENT_MS})
    ]
