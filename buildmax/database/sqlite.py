"""The embedded engine: SQLite through aiosqlite.

One long-lived writer connection serialises short ``BEGIN IMMEDIATE``
transactions behind an ``asyncio.Lock``. (``databases`` on SQLite opens a
connection per task and cannot begin an immediate transaction: concurrent
read-modify-write transactions then fail with 'database is locked'.)

The writer runs its statements on the event loop itself: a statement of a
short transaction costs tens of microseconds, a hop to a thread and back
several times that (measured on the claim path: a third of the server's
CPU went to aiosqlite's thread hand-offs). It never waits for SQLite's lock
on the loop: ``BEGIN IMMEDIATE`` is retried with ``asyncio.sleep`` while
another process holds the database, for up to ``BUSY_TIMEOUT_MS``; and it
never checkpoints on the loop. A write transaction must stay short (no
statement scanning a large table), exactly as before.

The write-ahead log is bounded. SQLite can only start the log over when a
checkpoint has copied every frame back into the database file and no
reader still reads from the log; a checkpoint running beside a writer that
commits all the time never gets there, and the log then grows without end
(measured: 1.8 GB in two minutes at 150 writes/s). So every
``checkpoint_interval`` seconds :meth:`SQLiteDatabase.checkpoint` copies the
bulk of the log in a thread while writes go on, then takes the write lock for
the short rest, after which the next write starts the log over and cuts the
file back to ``wal_soft_limit`` bytes (``journal_size_limit``); once no write
has come for a whole interval the file is truncated to nothing. A reader
that holds an old snapshot (another process's open transaction; this
server's own reads are single statements, on the loop bounded in time) stops
the log from starting over: past ``wal_hard_limit`` bytes a write is refused
with :class:`DatabaseLogFull` until that reader lets go, so the log never
outgrows its limit by more than one transaction.

Reads run in WAL mode, so they never wait for the writer. A request's short
reads (an indexed lookup, a page of at most 200 rows) run on the event
loop's own connection: a thread hop costs several times such a query, and
with several reader threads the GIL hand-offs dominated the read path
(measured: 500 req/s through aiosqlite readers, 880 req/s on the loop, for
an authenticated space read). A statement running longer than
``loop_read_limit_ms`` there is interrupted with a clear error, so a slow
query cannot stall the server; long reads (exports, backups) ask for
``db.read(background=True)`` and get an aiosqlite reader thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite
from buildmax_hookspecs import Row
from sqlalchemy.dialects import sqlite as sqlite_dialect

from .base import (
    DatabaseError,
    DatabaseLogFull,
    Params,
    Snapshot,
    Tx,
    WriteObserver,
    ignore_write,
    refuse_nested,
    transaction,
)
from .statements import StatementCompiler

log = logging.getLogger("buildmax.database")

BUSY_TIMEOUT_MS = 5000
#: A loop read only waits this long for a lock (WAL readers rarely wait at all).
LOOP_BUSY_TIMEOUT_MS = 100
#: SQLite calls the progress handler every this many VM instructions.
PROGRESS_STEPS = 1000
#: Seconds between WAL checkpoints (run off the event loop).
CHECKPOINT_INTERVAL_S = 1.0
#: The log is cut back to this many bytes each time it starts over.
WAL_SOFT_LIMIT = 64 * 1024 * 1024
#: Past this many bytes of log, writes are refused until a checkpoint completes.
WAL_HARD_LIMIT = 1024 * 1024 * 1024
#: How long the relief checkpoint of a log past its hard limit waits for
#: readers to leave it, holding the write lock.
RELIEF_BUSY_MS = 100
#: After a relief checkpoint failed, writes are refused without trying again
#: for this long (a pinned log stays pinned for a while).
RELIEF_RETRY_S = 1.0
#: Pages a backup copies per step (4 KiB each): progress is reported between steps.
BACKUP_STEP_PAGES = 4096


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


class _LoopWriter:
    """Runs a write transaction's statements on the event loop's writer
    connection (``busy_timeout`` 0: the lock is waited for in :meth:`begin`)."""

    def __init__(self, conn: sqlite3.Connection, compiler: StatementCompiler) -> None:
        self._conn = conn
        self._compiler = compiler

    async def execute(self, statement: Any, params: Params) -> None:
        sql, values = self._compiler.compile(statement, params)
        self._conn.execute(sql, values).fetchall()

    async def fetch_all(self, statement: Any, params: Params) -> list[Row]:
        sql, values = self._compiler.compile(statement, params)
        return self._conn.execute(sql, values).fetchall()

    async def begin(self) -> None:
        """``BEGIN IMMEDIATE``, sleeping (not blocking the loop) while another
        connection holds the write lock, up to ``BUSY_TIMEOUT_MS``."""
        deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
        delay = 0.001
        while True:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                if time.monotonic() > deadline:
                    raise DatabaseError(
                        f"the database stayed locked by another connection for {BUSY_TIMEOUT_MS} ms"
                    ) from exc
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    async def commit(self) -> None:
        """``COMMIT``."""
        self._conn.execute("COMMIT")

    async def rollback(self) -> None:
        """``ROLLBACK`` if a transaction is open."""
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")


class _LoopExecutor:
    """Runs statements synchronously on the event loop's reader connection,
    each bounded by a deadline checked from SQLite's progress handler."""

    def __init__(
        self, conn: sqlite3.Connection, compiler: StatementCompiler, limit_ms: int
    ) -> None:
        self._conn = conn
        self._compiler = compiler
        self._limit = limit_ms / 1000
        self.deadline = float("inf")
        conn.set_progress_handler(self._over_time, PROGRESS_STEPS)

    def _over_time(self) -> int:
        return 1 if time.monotonic() > self.deadline else 0

    async def execute(self, statement: Any, params: Params) -> None:
        await self.fetch_all(statement, params)

    async def fetch_all(self, statement: Any, params: Params) -> list[Row]:
        sql, values = self._compiler.compile(statement, params)
        self.deadline = time.monotonic() + self._limit
        try:
            return self._conn.execute(sql, values).fetchall()
        except sqlite3.OperationalError as exc:
            if str(exc) == "interrupted":
                raise DatabaseError(
                    f"a read ran longer than {self._limit * 1000:.0f} ms on the event loop; "
                    "use db.read(background=True) for long reads"
                ) from None
            raise
        finally:
            self.deadline = float("inf")


async def _a_turn() -> None:
    """Let every other ready task of the event loop run once."""
    await asyncio.sleep(0)


class SQLiteDatabase:
    """SQLite with one serialised writer and a small pool of readers."""

    dialect = "sqlite"
    #: Told each write transaction's wait for the write lock and its length.
    observe_write: WriteObserver = staticmethod(ignore_write)

    def __init__(
        self,
        path: str,
        *,
        readers: int = 2,
        loop_read_limit_ms: int = 250,
        wal_soft_limit: int = WAL_SOFT_LIMIT,
        wal_hard_limit: int = WAL_HARD_LIMIT,
        checkpoint_interval: float = CHECKPOINT_INTERVAL_S,
    ) -> None:
        if not 0 <= wal_soft_limit < wal_hard_limit:
            raise DatabaseError("the WAL soft limit must be below its hard limit")
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self.wal_path = self.path.with_name(self.path.name + "-wal")
        self.wal_soft_limit = wal_soft_limit
        self.wal_hard_limit = wal_hard_limit
        self._checkpoint_interval = checkpoint_interval
        self._checkpoint_conn: aiosqlite.Connection | None = None
        #: Commits so far, and as the last checkpoint saw them (idle detection).
        self._commits = 0
        self._commits_checkpointed = 0
        #: Monotonic time before which a log past its hard limit is not relieved again.
        self._relief_after = 0.0
        self._reader_count = readers
        self._compiler = StatementCompiler(sqlite_dialect.dialect(paramstyle="named"))
        self._writer: _LoopWriter | None = None
        self._writer_conn: sqlite3.Connection | None = None
        self._checkpointer: asyncio.Task[None] | None = None
        self._readers: asyncio.Queue[aiosqlite.Connection] = asyncio.Queue()
        self._all: list[aiosqlite.Connection] = []
        self._lock = asyncio.Lock()
        self._loop_read_limit_ms = loop_read_limit_ms
        self._loop_reader: _LoopExecutor | None = None
        self._loop_conn: sqlite3.Connection | None = None

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
            self._writer_conn = sqlite3.connect(self.path, isolation_level=None)
            for pragma in (
                "PRAGMA busy_timeout = 0",
                "PRAGMA foreign_keys = ON",
                "PRAGMA synchronous = NORMAL",
                "PRAGMA journal_mode = WAL",
                # Checkpoints run in a thread (see checkpoint()).
                "PRAGMA wal_autocheckpoint = 0",
                # The writer starts the log over: it then cuts the file back.
                f"PRAGMA journal_size_limit = {self.wal_soft_limit}",
            ):
                self._writer_conn.execute(pragma).fetchall()
            self._writer_conn.row_factory = _dict_row
            self._writer = _LoopWriter(self._writer_conn, self._compiler)
            self._checkpoint_conn = await self._open(reader=False)
            # A checkpoint never waits for readers (it would hold the write lock).
            await self._checkpoint_conn.execute_fetchall("PRAGMA busy_timeout = 0")
            self._checkpointer = asyncio.get_running_loop().create_task(
                self._checkpoint_forever(), name="buildmax-sqlite-checkpoint"
            )
            for _ in range(self._reader_count):
                self._readers.put_nowait(await self._open(reader=True))
            self._loop_conn = sqlite3.connect(self.path, isolation_level=None)
            self._loop_conn.row_factory = _dict_row
            for pragma in (
                f"PRAGMA busy_timeout = {LOOP_BUSY_TIMEOUT_MS}",
                "PRAGMA foreign_keys = ON",
                "PRAGMA query_only = ON",
            ):
                self._loop_conn.execute(pragma).fetchall()
            self._loop_reader = _LoopExecutor(
                self._loop_conn, self._compiler, self._loop_read_limit_ms
            )
        except (OSError, sqlite3.Error) as exc:
            await self.close()
            raise DatabaseError(f"cannot open SQLite database {self.path}: {exc}") from exc

    async def close(self) -> None:
        """Close every connection (their threads end with them)."""
        if self._checkpointer is not None:
            self._checkpointer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._checkpointer
            self._checkpointer = None
        self._checkpoint_conn = None
        conns, self._all = self._all, []
        self._writer = None
        if self._writer_conn is not None:
            self._writer_conn.close()
            self._writer_conn = None
        if self._loop_conn is not None:
            self._loop_conn.close()
        self._loop_conn = self._loop_reader = None
        self._readers = asyncio.Queue()
        for conn in conns:
            with contextlib.suppress(Exception):  # a broken connection still closes its thread
                await conn.close()

    @asynccontextmanager
    async def write(self) -> AsyncIterator[Tx]:
        """``BEGIN IMMEDIATE`` on the one writer connection, under the lock.

        The transaction's statements run on the event loop without waiting,
        so it gives the loop a turn after BEGIN and another before COMMIT:
        requests that are ready to go on (a read, an answer to send) are
        not held up for a whole transaction at a time."""
        writer = self._writer
        if writer is None:
            raise DatabaseError("database is not connected")
        refuse_nested()
        tx = Tx(self.dialect, writer)
        asked = time.perf_counter()
        try:
            async with self._lock:
                granted = time.perf_counter()
                try:
                    if self.wal_bytes() > self.wal_hard_limit:
                        await self._relieve_log()
                    async with transaction(writer.begin, writer.commit, writer.rollback, tx):
                        await asyncio.sleep(0)
                        tx.before_commit(_a_turn)
                        yield tx
                    self._commits += 1
                finally:
                    self.observe_write(self.dialect, granted - asked, time.perf_counter() - granted)
        finally:
            await tx.run_after_end()

    def wal_bytes(self) -> int:
        """The size of the write-ahead log file now (0 when there is none)."""
        try:
            return self.wal_path.stat().st_size
        except FileNotFoundError:
            return 0

    async def checkpoint(self) -> None:
        """One checkpoint: copy the log back into the database so that the
        next write starts it over, or truncate it when no write came since
        the last checkpoint. Called every ``checkpoint_interval`` seconds."""
        conn = self._checkpoint_conn
        if conn is None or self.wal_bytes() == 0:
            return
        idle = self._commits == self._commits_checkpointed
        self._commits_checkpointed = self._commits
        try:
            if not idle:
                # The bulk, while writes go on (it cannot finish beside them).
                await conn.execute_fetchall("PRAGMA wal_checkpoint(PASSIVE)")
            async with self._lock:
                # The rest, with no writer: the log is then wholly copied, so
                # the next write starts it over (unless a reader is still in it).
                mode = "TRUNCATE" if idle else "PASSIVE"
                await conn.execute_fetchall(f"PRAGMA wal_checkpoint({mode})")
        except sqlite3.Error as exc:
            log.warning("WAL checkpoint failed: %s", exc)

    async def _relieve_log(self) -> None:
        """Under the write lock, with the log past its hard limit: truncate
        it if the readers in it leave within ``RELIEF_BUSY_MS``, else refuse
        the write (without trying again for ``RELIEF_RETRY_S``)."""
        conn = self._checkpoint_conn
        if conn is not None and time.monotonic() >= self._relief_after:
            try:
                await conn.execute_fetchall(f"PRAGMA busy_timeout = {RELIEF_BUSY_MS}")
                await conn.execute_fetchall("PRAGMA wal_checkpoint(TRUNCATE)")
            except sqlite3.Error as exc:
                log.warning("WAL checkpoint failed: %s", exc)
            finally:
                with contextlib.suppress(sqlite3.Error):
                    await conn.execute_fetchall("PRAGMA busy_timeout = 0")
            if self.wal_bytes() <= self.wal_hard_limit:
                return
            self._relief_after = time.monotonic() + RELIEF_RETRY_S
            log.warning(
                "the SQLite write-ahead log %s holds %d bytes, past its hard limit of %d: "
                "a reader keeps an old snapshot open (another process's transaction?); "
                "writes are refused until it ends",
                self.wal_path,
                self.wal_bytes(),
                self.wal_hard_limit,
            )
        raise DatabaseLogFull(
            f"the database's write-ahead log reached its limit of {self.wal_hard_limit} bytes "
            "because a reader holds an old snapshot; writes resume once it ends",
            retry_after=max(1, round(RELIEF_RETRY_S)),
        )

    async def _checkpoint_forever(self) -> None:
        """Run :meth:`checkpoint` every ``checkpoint_interval`` seconds."""
        while True:
            await asyncio.sleep(self._checkpoint_interval)
            await self.checkpoint()

    @asynccontextmanager
    async def read(self, *, background: bool = False) -> AsyncIterator[Tx]:
        """A read-only, autocommit connection: the event loop's own for short
        reads, or (``background=True``) a reader thread for long ones."""
        if self._writer is None or self._loop_reader is None:
            raise DatabaseError("database is not connected")
        if not background:
            reader = Tx(self.dialect, self._loop_reader)
            try:
                yield reader
            finally:
                reader.closed = True
            return
        conn = await self._readers.get()
        reader = Tx(self.dialect, _Executor(conn, self._compiler))
        try:
            yield reader
        finally:
            reader.closed = True
            self._readers.put_nowait(conn)

    @asynccontextmanager
    async def snapshot(self) -> AsyncIterator[Snapshot]:
        """A read transaction on a connection (and thread) of its own. The
        write-ahead log cannot start over while it is held: keep it short."""
        if self._writer is None:
            raise DatabaseError("database is not connected")
        conn = await aiosqlite.connect(self.path, isolation_level=None)
        try:
            conn.row_factory = _dict_row  # type: ignore[assignment]
            await conn.execute_fetchall("PRAGMA query_only = ON")
            await conn.execute_fetchall("BEGIN")
            # The snapshot is taken by the first read, not by BEGIN.
            await conn.execute_fetchall("SELECT count(*) FROM sqlite_master")
            view = _SQLiteSnapshot(Tx(self.dialect, _Executor(conn, self._compiler)), conn)
            try:
                yield view
            finally:
                view.conn.closed = True
        finally:
            await conn.close()


class _SQLiteSnapshot(Snapshot):
    def __init__(self, conn: Tx, raw: aiosqlite.Connection) -> None:
        super().__init__(conn)
        self._raw = raw

    async def copy_to(self, path: str, progress: Callable[[int, int], None] | None = None) -> None:
        """SQLite's online backup of the snapshot, a few thousand pages a
        step, into a new file at ``path``."""
        target = sqlite3.connect(path, check_same_thread=False)
        try:

            def report(status: int, remaining: int, total: int) -> None:
                if progress is not None:
                    progress(total - remaining, total)

            await self._raw.backup(target, pages=BACKUP_STEP_PAGES, progress=report, sleep=0)
        finally:
            target.close()
