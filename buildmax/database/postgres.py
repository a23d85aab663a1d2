"""The scale-out engine: PostgreSQL through ``databases`` + ``asyncpg``.

A pool of connections; write transactions use row locks
(``SELECT ... FOR UPDATE``) rather than a process-wide lock, so several
server processes share one database.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import databases
from buildmax_hookspecs import Row
from databases.core import Connection

from .base import DatabaseError, Params, Tx, transaction


def _bound(statement: Any, params: Params) -> Any:
    if isinstance(statement, str):
        raise TypeError("pass a SQLAlchemy statement (use sqlalchemy.text() for raw SQL)")
    return statement.params(**params) if params else statement


class _Executor:
    def __init__(self, conn: Connection) -> None:
        self._conn = conn

    async def execute(self, statement: Any, params: Params) -> None:
        await self._conn.execute(_bound(statement, params))

    async def fetch_all(self, statement: Any, params: Params) -> list[Row]:
        records = await self._conn.fetch_all(_bound(statement, params))
        return [dict(record._mapping.items()) for record in records]


class PostgresDatabase:
    """PostgreSQL with a connection pool."""

    dialect = "postgresql"

    def __init__(self, url: str, *, min_size: int = 2, max_size: int = 10) -> None:
        self.url = url.replace("postgres://", "postgresql://", 1)
        self._database = databases.Database(self.url, min_size=min_size, max_size=max_size)

    async def connect(self) -> None:
        """Open the pool; fails with a one-line reason when no server answers."""
        if self._database.is_connected:
            return
        try:
            await self._database.connect()
        except (OSError, Exception) as exc:
            raise DatabaseError(f"cannot connect to PostgreSQL at {self.url}: {exc}") from exc

    async def close(self) -> None:
        """Close the pool."""
        if self._database.is_connected:
            await self._database.disconnect()

    def _connection(self) -> Connection:
        if not self._database.is_connected:
            raise DatabaseError("database is not connected")
        return Connection(self._database, self._database._backend)

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Tx]:
        """A transaction on a pooled connection (READ COMMITTED + row locks)."""
        conn = self._connection()
        tx = Tx(self.dialect, _Executor(conn))
        try:
            async with conn:
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
            # After the connection went back to the pool: callbacks may write.
            await tx.run_after_commit()

    @asynccontextmanager
    async def read(self, *, background: bool = False) -> AsyncIterator[Tx]:
        """A pooled connection in autocommit mode (``background`` changes nothing here)."""
        conn = self._connection()
        async with conn:
            reader = Tx(self.dialect, _Executor(conn))
            try:
                yield reader
            finally:
                reader.closed = True
