"""The scale-out engine: PostgreSQL through ``databases`` + ``asyncpg``.

A pool of connections; write transactions use row locks
(``SELECT ... FOR UPDATE``) rather than a process-wide lock, so several
server processes share one database.

``databases`` provides the pool and the connection objects. Statements do
not go through its query methods: those compile every statement afresh
(measured: 38-40% of server CPU under the claim benchmark). They are
compiled through the engine's cached :class:`StatementCompiler` to
asyncpg's ``$1, $2, ...`` form and run on the raw asyncpg connection;
rows are the driver's values, as ``databases`` returned them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import databases
from buildmax_hookspecs import Row
from databases.backends.dialects.psycopg import dialect as databases_dialect
from databases.core import Connection
from sqlalchemy.engine.interfaces import Dialect

from .base import DatabaseError, Params, Snapshot, Tx, WriteObserver, ignore_write, transaction
from .statements import Positional, StatementCompiler


def _postgres_dialect() -> Dialect:
    """The dialect ``databases`` compiles PostgreSQL statements with (so SQL
    text and bind processing are unchanged), in asyncpg's ``$n`` paramstyle."""
    dialect: Any = databases_dialect(paramstyle="numeric_dollar")  # type: ignore[no-untyped-call]
    dialect.implicit_returning = True
    dialect.supports_native_enum = True
    dialect.supports_smallserial = True
    dialect._backslash_escapes = False
    dialect.supports_sane_multi_rowcount = True
    dialect._has_native_hstore = True
    dialect.supports_native_decimal = True
    return cast(Dialect, dialect)


class _Executor:
    """Runs compiled statements on a pooled connection's asyncpg connection,
    one at a time (as ``databases`` did: concurrent callers on one
    transaction queue rather than fail)."""

    __slots__ = ("_compiler", "_conn", "_lock")

    def __init__(self, conn: Connection, compiler: StatementCompiler) -> None:
        self._conn = conn
        self._compiler = compiler
        self._lock = asyncio.Lock()

    async def execute(self, statement: Any, params: Params) -> None:
        async with self._lock:
            # fetch(), not execute(): without arguments asyncpg's execute()
            # takes the simple protocol, which would accept several
            # statements in one text.
            await self._fetch(self._compiler.compile_positional(statement, params))

    async def fetch_all(self, statement: Any, params: Params) -> list[Row]:
        async with self._lock:
            records = await self._fetch(self._compiler.compile_positional(statement, params))
        # A label repeated in a select keeps its last value, as on SQLite.
        return [dict(record.items()) for record in records]

    async def _fetch(self, compiled: Positional) -> list[Any]:
        raw = self._conn.raw_connection
        if compiled.one_off:
            # Prepared apart from the connection's cache of statements
            # (closed once dropped): a search's own words would push out
            # the statements every request runs again.
            prepared = await raw.prepare(compiled.sql)
            return list(await prepared.fetch(*compiled.args))
        return list(await raw.fetch(compiled.sql, *compiled.args))


async def _reset_on_release(conn: Any) -> None:
    """What a pooled connection needs before its next user: only a rollback,
    should a transaction still be open. (asyncpg's default reset also
    releases session advisory locks, closes cursors, unlistens and resets
    settings: one more round trip per pooled read or write, while BuildMax
    takes transaction-scoped locks and settings only, and listens on a
    connection of its own.)"""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


class PostgresDatabase:
    """PostgreSQL with two connection pools: one for write transactions and
    long reads, and a small one kept for short reads, so that a read never
    waits for a connection while writers hold them all (queued behind a row
    lock, say)."""

    dialect = "postgresql"
    #: Told each write transaction's wait for a pooled connection and its length.
    observe_write: WriteObserver = staticmethod(ignore_write)

    def __init__(
        self, url: str, *, min_size: int = 2, max_size: int = 10, read_size: int = 3
    ) -> None:
        self.url = url.replace("postgres://", "postgresql://", 1)
        self._database = databases.Database(
            self.url, min_size=min_size, max_size=max_size, reset=_reset_on_release
        )
        # Opened whole at connect: a short read never waits for one to open.
        self._reads = databases.Database(
            self.url, min_size=read_size, max_size=read_size, reset=_reset_on_release
        )
        self._compiler = StatementCompiler(_postgres_dialect())

    @property
    def pools(self) -> tuple[databases.Database, databases.Database]:
        """The pool of writes and long reads, and the pool of short reads."""
        return self._database, self._reads

    async def connect(self) -> None:
        """Open the pools; fails with a one-line reason when no server answers."""
        try:
            for pool in self.pools:
                if not pool.is_connected:
                    await pool.connect()
        except (OSError, Exception) as exc:
            await self.close()
            raise DatabaseError(f"cannot connect to PostgreSQL at {self.url}: {exc}") from exc

    async def close(self) -> None:
        """Close the pools."""
        for pool in self.pools:
            if pool.is_connected:
                await pool.disconnect()

    @staticmethod
    def _connection(pool: databases.Database) -> Connection:
        if not pool.is_connected:
            raise DatabaseError("database is not connected")
        return Connection(pool, pool._backend)

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Tx]:
        """A transaction on a pooled connection (READ COMMITTED + row locks)."""
        conn = self._connection(self._database)
        tx = Tx(self.dialect, _Executor(conn, self._compiler))
        asked = time.perf_counter()
        granted = None
        try:
            async with conn:
                granted = time.perf_counter()
                raw = conn.raw_connection

                async def begin() -> None:
                    await raw.execute("BEGIN")

                async def commit() -> None:
                    await raw.execute("COMMIT")

                async def rollback() -> None:
                    if raw.is_in_transaction():
                        await raw.execute("ROLLBACK")

                async with transaction(begin, commit, rollback, tx):
                    yield tx
        finally:
            if granted is not None:
                self.observe_write(self.dialect, granted - asked, time.perf_counter() - granted)
            # After the connection went back to the pool: callbacks may write.
            await tx.run_after_end()

    @asynccontextmanager
    async def read(self, *, background: bool = False) -> AsyncIterator[Tx]:
        """A pooled connection in autocommit mode: one kept for short reads,
        or with ``background`` (a long read) one of the writes' pool, so that
        a long read never holds up the short ones."""
        conn = self._connection(self._database if background else self._reads)
        async with conn:
            reader = Tx(self.dialect, _Executor(conn, self._compiler))
            try:
                yield reader
            finally:
                reader.closed = True

    @asynccontextmanager
    async def snapshot(self) -> AsyncIterator[Snapshot]:
        """A ``REPEATABLE READ READ ONLY`` transaction on a pooled connection,
        its snapshot exported (``pg_export_snapshot()``) so that ``pg_dump
        --snapshot`` dumps exactly what ``conn`` reads."""
        conn = self._connection(self._database)
        async with conn:
            raw = conn.raw_connection
            await raw.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            try:
                exported = await raw.fetchval("SELECT pg_export_snapshot()")
                view = Snapshot(
                    Tx(self.dialect, _Executor(conn, self._compiler)), exported=exported
                )
                try:
                    yield view
                finally:
                    view.conn.closed = True
            finally:
                if raw.is_in_transaction():
                    await raw.execute("ROLLBACK")
