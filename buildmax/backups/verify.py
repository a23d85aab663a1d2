"""``buildmax backup verify``: a backup is whole and means what it says.

Two levels. :func:`verify_files` checks the bytes: every part's size and
sha256 against the manifest, and every blob the list names present in the
pool with its size and sha256. :func:`check_database` opens the database a
backup holds (a scratch copy on SQLite, a scratch database on PostgreSQL,
dropped after) and checks what it means: the migrations are known to this
code and not newer, the row counts are the manifest's, every plugin's check
passes against its recorded facts (the audit chains verify up to the heads
the manifest names), and every blob a row references is in the list. The
first problem found is raised as a :class:`BackupError` naming it.
"""

from __future__ import annotations

import hashlib
import secrets
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa
from buildmax_hookspecs import BlobKeyError, Migration, check_blob_key

from ..tables import schema_migrations
from .layout import BLOB_LIST, CHUNK, BackupError, Progress, blob_path, file_sha256, quiet
from .manifest import Manifest, listed_blobs, read_manifest
from .placement import open_restored, place_database, remove_database, row_counts

if TYPE_CHECKING:
    from ..app import BuildMax
    from ..config import Config


def verify_files(folder: Path, *, progress: Progress = quiet) -> Manifest:
    """Check the parts and the blobs of the backup in ``folder``; its manifest."""
    manifest, _ = read_manifest(folder)
    for name, part in manifest.parts.items():
        path = folder / name
        if not path.is_file():
            raise BackupError(f"{name} is missing from the backup {folder}")
        size, digest = file_sha256(path)
        if size != part.size:
            raise BackupError(
                f"{name} holds {size} bytes where the manifest says {part.size} bytes (truncated?)"
            )
        if digest != part.sha256:
            raise BackupError(f"{name}: its sha256 is not the manifest's (damaged)")
    target = folder.parent
    count = total = 0
    missing = set(manifest.missing_blobs)
    for blob in listed_blobs(folder / BLOB_LIST):
        count += 1
        total += blob.size
        _check_key(blob.key, blob.sha256)
        if blob.key in missing:
            continue
        _check_blob(target, blob.key, blob.size, blob.sha256)
        progress("verifying blobs", total, manifest.blob_bytes)
    if (count, total) != (manifest.blob_count, manifest.blob_bytes):
        raise BackupError(
            f"{BLOB_LIST} lists {count} blob(s) of {total} bytes where the manifest says "
            f"{manifest.blob_count} of {manifest.blob_bytes}"
        )
    return manifest


def _check_key(key: str, sha256: str) -> None:
    """A blob store key of this blob: ``<prefix>/sha256/<its digest>``."""
    try:
        check_blob_key(key)
    except BlobKeyError:
        raise BackupError(f"the blob list names {key!r}, which is not a blob key") from None
    if not key.endswith(f"/sha256/{sha256}"):
        raise BackupError(f"the blob list names {key} with sha256 {sha256}: they disagree")


def _check_blob(target: Path, key: str, size: int, sha256: str) -> None:
    try:
        path = blob_path(target, sha256)
    except ValueError:
        raise BackupError(f"blob {key}: {sha256!r} is not a sha256 digest") from None
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        raise BackupError(f"blob {key} (sha256 {sha256}) is missing from the backup") from None
    with fh:
        digest = hashlib.sha256()
        seen = 0
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            seen += len(chunk)
    if seen != size or digest.hexdigest() != sha256:
        raise BackupError(f"blob {key} (sha256 {sha256}) is damaged in the backup")


def check_schema(manifest: Manifest, migrations: Sequence[Migration]) -> None:
    """Refuse a backup whose schema is newer than this code, or whose
    database holds a migration namespace no loaded plugin knows."""
    code: dict[str, int] = {}
    for migration in migrations:
        code[migration.plugin] = max(code.get(migration.plugin, 0), migration.version)
    for plugin, db_version in sorted(manifest.migrations.items()):
        if plugin not in code:
            raise BackupError(
                f"the backup holds the tables of plugin {plugin!r}, which is not loaded here: "
                "install it before restoring"
            )
        if db_version > code[plugin]:
            raise BackupError(
                f"the backup's schema is newer than this BuildMax ({plugin} migration "
                f"{db_version}, this code knows {code[plugin]}): restore it with the version "
                f"that took it ({manifest.versions.get('buildmax', 'unknown')})"
            )


async def check_restored(app: BuildMax, manifest: Manifest) -> None:
    """Check the database ``app`` is opened on against ``manifest`` (see
    the module docstring); nothing is written."""
    async with app.db.read(background=True) as conn:
        counts = await row_counts(conn, app.db.dialect)
        recorded = await conn.fetch_all(
            sa.select(
                schema_migrations.c.plugin, sa.func.max(schema_migrations.c.version).label("v")
            ).group_by(schema_migrations.c.plugin)
        )
    migrations = {row["plugin"]: int(row["v"]) for row in recorded}
    if migrations != manifest.migrations:
        raise BackupError(
            f"the database records the migrations {migrations}, the manifest says "
            f"{manifest.migrations}"
        )
    if counts != manifest.row_counts:
        differ = sorted(
            t
            for t in set(counts) | set(manifest.row_counts)
            if counts.get(t) != manifest.row_counts.get(t)
        )
        first = differ[0]
        raise BackupError(
            f"table {first} holds {counts.get(first, 'no')} rows where the manifest says "
            f"{manifest.row_counts.get(first, 'none')}"
        )
    problems = await app.hooks.backup_check(app, manifest.plugin_facts)
    if problems:
        raise BackupError(problems[0])


async def check_references(app: BuildMax, folder: Path, manifest: Manifest) -> None:
    """The backup's blob list is exactly the blobs the rows of ``app``'s
    database reference, each with the size and digest its row gives."""
    listed = {blob.key: (blob.size, blob.sha256) for blob in listed_blobs(folder / BLOB_LIST)}
    referenced: set[str] = set()
    async with app.db.read(background=True) as conn:
        async for ref in app.hooks.backup_blobs(conn):
            entry = listed.get(ref.key)
            if entry is None:
                raise BackupError(f"blob {ref.key} is referenced by a row but not in the backup")
            if entry != (ref.size, ref.sha256):
                raise BackupError(
                    f"blob {ref.key}: the backup lists {entry[0]} bytes of sha256 {entry[1]}, "
                    f"its row says {ref.size} bytes of sha256 {ref.sha256}"
                )
            referenced.add(ref.key)
    unreferenced = sorted(set(listed) - referenced)
    if unreferenced:
        raise BackupError(f"the backup lists blob {unreferenced[0]}, which no row references")


async def check_database(settings: Config, folder: Path, manifest: Manifest) -> None:
    """Open the backup's database in scratch space and check it."""
    if manifest.engine == "sqlite":
        with tempfile.TemporaryDirectory(prefix="buildmax-verify-") as scratch:
            scratch_settings = settings.replace(
                data_dir=scratch, database_url="", blob_store_url=Path(scratch, "blobs").as_uri()
            )
            await place_database(scratch_settings, folder, manifest)
            await _check_opened(scratch_settings, folder, manifest)
        return
    if settings.engine != "postgresql":
        raise BackupError(
            "verifying a PostgreSQL backup's database needs a PostgreSQL server: "
            "give --database-url (a scratch database is created there and dropped)"
        )
    from ..database.servers import administer, database_url

    name = f"buildmax_verify_{secrets.token_hex(6)}"
    await administer(settings.database_url, [f'CREATE DATABASE "{name}"'])
    try:
        scratch_settings = settings.replace(database_url=database_url(settings.database_url, name))
        await place_database(scratch_settings, folder, manifest)
        await _check_opened(scratch_settings, folder, manifest)
    finally:
        await remove_database(settings.database_url, name)


async def _check_opened(settings: Config, folder: Path, manifest: Manifest) -> None:
    app = await open_restored(settings)
    try:
        check_schema(manifest, app.migrations())
        await check_restored(app, manifest)
        await check_references(app, folder, manifest)
    finally:
        await app.db.close()


def manifest_digest(folder: Path) -> str:
    """The sha256 of the backup's manifest, as a restore records it."""
    _, raw = read_manifest(folder)
    return hashlib.sha256(raw).hexdigest()
