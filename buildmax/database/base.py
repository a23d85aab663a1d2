"""What both engines share: the transaction object, cancellation safety."""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import logging
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Generator,
    Mapping,
    Sequence,
)
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol, TypeVar, cast

from buildmax_hookspecs import Row

log = logging.getLogger("buildmax.database")

T = TypeVar("T")

#: The task that opened the write transaction this context is inside, if any.
#: Tasks spawned inside a transaction inherit the variable but are other
#: tasks: they are not refused, and on SQLite their write waits until the
#: parent's transaction ends (so a parent must not await such a child).
_in_write: contextvars.ContextVar[asyncio.Task[Any] | None] = contextvars.ContextVar(
    "buildmax_in_write", default=None
)


class DatabaseError(Exception):
    """The database refused or failed an operation."""


class DatabaseLogFull(DatabaseError):
    """A write was refused: the database's log is at its limit and cannot be
    emptied yet (a reader holds an old snapshot). ``retry_after`` says in how
    many seconds to try again."""

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NestedTransactionError(RuntimeError):
    """A task opened a write transaction inside its own write transaction."""


async def uncancellable(awaitable: Awaitable[T], *, start_here: bool = False) -> T:
    """Await ``awaitable`` to completion even if the caller is cancelled.

    A transaction's BEGIN, COMMIT and ROLLBACK must never be cut half-way
    (Hypercorn cancels a handler whose client disconnects). The operation's
    own failure always wins, so the caller can still roll back; otherwise a
    cancellation that arrived meanwhile is re-raised once it has finished.

    With ``start_here`` a coroutine is started right here, in a copy of the
    caller's context (as a task would run it): one that finishes without
    waiting for anything (SQLite's BEGIN and COMMIT on the event loop's
    connection) costs no task and no turn of the event loop; one that waits
    is finished by a task of its own, which a cancellation of the caller
    cannot reach. Only for a coroutine that does not tie anything to the
    task running it before it first waits (``asyncio.timeout()`` would
    cancel the caller): the engines' BEGIN, COMMIT and ROLLBACK.
    """
    task: asyncio.Future[T]
    if start_here and asyncio.iscoroutine(awaitable):
        context = contextvars.copy_context()
        try:
            waiting_on = context.run(awaitable.send, None)
        except StopIteration as finished:
            return cast(T, finished.value)
        task = asyncio.get_running_loop().create_task(
            _resumed(awaitable, waiting_on), context=context
        )
    else:
        task = asyncio.ensure_future(awaitable)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
        except BaseException:
            break
    result = task.result()  # raises the operation's own exception, if any
    if cancelled:
        raise asyncio.CancelledError()
    return result


async def _resumed(coro: Coroutine[Any, Any, T], waiting_on: Any) -> T:
    """The rest of ``coro``, started elsewhere, which yielded ``waiting_on``."""
    return await _Resumed(coro, waiting_on)


class _Resumed(Awaitable[T]):
    """Drives a started coroutine on: yields what it waits on to the task
    awaiting this, and sends (or throws) back what that task is woken with."""

    __slots__ = ("_coro", "_waiting_on")

    def __init__(self, coro: Coroutine[Any, Any, T], waiting_on: Any) -> None:
        self._coro = coro
        self._waiting_on = waiting_on

    def __await__(self) -> Generator[Any, Any, T]:
        coro, waiting_on = self._coro, self._waiting_on
        while True:
            try:
                woken_with = yield waiting_on
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # handed to the coroutine, as a task would
                try:
                    waiting_on = coro.throw(exc)
                except StopIteration as finished:
                    return cast(T, finished.value)
                continue
            try:
                waiting_on = coro.send(woken_with)
            except StopIteration as finished:
                return cast(T, finished.value)


Params = Mapping[str, Any] | None


class Executor(Protocol):
    """The engine-specific statement runner behind a :class:`Tx`."""

    async def execute(self, statement: Any, params: Params) -> None: ...

    async def fetch_all(self, statement: Any, params: Params) -> list[Row]: ...


class Tx:
    """A transaction (or read connection) handed to kernel and plugin code."""

    def __init__(self, dialect: str, executor: Executor) -> None:
        self.dialect = dialect
        self._executor = executor
        self._after_commit: list[Callable[[], Any]] = []
        self._after_rollback: list[Callable[[], Awaitable[None]]] = []
        self._before_commit: list[Callable[[], Awaitable[None]]] = []
        self._before_commit_last: list[Callable[[], Awaitable[None]]] = []
        #: Set once COMMIT has succeeded (even if the caller was cancelled).
        self.committed = False
        #: Set when the transaction or read connection has ended.
        self.closed = False

    def _open_executor(self) -> Executor:
        if self.closed:
            raise DatabaseError(
                "this transaction has ended; open a new one (after-commit work too)"
            )
        return self._executor

    async def execute(self, statement: Any, params: Params = None) -> None:
        """Run a statement that returns no rows."""
        await self._open_executor().execute(statement, params)

    async def fetch_all(self, statement: Any, params: Params = None) -> Sequence[Row]:
        """Every row of ``statement`` as mappings."""
        return await self._open_executor().fetch_all(statement, params)

    async def fetch_one(self, statement: Any, params: Params = None) -> Row | None:
        """The first row of ``statement``, or ``None``."""
        rows = await self.fetch_all(statement, params)
        return rows[0] if rows else None

    async def fetch_val(self, statement: Any, params: Params = None) -> Any:
        """The first column of the first row, or ``None``."""
        rows = await self.fetch_all(statement, params)
        if not rows:
            return None
        return next(iter(rows[0].values()))

    def after_commit(self, callback: Callable[[], Any]) -> None:
        """Run ``callback`` once this transaction has committed."""
        self._after_commit.append(callback)

    def after_rollback(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Await ``callback()`` once this transaction has rolled back."""
        self._after_rollback.append(callback)

    def before_commit(self, callback: Callable[[], Awaitable[None]], *, last: bool = False) -> None:
        """Await ``callback()`` inside this transaction just before COMMIT
        (in registration order); an exception rolls everything back.
        ``last=True`` callbacks run after every other one, including those
        registered meanwhile."""
        (self._before_commit_last if last else self._before_commit).append(callback)

    async def run_before_commit(self) -> None:
        """Run the before-commit callbacks, including any they register: the
        ordinary ones first, then the ``last`` ones."""
        while self._before_commit or self._before_commit_last:
            queue = self._before_commit or self._before_commit_last
            await queue.pop(0)()

    async def run_after_end(self) -> None:
        """Run the after-commit callbacks once COMMIT succeeded, or the
        after-rollback ones once it did not, even when the caller has been
        cancelled meanwhile; a failing one is logged."""
        callbacks = self._after_commit if self.committed else self._after_rollback
        if callbacks:
            await uncancellable(self._run_callbacks(callbacks))

    @staticmethod
    async def _run_callbacks(callbacks: list[Callable[[], Any]]) -> None:
        for callback in callbacks:
            try:
                result = callback()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("a callback after a transaction failed")


class Snapshot:
    """One consistent, read-only view of the whole database, held open for
    a backup: ``conn`` reads in it; on SQLite :meth:`copy_to` copies it into
    a file; on PostgreSQL ``exported`` names it for ``pg_dump --snapshot``."""

    def __init__(self, conn: Tx, *, exported: str | None = None) -> None:
        self.conn = conn
        self.exported = exported

    async def copy_to(self, path: str, progress: Callable[[int, int], None] | None = None) -> None:
        """Copy the snapshot into a new database file at ``path``;
        ``progress(done, total)`` counts pages. SQLite only."""
        raise DatabaseError("this engine copies a snapshot with its own dump tool")


#: Told ``(engine, seconds waited for the writer, seconds from BEGIN to the end)``
#: of every write transaction (the server's metrics).
WriteObserver = Callable[[str, float, float], None]


def ignore_write(engine: str, waited: float, held: float) -> None:
    """The :data:`WriteObserver` of a database nobody watches."""


class Database(Protocol):
    """The engine-independent database interface: what plugins see of it
    (:class:`buildmax_hookspecs.Database`), and opening and closing."""

    dialect: str
    url: str
    observe_write: WriteObserver

    async def connect(self) -> None:
        """Open connections (and create the SQLite file)."""

    async def close(self) -> None:
        """Close every connection; safe to call twice."""

    def write(self) -> AbstractAsyncContextManager[Tx]:
        """A write transaction: committed on success, rolled back on any exception."""

    def read(self, *, background: bool = False) -> AbstractAsyncContextManager[Tx]:
        """A read connection (autocommit; no multi-statement snapshot).

        ``background=True`` is for long reads (exports): on SQLite they run
        in a reader thread instead of on the event loop."""

    def snapshot(self) -> AbstractAsyncContextManager[Snapshot]:
        """A :class:`Snapshot` on a connection of its own, held until the
        block ends; writes go on meanwhile."""


def refuse_nested() -> None:
    """Raise if the current task is already inside a write transaction (on
    SQLite it would wait for its own lock forever)."""
    if in_write_transaction():
        raise NestedTransactionError(
            "a write transaction is already open in this task; pass its tx down instead"
        )


def in_write_transaction() -> bool:
    """Whether the current task is inside a write transaction."""
    owner = _in_write.get()
    return owner is not None and owner is asyncio.current_task()


def enter_write() -> contextvars.Token[asyncio.Task[Any] | None]:
    """Mark the current task as inside a write transaction."""
    refuse_nested()
    return _in_write.set(asyncio.current_task())


def leave_write(token: contextvars.Token[asyncio.Task[Any] | None]) -> None:
    """Undo :func:`enter_write`."""
    _in_write.reset(token)


@asynccontextmanager
async def transaction(
    begin: Callable[[], Awaitable[None]],
    commit: Callable[[], Awaitable[None]],
    rollback: Callable[[], Awaitable[None]],
    tx: Tx,
) -> AsyncIterator[Tx]:
    """The shared life of a write transaction on either engine.

    BEGIN, COMMIT and ROLLBACK run uncancellable; the body's failure, a
    failed COMMIT or a cancellation all end in a complete ROLLBACK before the
    connection is handed to anyone else.
    """
    token = enter_write()
    try:
        try:
            await uncancellable(begin(), start_here=True)
        except asyncio.CancelledError:
            await uncancellable(rollback(), start_here=True)
            raise
        try:
            yield tx
            await tx.run_before_commit()
        except BaseException:
            await uncancellable(rollback(), start_here=True)
            raise
        try:
            await uncancellable(commit(), start_here=True)
            tx.committed = True
        except asyncio.CancelledError:
            # COMMIT finished (uncancellable); only the caller is gone.
            tx.committed = True
            raise
        except BaseException:
            await uncancellable(rollback(), start_here=True)
            raise
    finally:
        tx.closed = True
        leave_write(token)
