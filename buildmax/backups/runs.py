"""The record of each backup run (``backup_runs``): its freshness, for
diagnostics, and while it runs a lease under which no collector deletes a
blob (a blob the backup's snapshot names may be deleted from the database
after the snapshot, and must still be there when the backup copies it)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import App, Transaction

from ..tables import backup_runs

#: How long a run's lease lasts unless renewed; it is renewed while copying.
LEASE_MS = 120_000
#: A running backup renews its lease once this much of it has passed.
RENEW_AFTER_MS = 20_000
#: Longest error text kept.
_ERROR_CHARS = 2000


async def start_run(app: App, path: str) -> int:
    """Record a backup starting now; its key. A run still marked running
    whose lease lapsed (its process was killed) is recorded as failed."""
    now = app.clock.now_ms()
    async with app.db.write() as tx:
        await tx.execute(
            sa.update(backup_runs)
            .where(backup_runs.c.state == "running", backup_runs.c.lease_expires_at <= now)
            .values(
                state="failed",
                finished_at=backup_runs.c.lease_expires_at,
                error="interrupted: its process ended before the backup was complete",
            )
        )
        row = await tx.fetch_one(
            backup_runs.insert()
            .values(started_at=now, lease_expires_at=now + LEASE_MS, state="running", path=path)
            .returning(backup_runs.c.id)
        )
    assert row is not None
    return int(row["id"])


async def renew_run(app: App, run_pk: int) -> None:
    """Extend a running backup's lease."""
    async with app.db.write() as tx:
        await tx.execute(
            sa.update(backup_runs)
            .where(backup_runs.c.id == run_pk)
            .values(lease_expires_at=app.clock.now_ms() + LEASE_MS)
        )


async def finish_run(
    app: App,
    run_pk: int,
    *,
    ok: bool,
    manifest_sha256: str | None = None,
    size: int | None = None,
    error: str | None = None,
) -> None:
    """Record how a backup ended; its lease ends with it."""
    now = app.clock.now_ms()
    async with app.db.write() as tx:
        await tx.execute(
            sa.update(backup_runs)
            .where(backup_runs.c.id == run_pk)
            .values(
                state="succeeded" if ok else "failed",
                finished_at=now,
                lease_expires_at=now,
                manifest_sha256=manifest_sha256,
                bytes=size,
                error=None if error is None else error[:_ERROR_CHARS],
            )
        )


async def backup_running(conn: Transaction, now: int) -> bool:
    """Whether a backup holds its lease now: a collector keeps every blob."""
    return bool(
        await conn.fetch_val(
            sa.select(
                sa.exists().where(
                    backup_runs.c.state == "running", backup_runs.c.lease_expires_at > now
                )
            )
        )
    )


async def last_runs(conn: Transaction) -> dict[str, Any]:
    """The newest backup run and the newest that succeeded (``None`` when
    there is none), as rows: what diagnostics show of backup freshness."""
    newest = await conn.fetch_one(
        sa.select(backup_runs).order_by(backup_runs.c.started_at.desc()).limit(1)
    )
    succeeded = await conn.fetch_one(
        sa.select(backup_runs)
        .where(backup_runs.c.state == "succeeded")
        .order_by(backup_runs.c.started_at.desc())
        .limit(1)
    )
    return {
        "last": None if newest is None else dict(newest),
        "last_succeeded": None if succeeded is None else dict(succeeded),
    }
