"""The embedded engine: SQLite through aiosqlite.

One long-lived writer connection serialises short ``BEGIN IMMEDIATE``
transactions behind an ``asyncio.Lock``; a few reader connections serve
reads in WAL mode. (``databases`` on SQLite opens a connection per task and
cannot begin an immediate transaction: concurrent read-modify-write
transactions then fail with 'database is locked'.)
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite
from buildmax_hookspecs import Row
from sqlalchemy.dialects import sqlite as sqlite_dialect

from .base import DatabaseError, Params, Tx, refuse_nested, transaction
from .statements import StatementCompiler

BUSY_TIMEOUT_MS = 5000


def _dict_row(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> dict[str, Any]:
    return {column[0]: value for column, value in zip(cursor.description, row, strict=True)}


class _Executor:
    def __init__(self, conn: aiosqlite.Connection, compiler: StatementCompiler) -> None:
        self._conn = conn
        self._compiler = compiler

    async def execute(self, statement: Any, params: Params) -> None:
        sql, values = self._compiler.compile(statement, params)
        await self._conn.execute_fetchall(sql, values)

    async def fetch_all(self, statement: Any, params: Params) -> list[Row]:
        sql, values = self._compiler.compile(statement, params)
        return list(await self._conn.execute_fetchall(sql, values))  # type: ignore[arg-type]


class SQLiteDatabase:
    """SQLite with one serialised writer and a small pool of readers."""

    dialect = "sqlite"

    def __init__(self, path: str, *, readers: int = 4) -> None:
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self._reader_count = readers
        self._compiler = StatementCompiler(sqlite_dialect.dialect(paramstyle="named"))
        self._writer: aiosqlite.Connection | None = None
        self._readers: asyncio.Queue[aiosqlite.Connection] = asyncio.Queue()
        self._all: list[aiosqlite.Connection] = []
        self._lock = asyncio.Lock()

    async def _open(self, *, reader: bool) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(self.path, isolation_level=None)
        conn.row_factory = _dict_row  # type: ignore[assignment]
        self._all.append(conn)
        await conn.execute_fetchall(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        await conn.execute_fetchall("PRAGMA foreign_keys = ON")
        await conn.execute_fetchall("PRAGMA synchronous = NORMAL")
        if reader:
            await conn.execute_fetchall("PRAGMA query_only = ON")
        return conn

    async def connect(self) -> None:
        """Create the file if needed, switch it to WAL and open every connection."""
        if self._writer is not None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = await self._open(reader=False)
            await self._writer.execute_fetchall("PRAGMA journal_mode = WAL")
            for _ in range(self._reader_count):
                self._readers.put_nowait(await self._open(reader=True))
        except (OSError, sqlite3.Error) as exc:
            await self.close()
            raise DatabaseError(f"cannot open SQLite database {self.path}: {exc}") from exc

    async def close(self) -> None:
        """Close every connection (their threads end with them)."""
        conns, self._all = self._all, []
        self._writer = None
        self._readers = asyncio.Queue()
        for conn in conns:
            with contextlib.suppress(Exception):  # a broken connection still closes its thread
                await conn.close()

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Tx]:
        """``BEGIN IMMEDIATE`` on the one writer connection, under the lock."""
        writer = self._writer
        if writer is None:
            raise DatabaseError("database is not connected")
        refuse_nested()
        tx = Tx(self.dialect, _Executor(writer, self._compiler))

        async def begin() -> None:
            await writer.execute_fetchall("BEGIN IMMEDIATE")

        async def commit() -> None:
            await writer.execute_fetchall("COMMIT")

        async def rollback() -> None:
            if writer.in_transaction:
                await writer.execute_fetchall("ROLLBACK")

        async with self._lock, transaction(begin, commit, rollback, tx):
            yield tx
        await tx.run_after_commit()

    @asynccontextmanager
    async def read(self) -> AsyncIterator[Tx]:
        """A reader connection from the pool (read-only, autocommit)."""
        if self._writer is None:
            raise DatabaseError("database is not connected")
        conn = await self._readers.get()
        try:
            yield Tx(self.dialect, _Executor(conn, self._compiler))
        finally:
            self._readers.put_nowait(conn)
