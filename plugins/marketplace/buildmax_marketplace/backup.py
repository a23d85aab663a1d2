"""Release packages in a backup: every release's package is copied with the
database (a yanked one too: pins on it stay), and a restore that could not
put a package back yanks its release as lost, so nothing offers or pins a
package that is gone without saying so."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from buildmax_hookspecs import SYSTEM_ACTOR, BlobRef, Restoration, Transaction

from .catalog import RELEASE_SELECT, _audit
from .tables import plugins, releases

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
    """Re-apply what was taken away after the backup, then yank, as lost,
    every release whose package the restore lost."""
    return [*await _replay(app, tx, restoration), *await _yank_lost(app, tx, restoration)]


#: Catalog actions that took something away, and the columns they set.
_REPLAYED = {
    "catalog.release.yanked": "yanked",
    "catalog.release.ineligible": "no longer eligible",
}


async def _replay(app: BuildMax, tx: Transaction, restoration: Restoration) -> list[str]:
    """A release yanked, or no longer eligible, after the backup stays so:
    a restore must not make it pinnable again."""
    lines = []
    for event in restoration.replay:
        if event.action == "catalog.plugin.archived" and event.target_id is not None:
            lines.extend(await _archive_again(app, tx, event, restoration.now))
            continue
        if event.action not in _REPLAYED or event.target_id is None:
            continue
        version = str(event.details.get("version", ""))
        row = await tx.fetch_one(
            RELEASE_SELECT.where(plugins.c.name == event.target_id, releases.c.version == version)
        )
        if row is None:
            lines.append(f"marketplace: {event.target_id} {version} is not in the backup")
            continue
        if event.action == "catalog.release.yanked":
            reason = str(event.details.get("reason") or "yanked after the backup")
            values: dict[str, Any] = {"yanked_at": restoration.now, "yank_reason": reason}
            changed = row["yanked_at"] is None
        else:
            values = {"eligible_at": None, "eligible_by": None}
            changed = row["eligible_at"] is not None
            reason = None
        if not changed:
            continue
        await tx.execute(sa.update(releases).where(releases.c.id == row["id"]).values(**values))
        extra = {} if reason is None else {"reason": reason}
        await _audit(app, tx, SYSTEM_ACTOR, event.action, dict(row), **extra)
        lines.append(
            f"marketplace: {event.target_id} {version} {_REPLAYED[event.action]} again "
            "(it was after the backup)"
        )
    return lines


async def _archive_again(app: BuildMax, tx: Transaction, event: Any, now: int) -> list[str]:
    """A plugin archived after the backup stays archived (nothing more of it
    is published)."""
    reason = str(event.details.get("reason") or "archived after the backup")
    done = await tx.fetch_all(
        sa.update(plugins)
        .where(plugins.c.name == event.target_id, plugins.c.archived_at.is_(None))
        .values(archived_at=now, archive_reason=reason)
        .returning(plugins.c.id)
    )
    if not done:
        return []
    await app.audit.record(
        tx,
        SYSTEM_ACTOR,
        "catalog.plugin.archived",
        target_type="catalog_plugin",
        target_id=event.target_id,
        details={"reason": reason},
    )
    return [f"marketplace: plugin {event.target_id} archived again (it was after the backup)"]


async def _yank_lost(app: BuildMax, tx: Transaction, restoration: Restoration) -> list[str]:
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
