"""Publishing a release into the catalog, and reading it back.

A publish spools the uploaded bytes to a temporary file (hashing them on
the way, cut off past the size limit), inspects them with the hardened
reader, stores them in the blob store under ``marketplace/sha256/<digest>``
and writes the release row in one short transaction. Publishing the same
version again with the same bytes answers the existing release; with other
bytes it is refused.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Actor, Transaction
from packaging.version import Version

from buildmax.app import BuildMax, blob_store
from buildmax.conflicts import insert_ignoring_conflict
from buildmax.problems import NotFound, PayloadTooLarge
from buildmax.tables import principals

from .package import CHUNK, Package, PackageRefused, inspect, is_plugin_name
from .problems import PackageInvalid, PluginArchived, ReleaseDigestMismatch, ReleaseExists
from .settings import marketplace_settings
from .tables import plugins, releases

#: The blob store prefix of this plugin's packages.
KEY_PREFIX = "marketplace"


@dataclass(frozen=True)
class Spooled:
    """An uploaded archive on local disk: its path, sha256 and size."""

    path: Path
    sha256: str
    size: int


async def spool(app: BuildMax, chunks: AsyncIterator[bytes], max_bytes: int) -> Spooled:
    """Write ``chunks`` to a temporary file under the data directory, hashing
    them; 413 past ``max_bytes`` (the file is removed)."""
    directory = app.settings.data_path / "tmp"
    await asyncio.to_thread(directory.mkdir, parents=True, exist_ok=True)
    fd, name = await asyncio.to_thread(tempfile.mkstemp, prefix="catalog-", dir=directory)
    path = Path(name)
    digest = hashlib.sha256()
    size = 0
    try:
        with os.fdopen(fd, "wb") as out:
            async for chunk in chunks:
                size += len(chunk)
                if size > max_bytes:
                    raise PayloadTooLarge(f"a release archive may have at most {max_bytes} bytes")
                digest.update(chunk)
                await asyncio.to_thread(out.write, chunk)
    except BaseException:
        await asyncio.to_thread(path.unlink, missing_ok=True)
        raise
    return Spooled(path, digest.hexdigest(), size)


async def read_file(path: Path) -> AsyncIterator[bytes]:
    """A file's bytes, a chunk at a time, read in a worker thread."""
    with open(path, "rb") as fh:  # noqa: ASYNC230 - opening a local file does not block for long
        while chunk := await asyncio.to_thread(fh.read, CHUNK):
            yield chunk


async def publish(
    app: BuildMax, actor: Actor, name: str, spooled: Spooled
) -> tuple[dict[str, Any], bool]:
    """Inspect, store and record ``spooled`` as a release of ``name``; the
    release and whether it is new (``False``: the same bytes were published
    before as that version)."""
    settings = marketplace_settings(app)
    try:
        package = await asyncio.to_thread(inspect, spooled.path, settings.limits)
    except PackageRefused as refused:
        raise PackageInvalid(
            f"the archive was refused: {refused}", reason=refused.reason, path=refused.path
        ) from None
    if package.name != name:
        raise PackageInvalid(
            f"the archive's manifest names {package.name!r}, not {name!r}",
            reason="the manifest names another plugin",
        )
    version = str(Version(package.version))
    async with app.db.read() as conn:
        existing = await _release(conn, name, version)
        archived = await conn.fetch_val(
            sa.select(plugins.c.archive_reason).where(
                plugins.c.name == name, plugins.c.archived_at.is_not(None)
            )
        )
    if existing is not None:
        return _same_or_refused(existing, spooled), False
    if archived is not None:
        raise PluginArchived(f"{name} is archived ({archived}); nothing more is published to it")
    ref = await blob_store(app).put(
        KEY_PREFIX, read_file(spooled.path), max_bytes=spooled.size, expected_sha256=spooled.sha256
    )
    async with app.db.write() as tx:
        return await _record(app, tx, actor, package, version, spooled, ref.key)


def _same_or_refused(existing: dict[str, Any], spooled: Spooled) -> dict[str, Any]:
    if existing["sha256"] != spooled.sha256:
        raise ReleaseExists(
            f"version {existing['version']} was published with sha256 "
            f"{existing['sha256'][:12]}…; publish these bytes as a new version",
            sha256=existing["sha256"],
        )
    return existing


async def _record(
    app: BuildMax,
    tx: Transaction,
    actor: Actor,
    package: Package,
    version: str,
    spooled: Spooled,
    key: str,
) -> tuple[dict[str, Any], bool]:
    now = app.clock.now_ms()
    principal = await tx.fetch_val(
        sa.select(principals.c.id).where(principals.c.public_id == actor.principal_id)
    )
    await tx.execute(
        insert_ignoring_conflict(tx.dialect, plugins).values(
            name=package.name,
            description=package.description,
            publisher_id=principal,
            created_at=now,
        )
    )
    plugin = await tx.fetch_one(
        sa.select(plugins).where(plugins.c.name == package.name).with_for_update()
    )
    assert plugin is not None
    if plugin["archived_at"] is not None:
        raise PluginArchived(f"{package.name} is archived; nothing more is published to it")
    inserted = await tx.fetch_val(
        insert_ignoring_conflict(tx.dialect, releases)
        .values(
            plugin_id=plugin["id"],
            version=version,
            sha256=spooled.sha256,
            size=spooled.size,
            blob_key=key,
            description=package.description,
            report=json.dumps(package.report, sort_keys=True, separators=(",", ":")),
            executable=int(package.executable),
            published_by=principal,
            published_at=now,
        )
        .returning(releases.c.id)
    )
    release = await _release(tx, package.name, version)
    assert release is not None
    if inserted is None:
        # Published concurrently: the same bytes are that release; others are refused.
        return _same_or_refused(release, spooled), False
    await tx.execute(
        sa.update(plugins)
        .where(plugins.c.id == plugin["id"])
        .values(description=package.description)
    )
    await app.audit.record(
        tx,
        actor,
        "catalog.release.published",
        target_type="catalog_plugin",
        target_id=package.name,
        details={
            "version": version,
            "sha256_prefix": spooled.sha256[:12],
            "size": spooled.size,
            "executable": package.executable,
        },
    )
    return release, True


_publisher = principals.alias("publisher")
_yanker = principals.alias("yanker")
_certifier = principals.alias("certifier")

RELEASE_SELECT = sa.select(
    releases,
    plugins.c.name,
    plugins.c.archived_at,
    plugins.c.archive_reason,
    _publisher.c.public_id.label("published_by_id"),
    _yanker.c.public_id.label("yanked_by_id"),
    _certifier.c.public_id.label("eligible_by_id"),
).select_from(
    releases.join(plugins, plugins.c.id == releases.c.plugin_id)
    .join(_publisher, _publisher.c.id == releases.c.published_by)
    .outerjoin(_yanker, _yanker.c.id == releases.c.yanked_by)
    .outerjoin(_certifier, _certifier.c.id == releases.c.eligible_by)
)


async def _release(conn: Transaction, name: str, version: str) -> dict[str, Any] | None:
    row = await conn.fetch_one(
        RELEASE_SELECT.where(plugins.c.name == name, releases.c.version == version)
    )
    return dict(row) if row is not None else None


async def release(conn: Transaction, name: str, version: str) -> dict[str, Any] | None:
    """A release by plugin name and version (as published or normalised)."""
    try:
        normal = str(Version(version))
    except ValueError:
        return None
    return await _release(conn, name, normal)


async def releases_of(conn: Transaction, name: str) -> list[dict[str, Any]]:
    """Every release of a plugin, newest version first."""
    rows = await conn.fetch_all(RELEASE_SELECT.where(plugins.c.name == name))
    return sorted((dict(r) for r in rows), key=lambda r: Version(r["version"]), reverse=True)


#: A plugin of the catalog with its publisher's public id.
PLUGIN_SELECT = sa.select(plugins, principals.c.public_id.label("publisher")).select_from(
    plugins.join(principals, principals.c.id == plugins.c.publisher_id)
)


def checked_name(name: str) -> str:
    """``name`` if it can name a plugin; 404 otherwise (nothing is read)."""
    if not is_plugin_name(name):
        raise NotFound("no such plugin in the catalog")
    return name


async def plugin_or_404(conn: Transaction, name: str, *, lock: bool = False) -> dict[str, Any]:
    """The plugin ``name`` (its row locked with ``lock``), or 404."""
    query = PLUGIN_SELECT.where(plugins.c.name == checked_name(name))
    if lock:
        query = query.with_for_update(of=plugins)
    row = await conn.fetch_one(query)
    if row is None:
        raise NotFound("no such plugin in the catalog")
    return dict(row)


async def release_or_404(conn: Transaction, name: str, version: str) -> dict[str, Any]:
    """The release ``name`` ``version``, or 404."""
    row = await release(conn, checked_name(name), version)
    if row is None:
        raise NotFound("no such release in the catalog")
    return row


async def yank_release(
    app: BuildMax,
    tx: Transaction,
    actor: Actor,
    principal_pk: int,
    name: str,
    version: str,
    data: dict[str, Any],
) -> dict[str, Any]:
    """No longer offer the release (pins stay), with ``data["reason"]``;
    yanking twice keeps the first reason. The release's row."""
    row = await release_or_404(tx, name, version)
    if row["yanked_at"] is not None:
        return row
    await tx.execute(
        sa.update(releases)
        .where(releases.c.id == row["id"], releases.c.yanked_at.is_(None))
        .values(yanked_at=app.clock.now_ms(), yanked_by=principal_pk, yank_reason=data["reason"])
    )
    await _audit(app, tx, actor, "catalog.release.yanked", row, reason=data["reason"])
    return await release_or_404(tx, name, version)


async def archive_plugin(
    app: BuildMax, tx: Transaction, actor: Actor, principal_pk: int, name: str, data: dict[str, Any]
) -> dict[str, Any]:
    """Publish nothing more of the plugin (pins stay), with
    ``data["reason"]``; archiving twice keeps the first reason. Its row."""
    row = await plugin_or_404(tx, name, lock=True)
    if row["archived_at"] is not None:
        return row
    await tx.execute(
        sa.update(plugins)
        .where(plugins.c.id == row["id"])
        .values(
            archived_at=app.clock.now_ms(), archived_by=principal_pk, archive_reason=data["reason"]
        )
    )
    await app.audit.record(
        tx,
        actor,
        "catalog.plugin.archived",
        target_type="catalog_plugin",
        target_id=row["name"],
        details={"reason": data["reason"]},
    )
    return await plugin_or_404(tx, name)


async def set_eligibility(
    app: BuildMax,
    tx: Transaction,
    actor: Actor,
    principal_pk: int,
    name: str,
    version: str,
    data: dict[str, Any],
) -> dict[str, Any]:
    """Mark the release eligible for unattended use, or not
    (``data["eligible"]``), when ``data["sha256"]`` names it (409
    otherwise: the admin read another release's report). The release's row."""
    row = await release_or_404(tx, name, version)
    if data["sha256"] != row["sha256"]:
        raise ReleaseDigestMismatch(
            f"{name} {row['version']} has sha256 {row['sha256'][:12]}…, not the release "
            "you read; read its capability report again",
            sha256=row["sha256"],
        )
    if data["eligible"] == (row["eligible_at"] is not None):
        return row
    values = (
        {"eligible_at": app.clock.now_ms(), "eligible_by": principal_pk}
        if data["eligible"]
        else {"eligible_at": None, "eligible_by": None}
    )
    await tx.execute(sa.update(releases).where(releases.c.id == row["id"]).values(**values))
    action = "catalog.release.eligible" if data["eligible"] else "catalog.release.ineligible"
    await _audit(app, tx, actor, action, row)
    return await release_or_404(tx, name, version)


async def _audit(
    app: BuildMax, tx: Transaction, actor: Actor, action: str, row: dict[str, Any], **extra: Any
) -> None:
    await app.audit.record(
        tx,
        actor,
        action,
        target_type="catalog_plugin",
        target_id=row["name"],
        details={"version": row["version"], "sha256_prefix": row["sha256"][:12], **extra},
    )
