"""Release packages in a backup: every release's package is copied with the
database (a yanked one too: pins on it stay), and a restore that could not
put a package back yanks its release as lost, so nothing offers or pins a
package that is gone without saying so."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import sqlalchemy as sa
from buildmax_hookspecs import SYSTEM_ACTOR, BlobRef, Restoration, Transaction

from .catalog import RELEASE_SELECT, _audit
from .tables import releases

if TYPE_CHECKING:
    from buildmax.app import BuildMax

LOST_REASON = "its package was lost: the backup it was restored from did not hold it"


async def release_blobs(conn: Transaction) -> AsyncIterator[BlobRef]:
    """The package of every release."""
    rows = await conn.fetch_all(
        sa.select(releases.c.blob_key, releases.c.size, releases.c.sha256).order_by(releases.c.id)
    )
    for row in rows:
        yield BlobRef(row["blob_key"], int(row["size"]), row["sha256"])


async def restored(app: BuildMax, tx: Transaction, restoration: Restoration) -> list[str]:
    """Yank, as lost, every release whose package the restore lost."""
    if not restoration.lost_blobs:
        return []
    rows = await tx.fetch_all(
        RELEASE_SELECT.where(releases.c.blob_key.in_(sorted(restoration.lost_blobs)))
    )
    lost = []
    for row in map(dict, rows):
        await tx.execute(
            sa.update(releases)
            .where(releases.c.id == row["id"])
            .values(
                yanked_at=sa.func.coalesce(releases.c.yanked_at, restoration.now),
                yank_reason=sa.func.coalesce(releases.c.yank_reason, LOST_REASON),
            )
        )
        await _audit(app, tx, SYSTEM_ACTOR, "catalog.release.lost", row, reason=LOST_REASON)
        lost.append(f"{row['name']} {row['version']}")
    if not lost:
        return []
    return [f"marketplace: {len(lost)} release(s) yanked, their package lost: {', '.join(lost)}"]
