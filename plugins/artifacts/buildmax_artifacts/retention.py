"""Retention: artifacts older than the configured days are tombstoned
(pinned ones are kept), their quota given back; the collector then removes
bytes no live artifact references. Each server runs both periodically. A
member pins an artifact to keep it, or deletes it (a tombstone) sooner."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import sqlalchemy as sa
from buildmax_hookspecs import SYSTEM_ACTOR, Actor, App, BlobStoreUnavailable, Transaction

from buildmax.problems import NotFound
from buildmax.tables import spaces

from .diagnostics import SWEEP_FAILURES
from .gc import collect
from .quota import tombstoned
from .settings import artifact_settings
from .tables import artifacts

if TYPE_CHECKING:
    from buildmax.app import BuildMax

log = logging.getLogger("buildmax_artifacts.retention")

DAY_MS = 86_400_000


async def expire(app: App, retention_days: int | None = None) -> list[str]:
    """Tombstone unpinned artifacts older than the retention (the configured
    one unless given; 0 keeps everything); their public ids."""
    days = artifact_settings(app).retention_days if retention_days is None else retention_days
    if days <= 0:
        return []
    now = app.clock.now_ms()
    old = (
        sa.select(
            artifacts.c.id,
            artifacts.c.public_id,
            artifacts.c.size,
            spaces.c.public_id.label("space"),
        )
        .join(spaces, spaces.c.id == artifacts.c.space_id)
        .where(
            artifacts.c.deleted_at.is_(None),
            artifacts.c.pinned == 0,
            artifacts.c.created_at < now - days * DAY_MS,
        )
        .limit(500)
    )
    expired: list[str] = []
    done: set[str] = set()
    while True:
        async with app.db.write() as tx:
            rows = await tx.fetch_all(old)
            for row in rows:
                # The update decides: a row deleted, pinned or expired by
                # someone else meanwhile is left alone (and freed only once).
                changed = await tx.fetch_val(
                    sa.update(artifacts)
                    .where(
                        artifacts.c.id == row["id"],
                        artifacts.c.deleted_at.is_(None),
                        artifacts.c.pinned == 0,
                    )
                    .values(deleted_at=now)
                    .returning(artifacts.c.id)
                )
                if changed is None:
                    continue
                done.add(row["public_id"])
                await tombstoned(
                    app,
                    tx,
                    SYSTEM_ACTOR,
                    "artifact.expired",
                    row["space"],
                    row["public_id"],
                    row["size"],
                    details={"retention_days": days},
                )
        expired += [row["public_id"] for row in rows if row["public_id"] in done]
        if len(rows) < 500:
            return expired


async def maintain_forever(app: BuildMax) -> None:
    """Apply retention and collect garbage every ``sweep_interval_seconds``."""
    settings = artifact_settings(app)
    while True:
        await asyncio.sleep(settings.sweep_interval_seconds)
        await sweep(app)


async def sweep(app: BuildMax) -> None:
    """Apply retention and collect garbage once; a failure is logged and
    counted (``buildmax_artifact_sweep_failures``), and the next sweep
    tries again."""
    settings = artifact_settings(app)
    try:
        expired = await expire(app)
        report = await collect(app, grace_ms=settings.gc_grace_seconds * 1000)
        if expired or report.orphans or report.lost:
            log.info(
                "artifacts: %d expired, %d orphaned blob(s) removed, %d lost",
                len(expired),
                len(report.orphans),
                len(report.lost),
            )
    except Exception as exc:
        reason = "blob_store" if isinstance(exc, BlobStoreUnavailable) else "error"
        if app.metrics.enabled:
            app.metrics.counter(*SWEEP_FAILURES).labels(reason).inc()
        log.exception("artifacts maintenance failed")


async def tombstone_artifact(
    app: App,
    tx: Transaction,
    actor: Actor,
    principal_pk: int,
    space_pk: int,
    space_id: str,
    artifact_id: str,
    *,
    admin_override: bool,
) -> None:
    """Tombstone the space's live artifact ``artifact_id`` (404 when there
    is none), giving its quota back; its bytes go with the collector."""
    deleted = await tx.fetch_val(
        sa.update(artifacts)
        .where(
            artifacts.c.public_id == artifact_id,
            artifacts.c.space_id == space_pk,
            artifacts.c.deleted_at.is_(None),
        )
        .values(deleted_at=app.clock.now_ms(), deleted_by=principal_pk)
        .returning(artifacts.c.size)
    )
    if deleted is None:
        raise NotFound("no such artifact in this space")
    await tombstoned(
        app,
        tx,
        actor,
        "artifact.deleted",
        space_id,
        artifact_id,
        int(deleted),
        admin_override=admin_override,
    )


async def set_pinned(
    app: App,
    tx: Transaction,
    actor: Actor,
    space_pk: int,
    space_id: str,
    artifact_id: str,
    pinned: bool,
    *,
    admin_override: bool,
) -> None:
    """Pin the space's live artifact (retention keeps it) or unpin it;
    audited when it changes, nothing when it already is so."""
    changed = await tx.fetch_val(
        sa.update(artifacts)
        .where(
            artifacts.c.public_id == artifact_id,
            artifacts.c.space_id == space_pk,
            artifacts.c.deleted_at.is_(None),
            artifacts.c.pinned != int(pinned),
        )
        .values(pinned=int(pinned))
        .returning(artifacts.c.id)
    )
    if changed is not None:
        await app.audit.record(
            tx,
            actor,
            "artifact.pinned" if pinned else "artifact.unpinned",
            space_id=space_id,
            target_type="artifact",
            target_id=artifact_id,
            admin_override=admin_override,
        )
