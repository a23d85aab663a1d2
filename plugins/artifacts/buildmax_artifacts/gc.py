"""Reconciling the blob store with the database (``buildmax artifacts gc``).

Only keys under this plugin's own prefix are looked at (other plugins keep
their blobs under theirs). A blob no live artifact references is an orphan
(an upload whose row never committed, or the bytes of deleted artifacts);
it is removed once it is older than the grace period, so an upload in
flight is never swept. A live artifact whose bytes are gone is tombstoned as
lost. A reservation older than the grace period (its server died mid-upload)
is released, and the store's temporary bytes older than it (puts a dead
server cut off) are removed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import sqlalchemy as sa
from buildmax_hookspecs import SYSTEM_ACTOR, App, BlobStore, Transaction

from buildmax.app import blob_store
from buildmax.backups.runs import backup_running
from buildmax.tables import spaces

from .quota import Reservation, settle, tombstoned
from .settings import artifact_settings
from .tables import artifacts, quotas, uploads

#: The blob store's key prefix of this plugin (other plugins keep their own):
#: an artifact's bytes are under ``artifacts/space/<space id>/``.
KEY_PREFIX = "artifacts"


@dataclass
class GcReport:
    """What a collection found (and, unless a dry run, did)."""

    dry_run: bool
    blobs_seen: int = 0
    orphans: list[str] = field(default_factory=list)
    young_orphans: int = 0
    lost: list[str] = field(default_factory=list)
    stale_uploads: int = 0
    #: Temporary bytes of puts a dead server cut off (not looked at in a dry run).
    temporary_removed: int = 0


async def collect(
    app: App,
    *,
    grace_ms: int,
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
) -> GcReport:
    """Reconcile once; ``progress(n)`` is called for every blob looked at."""
    report = GcReport(dry_run)
    store = blob_store(app)
    now = app.clock.now_ms()
    async with app.db.read() as conn:
        live = {
            row["blob_key"]
            for row in await conn.fetch_all(
                sa.select(artifacts.c.blob_key).where(artifacts.c.deleted_at.is_(None)).distinct()
            )
        }
    async for ref in store.list(KEY_PREFIX + "/"):
        report.blobs_seen += 1
        if progress is not None:
            progress(1)
        if ref.key in live:
            continue
        if ref.modified_at is None or now - ref.modified_at < grace_ms:
            report.young_orphans += 1
            continue
        if dry_run or await _delete_orphan(app, store, ref.key, now - grace_ms):
            report.orphans.append(ref.key)
        else:
            report.young_orphans += 1
    for key in sorted(live):
        if await store.head(key) is None:
            report.lost.extend(await _tombstone_lost(app, key, now, dry_run))
    report.stale_uploads = await _release_stale(app, now - grace_ms, dry_run)
    if not dry_run:
        report.temporary_removed = await store.sweep_temporary(now - grace_ms)
    return report


_SPACE_OF_KEY = re.compile(rf"^{KEY_PREFIX}/space/([^/]+)/sha256/[0-9a-f]{{64}}$")


async def _delete_orphan(app: App, store: BlobStore, key: str, older_than: int) -> bool:
    """Delete an orphan unless an upload could be about to use it, or a
    backup is running (it may be copying the bytes of a row deleted since
    its snapshot).

    The space's quota row is locked first, as every reservation locks it, so
    no upload of the space starts meanwhile; an upload already in flight
    there (it may be writing these very bytes again), a live row naming the
    key, or a blob written within the grace period keep it."""
    match = _SPACE_OF_KEY.match(key)
    if match is None:
        return False  # not an artifact blob's key: not ours to judge
    space_id = match.group(1)
    async with app.db.write() as tx:
        await tx.execute(
            sa.update(quotas)
            .where(quotas.c.scope == f"space:{space_id}")
            .values(reserved=quotas.c.reserved)
        )
        busy = await tx.fetch_val(
            sa.select(
                sa.exists()
                .where(uploads.c.space_id == spaces.c.id, spaces.c.public_id == space_id)
                .correlate(None)
                | sa.exists().where(artifacts.c.blob_key == key, artifacts.c.deleted_at.is_(None))
            )
        )
        if await backup_running(tx, app.clock.now_ms()):
            return False  # a backup may be copying these very bytes
        ref = await store.head(key)
        if busy or ref is None or ref.modified_at is None or ref.modified_at >= older_than:
            return False
        await app.audit.record(
            tx,
            SYSTEM_ACTOR,
            "artifact.blob_collected",
            space_id=space_id,
            details={"sha256": ref.sha256, "size": ref.size},
        )
        # Deleted last: a failure rolls the event back with the blob still there.
        return await store.delete(key)


async def _tombstone_lost(app: App, key: str, now: int, dry_run: bool) -> list[str]:
    if dry_run:
        select = sa.select(artifacts.c.public_id).where(
            artifacts.c.blob_key == key, artifacts.c.deleted_at.is_(None)
        )
        async with app.db.read() as conn:
            return [row["public_id"] for row in await conn.fetch_all(select)]
    async with app.db.write() as tx:
        return await tombstone_lost(app, tx, key, now)


async def tombstone_lost(app: App, tx: Transaction, key: str, now: int) -> list[str]:
    """In ``tx``: tombstone as lost every live artifact whose bytes, under
    ``key``, are gone (audited, quota given back); their public ids."""
    # The update decides which rows this run tombstones (a row deleted
    # meanwhile is not freed twice).
    rows = await tx.fetch_all(
        sa.update(artifacts)
        .where(artifacts.c.blob_key == key, artifacts.c.deleted_at.is_(None))
        .values(deleted_at=now, lost_at=now)
        .returning(
            artifacts.c.public_id,
            artifacts.c.size,
            sa.select(spaces.c.public_id)
            .where(spaces.c.id == artifacts.c.space_id)
            .scalar_subquery()
            .label("space"),
        )
    )
    for row in rows:
        await tombstoned(
            app, tx, SYSTEM_ACTOR, "artifact.lost", row["space"], row["public_id"], row["size"]
        )
    return [row["public_id"] for row in rows]


async def _release_stale(app: App, older_than: int, dry_run: bool) -> int:
    select = (
        sa.select(uploads, spaces.c.public_id.label("space"))
        .join(spaces, spaces.c.id == uploads.c.space_id)
        .where(uploads.c.created_at < older_than)
    )
    async with app.db.read() as conn:
        stale = [dict(row) for row in await conn.fetch_all(select)]
    settings = artifact_settings(app)
    if not dry_run:
        for row in stale:
            async with app.db.write() as tx:
                reservation = Reservation(
                    row["public_id"], row["space_id"], row["space"], row["bytes"]
                )
                await settle(tx, reservation, 0, settings)
    return len(stale)
