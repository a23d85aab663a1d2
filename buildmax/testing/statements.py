"""Every SQL statement the app sends to its database for the work a test
watches, on either engine: what the statement-budget tests count.

SQLite reports each statement it runs through the trace callbacks of the
event loop's connections (``BEGIN IMMEDIATE`` and ``COMMIT`` included);
PostgreSQL's driver through a query logger on each pooled connection. On
PostgreSQL each logged statement is one round trip to the server (the
driver waits for every answer); on SQLite a statement is a call into the
library. Only statements sent from the watching task and the tasks it
starts count (a context variable tells): the server's own timers (lease
reaper, sweeper, checkpointer) are not the operation's. SQLite's reader
threads, for long background reads, are not watched.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import AsyncIterator, Iterator
from typing import Any

from ..app import BuildMax
from ..database.postgres import PostgresDatabase
from ..database.sqlite import SQLiteDatabase


class StatementLog:
    """The statements seen, in order (their SQL text)."""

    def __init__(self) -> None:
        self.statements: list[str] = []

    def seen(self, sql: str) -> None:
        """Record one statement, if it was sent for the watched work. What
        SQLite runs inside a statement (an FTS5 table's writes to its own
        tables, traced as ``-- ...``) is part of that statement, not another."""
        if _WATCHED.get() is self and not sql.startswith("--"):
            self.statements.append(" ".join(sql.split()))

    def __len__(self) -> int:
        return len(self.statements)

    def __str__(self) -> str:
        return "\n".join(f"{n:3} {sql[:160]}" for n, sql in enumerate(self.statements, 1))


#: The log of the work being watched, in the watching task's context.
_WATCHED: contextvars.ContextVar[StatementLog | None] = contextvars.ContextVar(
    "buildmax_statement_log", default=None
)


@contextlib.asynccontextmanager
async def watching_statements(app: BuildMax) -> AsyncIterator[StatementLog]:
    """A :class:`StatementLog` of what ``app`` sends to its database inside
    the block. On PostgreSQL every connection of the pool must be open
    already (``pg_pool_min`` equal to ``pg_pool_max``): one opened later
    would go unwatched, so that is refused."""
    log = StatementLog()
    db = app.db
    token = _WATCHED.set(log)
    try:
        if isinstance(db, SQLiteDatabase):
            with _watching_sqlite(db, log):
                yield log
        elif isinstance(db, PostgresDatabase):
            with _watching_postgres(db, log):
                yield log
        else:  # pragma: no cover - no third engine
            raise TypeError(f"no statement log for {type(db).__name__}")
    finally:
        _WATCHED.reset(token)


@contextlib.contextmanager
def _watching_sqlite(db: SQLiteDatabase, log: StatementLog) -> Iterator[None]:
    conns = [c for c in (db._writer_conn, db._loop_conn) if c is not None]
    for conn in conns:
        conn.set_trace_callback(log.seen)
    try:
        yield
    finally:
        for conn in conns:
            conn.set_trace_callback(None)


@contextlib.contextmanager
def _watching_postgres(db: PostgresDatabase, log: StatementLog) -> Iterator[None]:
    conns = [holder._con for pool in db.pools for holder in pool._backend._pool._holders]
    if any(conn is None for conn in conns):
        raise RuntimeError(
            "a pooled connection is not open yet: give the test app pg_pool_min = pg_pool_max"
        )

    def logged(record: Any) -> None:
        log.seen(record.query)

    for conn in conns:
        conn.add_query_logger(logged)
    try:
        yield
    finally:
        for conn in conns:
            conn.remove_query_logger(logged)
