"""The record of each backup run (``backup_runs``), read for its freshness
by :func:`buildmax.diagnostics.last_runs`, and while it runs a lease under
which no collector deletes a blob (a blob the backup's snapshot names may
be deleted from the database after the snapshot, and must still be there
when the backup copies it)."""

from __future__ import annotations

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
