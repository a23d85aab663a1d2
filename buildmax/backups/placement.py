"""A backup's database put in place, opened, counted and taken back:
what ``backup verify`` (in scratch space) and ``backup restore`` (in the
target) share."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import os
import shutil
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from ..restore_marker import RESTORE_MARKER, mark_statement
from . import pg_tools
from .layout import POSTGRES_DUMP, SQLITE_DUMP, BackupError
from .manifest import Manifest

log = logging.getLogger("buildmax.backups")

#: The suffix of a SQLite database a restore is still working on.
STAGING = ".restoring"

if TYPE_CHECKING:
    from ..app import BuildMax
    from ..config import Config


async def _tables(conn: Any, dialect: str) -> list[str]:
    """The deployment's tables (the mark of a restore in progress aside)."""
    if dialect == "sqlite":
        query = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    else:
        query = "SELECT tablename AS name FROM pg_tables WHERE schemaname = current_schema()"
    names = (row["name"] for row in await conn.fetch_all(sa.text(query)))
    return sorted(name for name in names if name != RESTORE_MARKER)


async def row_counts(conn: Any, dialect: str) -> dict[str, int]:
    """The number of rows of every table, read through ``conn``."""
    counts = {}
    for name in await _tables(conn, dialect):
        counts[name] = int(
            await conn.fetch_val(sa.select(sa.func.count()).select_from(sa.table(name)))
        )
    return counts


def _sqlite_path(settings: Config) -> Path:
    return Path(settings.effective_database_url.removeprefix("sqlite:///")).absolute()


async def _pg_is_empty(url: str) -> tuple[bool, int]:
    """Whether the database at ``url`` has no table in its schema, and how
    many other sessions are connected to it."""
    import asyncpg

    try:
        conn = await asyncpg.connect(url.replace("postgresql://", "postgres://", 1), timeout=10)
    except Exception as exc:
        raise BackupError(
            f"cannot reach the target database {pg_tools.public_url(url)}: {exc}"
        ) from None
    try:
        tables = await conn.fetchval(
            "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()"
        )
        others = await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    finally:
        await conn.close()
    return tables == 0, int(others)


async def _pg_run(url: str, sql: str) -> Any:
    """One statement (or several) on the target database; the first value."""
    import asyncpg

    conn = await asyncpg.connect(url.replace("postgresql://", "postgres://", 1), timeout=10)
    try:
        return (
            await conn.fetchval(sql)
            if sql.lstrip().upper().startswith("SELECT")
            else (await conn.execute(sql))
        )
    finally:
        await conn.close()


async def _clear_pg(url: str) -> None:
    """Empty the target's schema (a failed restore into an empty database)."""
    schema = await _pg_run(url, "SELECT current_schema()")
    await _pg_run(url, f'DROP SCHEMA "{schema}" CASCADE; CREATE SCHEMA "{schema}"')


@dataclass
class Aside:
    """What ``--replace`` set aside: SQLite files renamed, or the PostgreSQL
    schema renamed (``schema`` was ``original``); nothing is deleted."""

    paths: list[Path] = field(default_factory=list)
    schema: str | None = None
    original: str | None = None

    def describe(self) -> list[str]:
        """One line per thing set aside, for the operator."""
        lines = [
            f"moved the old {p.name.split('.before-restore-')[0]} aside to {p}" for p in self.paths
        ]
        if self.schema is not None:
            lines.append(
                f"renamed the old schema {self.original} to {self.schema} "
                f"(drop it once the restore is checked: DROP SCHEMA {self.schema} CASCADE)"
            )
        return lines


async def prepare_target(settings: Config, *, replace: bool, stamp: str) -> Aside:
    """Refuse a target that holds a database (unless ``replace``); with
    ``replace``, set the old database aside (see :class:`Aside`)."""
    if settings.engine == "sqlite":
        path = _sqlite_path(settings)
        present = [p for p in (path, path.with_name(path.name + "-wal")) if p.exists()]
        if not present or (path.is_file() and path.stat().st_size == 0 and len(present) == 1):
            return Aside()
        if not replace:
            what = path if path.exists() else path.with_name(path.name + "-wal")
            raise BackupError(
                f"{what} exists: restore into an empty data directory, or stop the server "
                "and give --replace (the old files are moved aside, not deleted)"
            )
        if sqlite_in_use(path):
            raise BackupError(f"{path} is open in a running server: stop it first")
        aside = Aside()
        for suffix in ("", "-wal", "-shm"):
            old = path.with_name(path.name + suffix)
            if old.exists():
                renamed = old.with_name(f"{old.name}.before-restore-{stamp}")
                old.rename(renamed)
                aside.paths.append(renamed)
        return aside
    empty, others = await _pg_is_empty(settings.database_url)
    if empty:
        return Aside()
    if not replace:
        raise BackupError(
            f"the database {pg_tools.public_url(settings.database_url)} is not empty: restore "
            "into an empty database, or stop every server and give --replace (the old schema "
            "is renamed, not dropped)"
        )
    if others:
        raise BackupError(
            f"{others} other session(s) are connected to "
            f"{pg_tools.public_url(settings.database_url)}: stop every server first"
        )
    original = await _pg_run(settings.database_url, "SELECT current_schema()")
    schema = "before_restore_" + "".join(c for c in stamp if c.isdigit())
    await _pg_run(
        settings.database_url,
        f'ALTER SCHEMA "{original}" RENAME TO "{schema}"; CREATE SCHEMA "{original}"',
    )
    return Aside(schema=schema, original=original)


async def put_back(settings: Config, aside: Aside) -> None:
    """Undo :func:`prepare_target` after a failed restore (the target was
    emptied first)."""
    for path in aside.paths:
        path.rename(path.with_name(path.name.split(".before-restore-")[0]))
    if aside.schema is not None:
        await _pg_run(
            settings.database_url,
            f'DROP SCHEMA "{aside.original}" CASCADE; '
            f'ALTER SCHEMA "{aside.schema}" RENAME TO "{aside.original}"',
        )


async def place_database(settings: Config, folder: Path, manifest: Manifest) -> None:
    """Put the backup's database where ``settings`` points (an empty target)."""
    if manifest.engine != settings.engine:
        raise BackupError(
            f"the backup is of a {manifest.engine} database and the target is {settings.engine}: "
            "restore into the same engine"
        )
    if settings.engine == "sqlite":
        path = _sqlite_path(settings)
        path.parent.mkdir(parents=True, exist_ok=True)
        temp = path.with_name(path.name + ".restoring")

        def copy() -> None:
            try:
                shutil.copyfile(folder / SQLITE_DUMP, temp)
                temp.chmod(0o600)
                temp.rename(path)
            finally:
                temp.unlink(missing_ok=True)

        await asyncio.to_thread(copy)
        return
    tool = pg_tools.find_tool("pg_restore", settings.pg_bin_dir)
    await _pg_run(settings.database_url, mark_statement())
    await pg_tools.run_tool(
        tool,
        settings.database_url,
        [
            "--no-owner",
            "--no-privileges",
            "--exit-on-error",
            "--single-transaction",
            str(folder / POSTGRES_DUMP),
        ],
    )


async def remove_database(server_url: str, name: str) -> None:
    """Drop a scratch database (its connections ended first)."""
    from ..database.servers import administer

    await administer(server_url, [f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'])


async def open_restored(
    settings: Config, extra_plugins: Iterable[tuple[str, object]] = ()
) -> BuildMax:
    """An app connected to the restored database (not serving)."""
    from ..app import create_app

    app = create_app(settings, extra_plugins=extra_plugins)
    await app.db.connect()
    return app


def staged(settings: Config) -> Config:
    """Where a restore puts the database while it works: on SQLite a file
    beside the target's, ``<name>.restoring``, that no server opens; on
    PostgreSQL the target itself."""
    if settings.engine != "sqlite":
        return settings
    path = _sqlite_path(settings)
    return settings.replace(database_url=f"sqlite:///{path.with_name(path.name + STAGING)}")


async def unstage(staging: Config, settings: Config) -> None:
    """Move a staged SQLite database into place (its log folded into it first)."""
    if settings.engine != "sqlite":
        return
    source, target = _sqlite_path(staging), _sqlite_path(settings)

    def move() -> None:
        conn = sqlite3.connect(source)
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            conn.execute("PRAGMA journal_mode = DELETE").fetchall()
        finally:
            conn.close()
        source.rename(target)

    await asyncio.to_thread(move)


def sqlite_in_use(path: Path) -> bool:
    """Whether a process has the SQLite database at ``path`` open: every
    connection to a WAL database holds a shared lock on byte 128 of its
    ``-shm`` file (SQLite's "dead man switch") for as long as it is open."""
    try:
        fd = os.open(path.with_name(path.name + "-shm"), os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 128)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing releases the lock, if it was taken
    return False


async def undo_placement(settings: Config) -> None:
    """Take back a database placed in an empty target."""
    if settings.engine == "sqlite":
        path = _sqlite_path(settings)
        for suffix in ("", "-wal", "-shm"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)
    else:
        try:
            await _clear_pg(settings.database_url)
        except Exception as exc:  # the restore's own error is the one to report
            log.warning(
                "could not empty %s after a failed restore: %s",
                pg_tools.public_url(settings.database_url),
                exc,
            )
