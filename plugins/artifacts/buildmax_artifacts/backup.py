"""Artifacts in a backup: their blobs are copied with the database, and a
restore tombstones as lost every artifact whose blob it could not put back."""

from __future__ import annotations

from collections.abc import AsyncIterator

import sqlalchemy as sa
from buildmax_hookspecs import App, BlobRef, Restoration, Transaction

from .gc import tombstone_lost
from .tables import artifacts

#: Rows read per query while listing the blobs.
BATCH = 1000


async def live_blobs(conn: Transaction) -> AsyncIterator[BlobRef]:
    """The blob of every artifact that is not tombstoned, in key order."""
    after = ""
    while True:
        rows = await conn.fetch_all(
            sa.select(
                artifacts.c.blob_key,
                sa.func.max(artifacts.c.size).label("size"),
                sa.func.max(artifacts.c.sha256).label("sha256"),
            )
            .where(artifacts.c.deleted_at.is_(None), artifacts.c.blob_key > after)
            .group_by(artifacts.c.blob_key)
            .order_by(artifacts.c.blob_key)
            .limit(BATCH)
        )
        for row in rows:
            yield BlobRef(row["blob_key"], int(row["size"]), row["sha256"])
        if len(rows) < BATCH:
            return
        after = rows[-1]["blob_key"]


async def restored(app: App, tx: Transaction, restoration: Restoration) -> list[str]:
    """Tombstone every live artifact whose blob the restore lost."""
    lost: list[str] = []
    for key in sorted(restoration.lost_blobs):
        lost.extend(await tombstone_lost(app, tx, key, restoration.now))
    if not lost:
        return []
    return [f"artifacts: {len(lost)} artifact(s) tombstoned as lost: {', '.join(lost)}"]
