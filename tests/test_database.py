"""The kernel's write transaction: serialised, atomic, cancellation-safe."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars

import pytest
import sqlalchemy as sa
from sqlalchemy.schema import CreateTable

from buildmax.database import NestedTransactionError

metadata = sa.MetaData()
counter = sa.Table(
    "test_counter",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("n", sa.Integer, nullable=False),
)


@pytest.fixture
async def counter_db(app):
    async with app.db.write() as tx:
        await tx.execute(CreateTable(counter))
        await tx.execute(counter.insert().values(id=1, n=0))
    return app.db


async def _value(db) -> int:
    async with db.read() as conn:
        return await conn.fetch_val(sa.select(counter.c.n).where(counter.c.id == 1))


async def _increment_in_transaction(db) -> None:
    async with db.write() as tx:
        n = await tx.fetch_val(sa.select(counter.c.n).where(counter.c.id == 1).with_for_update())
        await asyncio.sleep(0)  # let every other task run between read and write
        await tx.execute(sa.update(counter).where(counter.c.id == 1).values(n=n + 1))


async def _increment_unlocked(db) -> None:
    async with db.read() as conn:
        n = await conn.fetch_val(sa.select(counter.c.n).where(counter.c.id == 1))
    await asyncio.sleep(0)
    async with db.write() as tx:
        await tx.execute(sa.update(counter).where(counter.c.id == 1).values(n=n + 1))


async def _race(db, increment, count: int = 50) -> list[BaseException]:
    barrier = asyncio.Barrier(count)

    async def one() -> None:
        await barrier.wait()
        await increment(db)

    results = await asyncio.gather(*(one() for _ in range(count)), return_exceptions=True)
    return [r for r in results if isinstance(r, BaseException)]


async def test_fifty_concurrent_read_modify_writes_count_exactly_fifty(counter_db):
    """Catches: BEGIN IMMEDIATE / the writer lock (SQLite) or FOR UPDATE (PostgreSQL)
    removed. The next test shows the same workload losing updates without them."""
    errors = await _race(counter_db, _increment_in_transaction)
    assert errors == []
    assert await _value(counter_db) == 50


async def test_the_race_loses_updates_when_read_and_write_are_not_one_transaction(counter_db):
    """The mutation of the test above: a plain unlocked read-then-write. It must
    lose updates, or the test above would prove nothing."""
    errors = await _race(counter_db, _increment_unlocked)
    assert errors == []
    assert await _value(counter_db) < 50


async def test_an_exception_rolls_back_everything_and_skips_after_commit(counter_db):
    ran = []
    with pytest.raises(RuntimeError):
        async with counter_db.write() as tx:
            await tx.execute(sa.update(counter).values(n=99))
            tx.after_commit(lambda: ran.append(True))
            raise RuntimeError("boom")
    assert await _value(counter_db) == 0
    assert ran == []
    async with counter_db.write() as tx:
        tx.after_commit(lambda: ran.append(True))
    assert ran == [True]


async def test_after_rollback_runs_once_rolled_back_and_may_write_anew(counter_db):
    """What a refusal must still record: the callback runs after the
    ROLLBACK, outside the failed transaction (its own write commits, the
    failed one's is gone), before the exception goes on; never after a
    commit. Catches the callbacks run before the rollback (the nested write
    is refused) or after a commit."""
    seen = []

    async def remember() -> None:
        seen.append(await _value(counter_db))
        async with counter_db.write() as tx:
            await tx.execute(sa.update(counter).values(n=7))

    with pytest.raises(RuntimeError, match="refused"):
        async with counter_db.write() as tx:
            await tx.execute(sa.update(counter).values(n=99))
            tx.after_rollback(remember)
            raise RuntimeError("refused")
    assert seen == [0]
    assert await _value(counter_db) == 7
    async with counter_db.write() as tx:
        tx.after_rollback(remember)
        await tx.execute(sa.update(counter).values(n=8))
    assert seen == [0]
    assert await _value(counter_db) == 8


async def test_a_cancelled_transaction_rolls_back_and_the_next_one_works(counter_db):
    """Catches: rollback skipped on CancelledError (the connection stays inside
    BEGIN and every later transaction fails)."""
    started = asyncio.Event()

    async def slow_writer() -> None:
        async with counter_db.write() as tx:
            await tx.execute(sa.update(counter).values(n=42))
            started.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(slow_writer())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _value(counter_db) == 0
    await _increment_in_transaction(counter_db)
    assert await _value(counter_db) == 1


async def test_cancelling_at_every_point_never_poisons_the_connection(counter_db):
    """Cancel a writer after 0..N loop iterations, so cancellation lands in
    BEGIN, in the body, and in COMMIT; the database stays usable and consistent."""
    committed = 0
    for delay in range(12):
        task = asyncio.create_task(_increment_in_transaction(counter_db))
        for _ in range(delay):
            await asyncio.sleep(0)
        task.cancel()
        try:
            await task
            committed += 1
        except asyncio.CancelledError:
            pass
        value = await _value(counter_db)
        assert value >= committed
        committed = value
    await _increment_in_transaction(counter_db)
    assert await _value(counter_db) == committed + 1


async def test_a_nested_write_in_the_same_task_is_refused(counter_db):
    async with counter_db.write():
        with pytest.raises(NestedTransactionError):
            async with counter_db.write():
                pass


async def test_raw_strings_are_refused(counter_db):
    async with counter_db.read() as conn:
        with pytest.raises(TypeError):
            await conn.fetch_all("SELECT 1")


SLOW_COUNT = sa.text(
    "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 3000000) "
    "SELECT count(*) FROM c"
)


async def test_a_long_read_on_the_event_loop_is_interrupted_but_a_background_read_is_not(app):
    """On SQLite short reads run on the event loop, bounded so a slow query
    cannot stall the server; long reads go to a reader thread. PostgreSQL
    has no such bound: both complete."""
    from buildmax.database import DatabaseError

    if app.db.dialect == "sqlite":
        with pytest.raises(DatabaseError, match=r"background=True"):
            async with app.db.read() as conn:
                await conn.fetch_val(SLOW_COUNT)
        async with app.db.read() as conn:  # the loop connection still works
            assert await conn.fetch_val(sa.select(sa.literal_column("1"))) == 1
    else:
        async with app.db.read() as conn:
            assert await conn.fetch_val(SLOW_COUNT) == 3000000
    async with app.db.read(background=True) as conn:
        assert await conn.fetch_val(SLOW_COUNT) == 3000000


async def test_two_engines_on_one_database_still_count_exactly(app, counter_db):
    """A second engine on the same database (another process, or the CLI next
    to the server) is not covered by the first one's lock. Catches: BEGIN
    instead of BEGIN IMMEDIATE on SQLite (the deferred upgrade fails with
    'database is locked'), or a missing FOR UPDATE on PostgreSQL."""
    from buildmax.database import open_database

    other = open_database(app.db.url)
    await other.connect()
    try:
        results = await asyncio.gather(
            *(_increment_in_transaction(db) for db in [app.db, other] * 25),
            return_exceptions=True,
        )
    finally:
        await other.close()
    assert [r for r in results if isinstance(r, BaseException)] == []
    assert await _value(counter_db) == 50


async def test_a_finished_transaction_refuses_further_statements(counter_db):
    from buildmax.database import DatabaseError

    async with counter_db.write() as tx:
        pass
    with pytest.raises(DatabaseError, match="has ended"):
        await tx.execute(sa.update(counter).values(n=7))
    async with counter_db.read() as conn:
        pass
    with pytest.raises(DatabaseError, match="has ended"):
        await conn.fetch_val(sa.select(counter.c.n))
    assert await _value(counter_db) == 0


async def test_after_commit_runs_exactly_when_the_commit_happened(counter_db):
    """Cancel a writer at every point: its after-commit callback runs if and
    only if its change was committed, even when the cancellation lands after
    COMMIT."""
    for delay in range(14):
        ran: list[int] = []
        before = await _value(counter_db)

        async def writer(ran: list[int]) -> None:
            async with counter_db.write() as tx:
                n = await tx.fetch_val(sa.select(counter.c.n).with_for_update())
                await tx.execute(sa.update(counter).values(n=n + 1))
                tx.after_commit(lambda: ran.append(1))

        task = asyncio.create_task(writer(ran))
        for _ in range(delay):
            await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        committed = await _value(counter_db) == before + 1
        assert bool(ran) == committed, delay


async def test_before_commit_runs_in_the_transaction_and_its_failure_rolls_back(counter_db):
    """Before-commit callbacks (how events are published in one batch) run in
    order inside the transaction, including one registered by another; an
    exception in one rolls the whole change back and skips after-commit.
    Catches: the callbacks not run before COMMIT (removing the call in
    ``transaction`` turns it red)."""
    before = await _value(counter_db)
    order: list[str] = []

    async with counter_db.write() as tx:
        await tx.execute(sa.update(counter).values(n=counter.c.n + 1))

        async def second() -> None:
            order.append("second")
            await tx.execute(sa.update(counter).values(n=counter.c.n + 10))

        async def first() -> None:
            order.append("first")
            tx.before_commit(second)

        tx.before_commit(first)
    assert order == ["first", "second"]
    assert await _value(counter_db) == before + 11

    ran: list[int] = []

    async def failing() -> None:
        raise RuntimeError("refused at the last moment")

    with pytest.raises(RuntimeError):
        async with counter_db.write() as tx:
            await tx.execute(sa.update(counter).values(n=counter.c.n + 1))
            tx.before_commit(failing)
            tx.after_commit(lambda: ran.append(1))
    assert await _value(counter_db) == before + 11
    assert ran == []


async def test_an_operation_failing_while_cancelled_reports_its_own_failure():
    """Catches: uncancellable turning a failed COMMIT into a bare cancellation
    (the caller would skip ROLLBACK and poison the connection)."""
    from buildmax.database.base import uncancellable

    started = asyncio.Event()

    async def failing_commit() -> None:
        started.set()
        await asyncio.sleep(0.05)
        raise RuntimeError("commit failed")

    async def caller() -> None:
        await uncancellable(failing_commit())

    task = asyncio.create_task(caller())
    await started.wait()
    task.cancel()
    with pytest.raises(RuntimeError, match="commit failed"):
        await task


@pytest.mark.parametrize("start_here", [False, True])
async def test_a_cancelled_caller_waits_for_the_operation_and_then_is_cancelled(start_here):
    """Catches: an operation started in the caller's task (``start_here``)
    being cut short by the caller's cancellation, or its result lost."""
    from buildmax.database.base import uncancellable

    started = asyncio.Event()
    finished: list[str] = []
    release = asyncio.get_running_loop().create_future()

    async def operation() -> str:
        started.set()
        woken = await release  # waits: the rest runs in a task of its own
        await asyncio.sleep(0)
        finished.append(woken)
        return woken

    async def caller() -> str:
        return await uncancellable(operation(), start_here=start_here)

    task = asyncio.create_task(caller())
    await started.wait()
    task.cancel()
    await asyncio.sleep(0.01)
    assert not task.done()  # still waiting for the operation, not cancelled yet
    release.set_result("committed")
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished == ["committed"]


async def test_an_operation_started_here_finishes_inline_and_keeps_its_context():
    """Catches: a finished-at-once operation still costing a task, and
    context set by an operation leaking into its caller."""
    from buildmax.database.base import uncancellable

    seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="caller")
    tasks_before = len(asyncio.all_tasks())
    tasks_during: list[int] = []

    async def at_once() -> str:
        tasks_during.append(len(asyncio.all_tasks()))
        seen.set("operation")
        return "done"

    assert await uncancellable(at_once(), start_here=True) == "done"
    assert tasks_during == [tasks_before]
    assert seen.get() == "caller"


async def test_an_operation_started_here_gets_the_failure_of_what_it_waits_on():
    """Catches: an exception meant for the operation (a failed wait)
    escaping it instead of being handed to it, as a task would."""
    from buildmax.database.base import uncancellable

    waited = asyncio.get_running_loop().create_future()

    async def operation() -> str:
        try:
            await waited
        except ConnectionError:
            return "recovered"
        return "not reached"

    running = asyncio.create_task(uncancellable(operation(), start_here=True))
    await asyncio.sleep(0)
    waited.set_exception(ConnectionError("lost"))
    assert await running == "recovered"


async def test_a_write_transaction_lets_others_run_after_begin_and_before_commit(counter_db):
    """Catches: a write transaction holding the event loop from BEGIN to
    COMMIT (on SQLite its statements never wait), so that a read or an
    answer ready meanwhile waits for the whole transaction."""
    loop = asyncio.get_running_loop()
    order: list[str] = []

    async def writer() -> None:
        async with counter_db.write() as tx:
            order.append("body")
            loop.call_soon(lambda: order.append(f"other, committed={tx.committed}"))

    async def reader() -> None:
        order.append("read")

    await asyncio.gather(writer(), reader())
    assert order == ["read", "body", "other, committed=False"]


async def test_an_operation_started_here_keeps_its_context_across_its_wait():
    """Catches: the task that finishes an operation started inline running in
    another context than its start (what it set before waiting is lost)."""
    from buildmax.database.base import uncancellable

    seen: contextvars.ContextVar[str] = contextvars.ContextVar("seen", default="caller")
    waited = asyncio.get_running_loop().create_future()

    async def operation() -> str:
        seen.set("operation")
        await waited
        return seen.get()

    running = asyncio.create_task(uncancellable(operation(), start_here=True))
    await asyncio.sleep(0)
    waited.set_result(None)
    assert await running == "operation"


@pytest.mark.engine_independent
@pytest.mark.parametrize("fail_begin", [False, True])
async def test_a_begin_that_ends_after_its_caller_was_cancelled_is_rolled_back(fail_begin):
    """Catches: a transaction whose caller was cancelled while BEGIN ran
    (waiting for SQLite's lock held by another process, or for PostgreSQL's
    answer) left open on its connection, which every later write on it
    would then find in a transaction; and a body run after all."""
    from buildmax.database.base import Tx, transaction

    calls: list[str] = []
    started, release = asyncio.Event(), asyncio.Event()

    async def begin() -> None:
        started.set()
        await release.wait()
        calls.append("BEGIN")
        if fail_begin:
            raise RuntimeError("begin failed")

    async def commit() -> None:
        calls.append("COMMIT")

    async def rollback() -> None:
        calls.append("ROLLBACK")

    async def writer() -> None:
        async with transaction(begin, commit, rollback, Tx("sqlite", object())):  # type: ignore[arg-type]
            calls.append("body")

    task = asyncio.create_task(writer())
    await started.wait()
    task.cancel()
    await asyncio.sleep(0)
    release.set()
    with pytest.raises(RuntimeError if fail_begin else asyncio.CancelledError):
        await task
    assert calls == (["BEGIN"] if fail_begin else ["BEGIN", "ROLLBACK"])


@pytest.mark.engine_independent
async def test_a_commit_runs_to_its_end_when_its_caller_is_cancelled():
    """Catches: COMMIT cut short by a cancellation (a client gone while
    PostgreSQL answers it), which leaves the caller not knowing whether its
    change was made and the connection mid-protocol."""
    from buildmax.database.base import Tx, transaction

    calls: list[str] = []
    committing, release = asyncio.Event(), asyncio.Event()
    tx = Tx("postgresql", object())  # type: ignore[arg-type]

    async def begin() -> None:
        calls.append("BEGIN")

    async def commit() -> None:
        committing.set()
        await release.wait()
        calls.append("COMMIT")

    async def rollback() -> None:
        calls.append("ROLLBACK")

    async def writer() -> None:
        async with transaction(begin, commit, rollback, tx):
            calls.append("body")

    task = asyncio.create_task(writer())
    await committing.wait()
    task.cancel()
    await asyncio.sleep(0)
    assert not task.done()
    release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert calls == ["BEGIN", "body", "COMMIT"]
    assert tx.committed
