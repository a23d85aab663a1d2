"""``buildmax backup create``: the database and its blobs as one pair, taken
while the server runs.

One snapshot of the database is held just long enough to read, in it, the
migrations, the row counts, every plugin's facts (the audit heads) and the
blobs its rows reference, and to copy it (SQLite's online backup) or dump
it (``pg_dump --snapshot``, the very snapshot that was read). Writes go on
meanwhile: SQLite's readers never block its writer, and on PostgreSQL the
snapshot is a ``REPEATABLE READ`` transaction. Then the snapshot is let go
and the blobs are copied from the blob store into the target's shared pool;
a run lease (``backup_runs``) keeps every collector from deleting a blob
until the copy is done. The backup is written under a ``.partial-`` name,
checked, and renamed into place; a failure removes it, so nothing that is
not a whole backup ever looks like one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import shutil
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from buildmax_hookspecs import BlobNotFound

from ..app import blob_store
from ..database.base import Snapshot
from ..tables import schema_migrations
from . import pg_tools
from .layout import (
    BLOB_LIST,
    MANIFEST,
    PARTIAL_PREFIX,
    POSTGRES_DUMP,
    SQLITE_DUMP,
    BackupError,
    PrivateFile,
    Progress,
    backup_name,
    backups_in,
    blob_path,
    file_sha256,
    fsync_dir,
    private_dir,
    quiet,
    target_lock,
)
from .manifest import ListedBlob, Manifest, Part, blob_line, listed_blobs
from .placement import row_counts
from .runs import RENEW_AFTER_MS, finish_run, renew_run, start_run
from .verify import verify_files

if TYPE_CHECKING:
    from ..app import BuildMax

log = logging.getLogger("buildmax.backups")


@dataclass(frozen=True)
class CreatedBackup:
    """A finished backup: where, its manifest and the manifest's sha256."""

    path: Path
    manifest: Manifest
    manifest_sha256: str
    #: Blobs copied by this run (the others were in the pool already).
    blobs_copied: int
    removed: list[Path]


def _versions(app: BuildMax) -> dict[str, str]:
    found = {}
    try:
        found["buildmax"] = version("buildmax")
    except PackageNotFoundError:
        found["buildmax"] = "unknown"
    for info in app.plugins.infos():
        if info.loaded and info.version:
            found[info.name] = info.version
    return found


async def _read_snapshot(
    app: BuildMax, snap: Snapshot, folder: Path, progress: Progress
) -> tuple[dict[str, Any], list[str]]:
    """Read the manifest's facts in the snapshot and write the blob list;
    the facts and the keys listed, deduplicated."""
    conn = snap.conn
    migrations: dict[str, int] = {}
    for row in await conn.fetch_all(
        sa.select(schema_migrations.c.plugin, schema_migrations.c.version)
    ):
        migrations[row["plugin"]] = max(migrations.get(row["plugin"], 0), int(row["version"]))
    facts = {
        "migrations": migrations,
        "row_counts": await row_counts(conn, app.db.dialect),
        "facts": {k: dict(v) for k, v in (await app.hooks.backup_facts(conn)).items()},
    }
    listing = PrivateFile(folder / BLOB_LIST)
    seen: set[str] = set()
    total = 0
    try:
        async for ref in app.hooks.backup_blobs(conn):
            if ref.key in seen:
                continue
            seen.add(ref.key)
            listing.write(blob_line(ListedBlob(ref.key, ref.size, ref.sha256)))
            total += ref.size
            progress("reading the database", len(seen), 0)
        listing.commit()
    except BaseException:
        listing.discard()
        raise
    facts["blob_bytes"] = total
    return facts, sorted(seen)


async def _dump(app: BuildMax, snap: Snapshot, folder: Path, progress: Progress) -> str:
    """Copy or dump the snapshot into ``folder``; the part's name."""
    if app.db.dialect == "sqlite":
        await snap.copy_to(
            str(folder / SQLITE_DUMP), lambda done, total: progress("database", done, total)
        )
        (folder / SQLITE_DUMP).chmod(0o600)
        return SQLITE_DUMP
    tool = pg_tools.find_tool("pg_dump", app.settings.pg_bin_dir)
    progress("database", 0, 0)
    await pg_tools.run_tool(
        tool,
        app.db.url,
        [
            "--format=custom",
            f"--snapshot={snap.exported}",
            # What a restore with --replace set aside is not the deployment.
            "--exclude-schema=before_restore_*",
            f"--file={folder / POSTGRES_DUMP}",
        ],
        scratch=folder,
    )
    (folder / POSTGRES_DUMP).chmod(0o600)
    return POSTGRES_DUMP


async def check_dump_tool(app: BuildMax) -> None:
    """On PostgreSQL, refuse before anything is written when ``pg_dump`` is
    missing or older than the server."""
    if app.db.dialect != "postgresql":
        return
    tool = pg_tools.find_tool("pg_dump", app.settings.pg_bin_dir)
    async with app.db.read() as conn:
        server = int(await conn.fetch_val(sa.text("SHOW server_version_num")))
    pg_tools.require_version(tool, await pg_tools.tool_major(tool), server)


def _pooled_intact(path: Path, blob: ListedBlob) -> bool:
    """Whether the pool holds ``blob`` intact (a damaged copy is copied again)."""
    try:
        return file_sha256(path) == (blob.size, blob.sha256)
    except FileNotFoundError:
        return False


class _BlobCopier:
    """Copies blobs from the store into the target's pool."""

    def __init__(self, app: BuildMax, target: Path, progress: Progress) -> None:
        self.app = app
        self.target = target
        self.progress = progress
        self.done = 0
        self.copied = 0

    async def copy(self, blob: ListedBlob, total: int) -> bool:
        """Put ``blob`` in the pool unless it is there intact; False when the
        store has lost it, or holds other bytes than its row says (damaged:
        the restore tombstones it as lost, as the collector would)."""
        path = blob_path(self.target, blob.sha256)
        if await asyncio.to_thread(_pooled_intact, path, blob):
            self.done += blob.size
            self.progress("blobs", self.done, total)
            return True
        out = await asyncio.to_thread(PrivateFile, path)
        try:
            async for chunk in blob_store(self.app).open(blob.key):
                await asyncio.to_thread(out.write, chunk)
                self.done += len(chunk)
                self.progress("blobs", self.done, total)
            if out.digest.hexdigest() != blob.sha256 or out.size != blob.size:
                log.warning(
                    "blob %s in the blob store is damaged (sha256 %s, %d bytes): left out",
                    blob.key,
                    out.digest.hexdigest(),
                    out.size,
                )
                await asyncio.to_thread(out.discard)
                return False
            await asyncio.to_thread(out.commit)
        except BlobNotFound:
            await asyncio.to_thread(out.discard)
            return False
        except BaseException:
            await asyncio.to_thread(out.discard)
            raise
        self.copied += 1
        return True


async def create_backup(
    app: BuildMax, target: Path, *, keep: int | None = None, progress: Progress = quiet
) -> CreatedBackup:
    """Take a backup into the folder ``target`` (an absolute path: see the
    module docstring), then keep only the newest ``keep`` backups there (and
    the blobs they use). One backup at a time per target: a second one is
    refused while the first runs. Every run is recorded (``backup_runs``),
    a failed one with its reason."""
    if keep is not None and keep < 1:
        raise BackupError("--keep must be at least 1")
    final = target / backup_name(app.clock.now_ms())
    run_pk = await start_run(app, str(final))
    keeper = asyncio.create_task(_keep_lease(app, run_pk), name="buildmax-backup-lease")
    try:
        await check_dump_tool(app)
        await asyncio.to_thread(private_dir, target)
        with target_lock(target):
            await asyncio.to_thread(_remove_partials, target)
            created = await _create(app, final, progress)
            size = sum(p.size for p in created.manifest.parts.values())
            await finish_run(
                app,
                run_pk,
                ok=True,
                manifest_sha256=created.manifest_sha256,
                size=size + created.manifest.blob_bytes,
            )
            if keep is not None:
                created.removed.extend(prune(target, keep))
    except BaseException as exc:
        await asyncio.shield(finish_run(app, run_pk, ok=False, error=_reason(exc)))
        raise
    finally:
        keeper.cancel()
    return created


async def _keep_lease(app: BuildMax, run_pk: int) -> None:
    """Renew the run's lease for as long as the backup runs (the database
    copy or dump, the blobs, the checks): no collector deletes a blob the
    snapshot names meanwhile."""
    while True:
        await asyncio.sleep(RENEW_AFTER_MS / 1000)
        try:
            await renew_run(app, run_pk)
        except Exception:
            log.exception("renewing the backup's lease failed")


def _remove_partials(target: Path) -> None:
    """Remove what backups killed before they finished left (under the
    target's lock: no backup is writing one now)."""
    for stale in target.glob(PARTIAL_PREFIX + "*"):
        shutil.rmtree(stale, ignore_errors=True)


async def _create(app: BuildMax, final: Path, progress: Progress) -> CreatedBackup:
    """Write the backup under its partial name, check it and rename it to
    ``final``; nothing is left of it on a failure."""
    target = final.parent
    partial = await asyncio.to_thread(_partial_of, final)
    try:
        async with app.db.snapshot() as snap:
            taken_at = app.clock.now_ms()
            facts, _ = await _read_snapshot(app, snap, partial, progress)
            database = await _dump(app, snap, partial, progress)
        copier = _BlobCopier(app, target, progress)
        missing = []
        count = 0
        for blob in listed_blobs(partial / BLOB_LIST):
            count += 1
            if not await copier.copy(blob, facts["blob_bytes"]):
                missing.append(blob.key)
        parts = {}
        for part in (database, BLOB_LIST):
            size, digest = await asyncio.to_thread(file_sha256, partial / part)
            parts[part] = Part(size, digest)
        manifest = Manifest(
            engine=app.db.dialect,
            created_at=taken_at,
            versions=_versions(app),
            migrations=facts["migrations"],
            row_counts=facts["row_counts"],
            parts=parts,
            blob_count=count,
            blob_bytes=facts["blob_bytes"],
            missing_blobs=missing,
            facts=facts["facts"],
        )
        body = manifest.to_json()
        out = PrivateFile(partial / MANIFEST)
        out.write(body)
        out.commit()
        await asyncio.to_thread(verify_files, partial, progress=progress)
        partial.rename(final)
        fsync_dir(target)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return CreatedBackup(final, manifest, hashlib.sha256(body).hexdigest(), copier.copied, [])


def _partial_of(final: Path) -> Path:
    """The folder the backup named ``final`` is written in, made anew."""
    if final.exists():
        raise BackupError(f"{final} exists already: one backup per millisecond")
    return private_dir(final.with_name(PARTIAL_PREFIX + final.name))


def _reason(exc: BaseException) -> str:
    if isinstance(exc, BackupError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def prune(target: Path, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` backups of ``target`` and every
    pooled blob none of the kept ones lists; the backups removed."""
    backups = backups_in(target)
    doomed = backups[:-keep] if len(backups) > keep else []
    if not doomed:
        return []
    wanted = {blob.sha256 for kept in backups[-keep:] for blob in listed_blobs(kept / BLOB_LIST)}
    for old in doomed:
        # Renamed first: a half-removed backup never looks like a whole one.
        trash = old.with_name(PARTIAL_PREFIX + old.name)
        old.rename(trash)
        shutil.rmtree(trash)
    pool = target / "blobs"
    if pool.is_dir():
        for path in pool.glob("*/*"):
            if path.is_file() and path.name not in wanted and not path.name.startswith("."):
                path.unlink()
    return doomed


def manifest_summary(created: CreatedBackup) -> str:
    """One line on a finished backup, for the operator."""
    m = created.manifest
    rows = sum(m.row_counts.values())
    line = (
        f"backup {created.path} ({m.engine}): {rows} rows in {len(m.row_counts)} tables, "
        f"{m.blob_count} blob(s) of {m.blob_bytes} bytes ({created.blobs_copied} copied now), "
        f"manifest sha256 {created.manifest_sha256}"
    )
    if m.missing_blobs:
        line += f"; {len(m.missing_blobs)} blob(s) the store lost or damaged: " + json.dumps(
            m.missing_blobs[:5]
        )
    return line
