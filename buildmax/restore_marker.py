"""The mark of a restore in progress on PostgreSQL, where the backup's
database is restored into the target itself (SQLite is staged under another
name instead): the table :data:`RESTORE_MARKER` is created before
``pg_restore`` and dropped by the transaction that opens the new epoch. A
server refuses to start on a database that holds it, so a restore cut off
in between never serves the backup's old credentials."""

from __future__ import annotations

import sqlalchemy as sa
from buildmax_hookspecs import Transaction

RESTORE_MARKER = "buildmax_restore_in_progress"


async def restore_unfinished(conn: Transaction) -> bool:
    """Whether the database holds the mark of a restore that did not finish."""
    if conn.dialect == "postgresql":
        query = sa.text(f"SELECT to_regclass('{RESTORE_MARKER}') IS NOT NULL")
    else:
        query = sa.text(f"SELECT count(*) > 0 FROM sqlite_master WHERE name = '{RESTORE_MARKER}'")
    return bool(await conn.fetch_val(query))


def mark_statement() -> str:
    """The statement that marks a restore in progress."""
    return f"CREATE TABLE {RESTORE_MARKER} (started_at BIGINT)"


def unmark_statement() -> sa.TextClause:
    """The statement, run in the epoch's transaction, that ends the mark."""
    return sa.text(f"DROP TABLE IF EXISTS {RESTORE_MARKER}")
