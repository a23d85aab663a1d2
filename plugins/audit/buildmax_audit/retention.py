"""Retention: removing events older than the configured limit while every
chain stays verifiable.

A sweep removes, per chain, the longest prefix of events older than the
horizon (never an event at or after it). The hash of the last event removed
becomes the chain's anchor, where verification starts, and the sweep itself
is appended to the chain as ``audit.retention.applied``, naming the anchor.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import sqlalchemy as sa
from buildmax_hookspecs import SYSTEM_ACTOR, App

from .settings import audit_settings
from .tables import RETENTION_ACTION, SYSTEM_CHAIN, chains, events
from .verify import chain_heads

log = logging.getLogger("buildmax_audit.retention")

DAY_MS = 86_400_000


@dataclass(frozen=True)
class Swept:
    """What a sweep removed from one chain."""

    chain: str
    removed: int
    through_seq: int


async def sweep(app: App, retention_days: int | None = None) -> list[Swept]:
    """Apply retention once (the configured limit unless ``retention_days``
    is given; 0 keeps everything). What was removed, per chain."""
    days = audit_settings(app).retention_days if retention_days is None else retention_days
    if days <= 0:
        return []
    horizon = app.clock.now_ms() - days * DAY_MS
    swept = []
    for head in await chain_heads(app):
        result = await _sweep_chain(app, head["chain"], horizon, days)
        if result is not None:
            swept.append(result)
    return swept


async def _sweep_chain(app: App, chain: str, horizon: int, days: int) -> Swept | None:
    async with app.db.write() as tx:
        # Held to COMMIT: appends to this chain and a second sweeper wait.
        head = await tx.fetch_one(
            sa.select(chains).where(chains.c.chain == chain).with_for_update()
        )
        assert head is not None
        anchor_seq = head["anchor_seq"]
        kept = await tx.fetch_val(
            sa.select(sa.func.min(events.c.seq)).where(
                events.c.chain == chain, events.c.seq > anchor_seq, events.c.time >= horizon
            )
        )
        if kept is None:
            through = await tx.fetch_val(
                sa.select(sa.func.max(events.c.seq)).where(events.c.chain == chain)
            )
        else:
            through = int(kept) - 1
        if through is None or through <= anchor_seq:
            return None
        anchor_hash = await tx.fetch_val(
            sa.select(events.c.hash).where(events.c.chain == chain, events.c.seq == through)
        )
        if anchor_hash is None:
            raise RuntimeError(f"audit chain {chain!r} has no event {through}; run audit verify")
        await tx.execute(sa.delete(events).where(events.c.chain == chain, events.c.seq <= through))
        await tx.execute(
            sa.update(chains)
            .where(chains.c.chain == chain)
            .values(anchor_seq=through, anchor_hash=anchor_hash)
        )
        removed = through - anchor_seq
        await app.audit.record(
            tx,
            SYSTEM_ACTOR,
            RETENTION_ACTION,
            space_id=None if chain == SYSTEM_CHAIN else chain,
            target_type="audit_chain",
            target_id=chain,
            details={
                "removed": removed,
                "through_seq": through,
                "anchor_hash": anchor_hash,
                "retention_days": days,
            },
        )
    log.info("audit retention removed %d event(s) of chain %s", removed, chain)
    return Swept(chain, removed, through)


async def sweep_forever(app: App) -> None:
    """Sweep every ``sweep_interval_seconds`` while retention is set."""
    settings = audit_settings(app)
    if settings.retention_days <= 0:
        return
    while True:
        try:
            await sweep(app)
        except Exception:
            log.exception("audit retention sweep failed")
        await asyncio.sleep(settings.sweep_interval_seconds)
