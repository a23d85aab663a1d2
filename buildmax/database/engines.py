"""Choosing the engine for a database URL."""

from __future__ import annotations

from .base import Database, DatabaseError


def open_database(
    url: str,
    *,
    sqlite_readers: int = 2,
    sqlite_wal_limits: tuple[int, int] | None = None,
    pg_pool: tuple[int, int] = (2, 10),
    pg_read_pool: int = 3,
) -> Database:
    """The engine for ``url``: ``sqlite:///path`` or ``postgresql://...``.
    ``sqlite_wal_limits`` is the write-ahead log's (soft, hard) limit in bytes;
    ``pg_pool`` the (min, max) of PostgreSQL's pool of writes and long reads,
    ``pg_read_pool`` the connections it keeps for short reads."""
    if url.startswith(("postgresql:", "postgres:")):
        from .postgres import PostgresDatabase

        return PostgresDatabase(
            url, min_size=pg_pool[0], max_size=pg_pool[1], read_size=pg_read_pool
        )
    if url.startswith("sqlite:///"):
        from .sqlite import SQLiteDatabase

        limits = {}
        if sqlite_wal_limits is not None:
            limits = {
                "wal_soft_limit": sqlite_wal_limits[0],
                "wal_hard_limit": sqlite_wal_limits[1],
            }
        return SQLiteDatabase(url.removeprefix("sqlite:///"), readers=sqlite_readers, **limits)
    raise DatabaseError(f"unsupported database URL {url!r}: use sqlite:///<path> or postgresql://")
