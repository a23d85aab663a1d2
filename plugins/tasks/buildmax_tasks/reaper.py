"""The reaper: expires attempts whose lease lapsed, in small batches.

Claims retire a lapsed attempt themselves, so correctness never waits for
the reaper; it keeps the queue and the reservations tidy between claims.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from buildmax_hookspecs import SYSTEM_ACTOR

from .change import Change
from .lifecycle import retire_lapsed
from .records import ATTEMPT_SELECT, load_task_by_pk
from .rows import AttemptRow
from .tables import attempts

if TYPE_CHECKING:
    from buildmax.app import BuildMax

log = logging.getLogger("buildmax.tasks.reaper")
BATCH = 50


async def reap(app: BuildMax) -> int:
    """Expire every attempt whose lease has lapsed; how many."""
    total = 0
    while True:
        async with app.db.write() as tx:
            now = app.clock.now_ms()
            rows = await tx.fetch_all(
                ATTEMPT_SELECT.where(
                    attempts.c.state == "active", attempts.c.lease_expires_at <= now
                )
                .order_by(attempts.c.lease_expires_at)
                .limit(BATCH)
            )
            for attempt in map(AttemptRow.of, rows):
                ch = Change(app, tx, SYSTEM_ACTOR, attempt.space_pk, attempt.space_id, now)
                task = await load_task_by_pk(tx, attempt.task_pk, for_update=True)
                await retire_lapsed(ch, attempt, task)
        total += len(rows)
        if len(rows) < BATCH:
            return total


async def reap_forever(app: BuildMax, interval: float) -> None:
    """Run :func:`reap` every ``interval`` seconds until cancelled."""
    while True:
        await asyncio.sleep(interval)
        try:
            await reap(app)
        except Exception:
            log.exception("reaping lapsed attempts failed")
