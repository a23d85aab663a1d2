"""``buildmax backup restore``: a backup back into service, in a new
authority epoch.

The target is an empty data directory (SQLite) or an empty database
(PostgreSQL) of the backup's engine; one that holds a BuildMax database is
refused, changing nothing, unless ``replace`` (SQLite: the old files are
moved aside, never deleted; PostgreSQL: refused while another session is
connected to it). The files are checked first (every digest); the database
is then put in place, migrated if the backup is older than this code,
checked against the manifest (row counts, audit heads, blob references),
its blobs put back into the blob store, and one write transaction opens the
new epoch:

- every token issued before (API tokens, sessions, attempt tokens) is
  revoked, unless ``keep_tokens`` keeps the unscoped API tokens;
- every space's event sequence jumps by :data:`EVENT_ID_STRIDE`, so an id
  handed out between the backup and the restore is never handed out again
  and a subscriber resuming from one receives every new event (on
  PostgreSQL, events committed just before the snapshot but numbered just
  after it are still in the restored outbox: they are numbered again past
  the jump, so such a subscriber may receive them twice, never lose them);
- every plugin brings its rows into the epoch (``buildmax_restored``): the
  tasks plugin ends active attempts (uncharged; the task is claimable again)
  and raises generations by :data:`GENERATION_STRIDE`; the artifacts and
  marketplace plugins tombstone what lost its blob;
- a fresh token is issued to an enabled admin (printed once), and
  ``system.restored`` is audited with the manifest's sha256.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from buildmax_hookspecs import SYSTEM_ACTOR, AuditEvent, BlobNotFound, Restoration

from ..app import blob_store
from ..clock import SystemClock
from ..migrations import migrate
from ..principals import create_principal
from ..restore_marker import unmark_statement
from ..tables import backup_runs, principals, spaces, tokens
from ..tokens import IssuedToken, issue_token
from . import pg_tools
from .layout import BLOB_LIST, BackupError, Progress, backup_name, blob_path, iter_file, quiet
from .manifest import Manifest, listed_blobs
from .placement import (
    open_restored,
    place_database,
    prepare_target,
    put_back,
    staged,
    undo_placement,
    unstage,
)
from .replay import replay_kernel
from .verify import check_references, check_restored, check_schema, manifest_digest, verify_files

if TYPE_CHECKING:
    from ..app import BuildMax
    from ..config import Config

#: How far every space's event sequence jumps at a restore: far past any
#: number of events a space could have had between a backup and its restore.
EVENT_ID_STRIDE = 2**32
#: How far every task's generation jumps (generations are 32-bit): past
#: any number of claims of one task between a backup and its restore.
GENERATION_STRIDE = 2**20


@dataclass
class RestoreReport:
    """What a restore did, for the operator."""

    manifest_sha256: str
    admin_name: str = ""
    admin_token: IssuedToken | None = None
    blobs_restored: int = 0
    blobs_present: int = 0
    lost_blobs: list[str] = field(default_factory=list)
    revoked_tokens: int = 0
    migrated: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    set_aside: list[str] = field(default_factory=list)


# -- blobs ------------------------------------------------------------------------------


async def _lost_blobs(app: BuildMax, manifest: Manifest) -> list[str]:
    """The keys the backup could not hold (its store had lost them) that the
    target's store does not hold either: every other listed blob is in the
    backup's pool, checked by :func:`verify_files`."""
    store = blob_store(app)
    return [key for key in manifest.missing_blobs if await store.head(key) is None]


async def _intact_in_store(store: Any, key: str, sha256: str) -> bool:
    """Whether the store holds ``key`` with exactly the bytes of ``sha256``."""
    if await store.head(key) is None:
        return False
    digest = hashlib.sha256()
    try:
        async for chunk in store.open(key):
            digest.update(chunk)
    except BlobNotFound:
        return False
    return digest.hexdigest() == sha256


async def _restore_blobs(
    app: BuildMax, folder: Path, manifest: Manifest, report: RestoreReport, progress: Progress
) -> None:
    """Put every blob of the backup the store lacks (or holds damaged) back."""
    store = blob_store(app)
    missing = set(manifest.missing_blobs)
    done = 0
    for blob in listed_blobs(folder / BLOB_LIST):
        done += blob.size
        progress("blobs", done, manifest.blob_bytes)
        if blob.key in missing:
            continue
        if await _intact_in_store(store, blob.key, blob.sha256):
            report.blobs_present += 1
            continue
        prefix = blob.key.rsplit("/sha256/", 1)[0]
        path = blob_path(folder.parent, blob.sha256)
        await store.put(prefix, _file_stream(path), expected_sha256=blob.sha256)
        report.blobs_restored += 1


async def _file_stream(path: Path) -> Any:
    """A file's bytes as an async stream, one chunk read at a time."""
    chunks = iter_file(path)
    while True:
        chunk = await asyncio.to_thread(next, chunks, None)
        if chunk is None:
            return
        yield chunk


# -- the epoch --------------------------------------------------------------------------


async def _restore_admin(tx: Any, now: int) -> tuple[str, int]:
    """The enabled admin who gets the fresh token (the oldest human one),
    created as ``admin`` when the backup has none."""
    row = await tx.fetch_one(
        sa.select(principals.c.id, principals.c.name)
        .where(principals.c.system_role == "admin", principals.c.disabled_at.is_(None))
        .order_by((principals.c.kind != "human"), principals.c.id)
        .limit(1)
    )
    if row is not None:
        return row["name"], int(row["id"])
    created = await create_principal(
        tx, kind="human", name="admin", display_name="Administrator", system_role="admin", now=now
    )
    return "admin", int(created["id"])


async def enter_epoch(
    app: BuildMax,
    folder: Path,
    manifest: Manifest,
    digest: str,
    lost: list[str],
    *,
    keep_tokens: bool,
    replay: Sequence[AuditEvent] = (),
) -> tuple[IssuedToken, str, int, list[str]]:
    """The restore's one write transaction (see the module docstring)."""
    async with app.db.write() as tx:
        now = app.clock.now_ms()
        await tx.execute(unmark_statement())
        # The run that took this backup was still running in its snapshot.
        await tx.execute(
            sa.update(backup_runs)
            .where(backup_runs.c.state == "running", backup_runs.c.path == str(folder))
            .values(
                state="succeeded", finished_at=now, lease_expires_at=now, manifest_sha256=digest
            )
        )
        await tx.execute(
            sa.update(backup_runs)
            .where(backup_runs.c.state == "running")
            .values(
                state="failed",
                finished_at=now,
                lease_expires_at=now,
                error="cut off: the database was restored from a backup taken while it ran",
            )
        )
        revoke = sa.update(tokens).where(tokens.c.revoked_at.is_(None)).values(revoked_at=now)
        if keep_tokens:
            revoke = revoke.where((tokens.c.origin != "api") | tokens.c.scope_type.is_not(None))
        revoked = len(await tx.fetch_all(revoke.returning(tokens.c.id)))
        await tx.execute(
            sa.update(spaces).values(
                event_seq=spaces.c.event_seq + sa.literal(EVENT_ID_STRIDE, sa.BigInteger)
            )
        )
        lines = await replay_kernel(app, tx, replay, now)
        lines += await app.hooks.restored(
            tx,
            Restoration(
                manifest_sha256=digest,
                now=now,
                lost_blobs=frozenset(lost),
                keep_tokens=keep_tokens,
                generation_stride=GENERATION_STRIDE,
                replay=tuple(replay),
            ),
        )
        admin_name, admin_pk = await _restore_admin(tx, now)
        issued = await issue_token(tx, principal_pk=admin_pk, now=now, name="restore")
        admin_id = await tx.fetch_val(
            sa.select(principals.c.public_id).where(principals.c.id == admin_pk)
        )
        await app.audit.record(
            tx,
            SYSTEM_ACTOR,
            "token.created",
            target_type="token",
            target_id=issued.public_id,
            details={"principal_id": admin_id, "name": "restore"},
        )
        await app.audit.record(
            tx,
            SYSTEM_ACTOR,
            "system.restored",
            details={
                "manifest_sha256": digest,
                "backup_created_at": manifest.created_at,
                "revoked_tokens": revoked,
                "kept_api_tokens": keep_tokens,
                "lost_blobs": len(lost),
                "event_id_stride": EVENT_ID_STRIDE,
                "generation_stride": GENERATION_STRIDE,
                "replayed_events": len(replay),
            },
        )
    return issued, admin_name, revoked, lines


# -- the whole restore ------------------------------------------------------------------


async def restore_backup(
    settings: Config,
    folder: Path,
    *,
    replace: bool = False,
    keep_tokens: bool = False,
    progress: Progress = quiet,
    audit_export: str | None = None,
    extra_plugins: Iterable[tuple[str, object]] = (),
) -> RestoreReport:
    """Restore the backup in ``folder`` (an absolute path) into the target
    ``settings`` name."""
    from ..app import close_blob_store, create_app

    manifest = await asyncio.to_thread(verify_files, folder, progress=progress)
    digest = manifest_digest(folder)
    if manifest.engine != settings.engine:
        raise BackupError(
            f"the backup is of a {manifest.engine} database and the target is {settings.engine}: "
            "restore into the same engine (moving between engines is not supported)"
        )
    code = create_app(settings, extra_plugins=extra_plugins)
    try:
        check_schema(manifest, code.migrations())
        replay: list[AuditEvent] = []
        if audit_export is not None:
            try:
                replay = code.hooks.restore_replay(audit_export, manifest.plugin_facts)
            except ValueError as exc:
                raise BackupError(str(exc)) from None
    finally:
        await close_blob_store(code)
    if settings.engine == "postgresql":
        pg_tools.find_tool("pg_restore", settings.pg_bin_dir)
    moved = await prepare_target(
        settings, replace=replace, stamp=backup_name(SystemClock().now_ms())
    )
    # SQLite is restored under a name no server opens, renamed into place
    # only once the epoch is in it and its blobs are back.
    staging = staged(settings)
    progress("database", 0, 0)
    try:
        await place_database(staging, folder, manifest)
        app = await open_restored(staging, extra_plugins)
        try:
            await check_restored(app, manifest)
            await check_references(app, folder, manifest)
            migrated = await migrate(app.db, app.migrations(), app.clock)
            report = RestoreReport(
                digest,
                set_aside=moved.describe(),
                migrated=[f"{m.plugin} {m.version}" for m in migrated],
                lost_blobs=await _lost_blobs(app, manifest),
            )
            # The epoch first: once it commits no credential from before works,
            # even if the restore stops while the blobs are copied.
            issued, admin_name, revoked, lines = await enter_epoch(
                app,
                folder,
                manifest,
                digest,
                report.lost_blobs,
                keep_tokens=keep_tokens,
                replay=replay,
            )
            await _restore_blobs(app, folder, manifest, report, progress)
        finally:
            await close_blob_store(app)
            await app.db.close()
        await unstage(staging, settings)
    except BaseException:
        # Nothing half-restored is left to be served (old credentials valid in
        # it): the target is emptied again and what was moved aside comes back.
        await asyncio.shield(undo_placement(staging))
        await asyncio.shield(put_back(settings, moved))
        raise
    report.admin_token, report.admin_name = issued, admin_name
    report.revoked_tokens = revoked
    report.lines = lines
    return report
