"""The per-space event stream: a durable outbox and its fan-out.

A mutation publishes events inside its own transaction, and a space's
events get sequence numbers that commit in order with no gaps, so a reader
of ``seq > last`` never misses one.

- On SQLite the publisher numbers them: it takes the next numbers from the
  space row (the database's single writer orders publishers) and inserts
  them into ``events``.
- On PostgreSQL a publisher only inserts them into ``event_outbox``, which
  takes no lock, so the writes of a space do not queue on one row. After
  its commit, the *sequencer* (:data:`_SEQUENCE_PG`, one statement, its own
  transaction) moves committed outbox rows to ``events``, numbered from
  each space's row, which it holds until it commits: a space is numbered
  by one statement at a time, each after the last, and a statement skips
  the spaces another one (or a change to the space) holds. The publisher's
  transaction returns once its own rows are numbered and committed: a
  request's events are in the stream before it answers. Rows a crashed
  process left behind are moved by the next statement of any process
  (each process runs one every :data:`SEQUENCE_EVERY` seconds).

After the numbers commit, subscribers are woken: on SQLite in-process, on
PostgreSQL through ``LISTEN/NOTIFY`` on every server process, once per
space per sequencer statement. Subscribers read from the table, so a
missed wake-up costs latency, never an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from buildmax_hookspecs import Transaction
from quart import Response

from .tables import events, spaces

if TYPE_CHECKING:
    from .app import BuildMax

log = logging.getLogger("buildmax.events")

CHANNEL = "buildmax_events"
MAX_EVENT_BYTES = 64 * 1024

_BUMP_SEQ = (
    sa.update(spaces)
    .where(spaces.c.id == sa.bindparam("space_pk"))
    .values(event_seq=spaces.c.event_seq + sa.bindparam("count", type_=sa.BigInteger))
    .returning(spaces.c.event_seq)
)
_INSERT_EVENT = events.insert().values(
    {name: sa.bindparam(name) for name in ("space_id", "seq", "type", "data", "created_at")}
)
#: PostgreSQL: a transaction's events, added to the outbox in one statement;
#: the highest outbox id given.
_ADD_TO_OUTBOX_PG = sa.text(
    "WITH added AS ("
    "INSERT INTO event_outbox (space_id, type, data, created_at) "
    "SELECT :space_pk, batch.type, batch.data, :now "
    "FROM unnest(CAST(:types AS TEXT[]), CAST(:datas AS TEXT[])) "
    "WITH ORDINALITY AS batch(type, data, n) ORDER BY batch.n "
    "RETURNING id) "
    "SELECT max(id) FROM added"
)
#: Outbox rows one sequencer statement looks at, at most.
SEQUENCE_BATCH = 1000
#: PostgreSQL, the sequencer: lock the rows of the spaces with outbox rows
#: that no other statement (or change to the space) holds, in key order
#: and skipping the others, so concurrent statements never wait for each
#: other and never number one space at once; move the oldest
#: :data:`SEQUENCE_BATCH` outbox rows of those spaces to ``events``, each
#: space's after its last number; notify those spaces' listeners on commit.
#: An outbox row another statement moved meanwhile is skipped by the
#: DELETE. Returns how many rows moved and how many of the rows callers wait
#: for (each space's, up to an id: ``spaces``, ``uptos``) it saw but did not
#: move (another statement has them, or will).
_SEQUENCE_PG = sa.text(
    "WITH locked AS ("
    "SELECT id FROM spaces WHERE id IN (SELECT space_id FROM event_outbox) "
    "ORDER BY id FOR NO KEY UPDATE SKIP LOCKED), "
    "moved AS ("
    "DELETE FROM event_outbox WHERE id IN ("
    "SELECT id FROM event_outbox WHERE space_id IN (SELECT id FROM locked) "
    "ORDER BY id LIMIT :batch) "
    "RETURNING id, space_id, type, data, created_at), "
    "counts AS (SELECT space_id, count(*) AS n FROM moved GROUP BY space_id), "
    "bumped AS ("
    "UPDATE spaces SET event_seq = spaces.event_seq + counts.n FROM counts "
    "WHERE spaces.id = counts.space_id "
    "RETURNING spaces.id AS space_id, spaces.event_seq - counts.n AS base), "
    "added AS ("
    "INSERT INTO events (space_id, seq, type, data, created_at) "
    "SELECT moved.space_id, "
    "bumped.base + row_number() OVER (PARTITION BY moved.space_id ORDER BY moved.id), "
    "moved.type, moved.data, moved.created_at "
    "FROM moved JOIN bumped ON bumped.space_id = moved.space_id), "
    "waited AS ("
    "SELECT w.space_id, w.upto FROM unnest(CAST(:spaces AS BIGINT[]), CAST(:uptos AS BIGINT[])) "
    "AS w(space_id, upto)) "
    "SELECT (SELECT count(*) FROM moved) AS moved, "
    "(SELECT count(*) FROM event_outbox o JOIN waited w "
    "ON o.space_id = w.space_id AND o.id <= w.upto) "
    "- (SELECT count(*) FROM moved m JOIN waited w "
    "ON m.space_id = w.space_id AND m.id <= w.upto) AS waiting, "
    "(SELECT count(pg_notify(:channel, CAST(space_id AS TEXT))) FROM bumped) AS notified"
)
#: Seconds a sequencer waits before it looks again at rows another
#: statement holds (doubling, up to the last).
SEQUENCE_BACKOFF = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05)
#: Seconds between a process's sequencer statements when nothing asks for
#: one (rows left by a process that died between its commit and its own).
SEQUENCE_EVERY = 2.0


class EventHub:
    """Publishes events and wakes the subscribers of a space."""

    def __init__(self, app: BuildMax) -> None:
        self._app = app
        self._waiters: defaultdict[int, set[asyncio.Event]] = defaultdict(set)
        self._listener_task: asyncio.Task[None] | None = None
        self._sweeper_task: asyncio.Task[None] | None = None
        #: PostgreSQL: the sequencer task, and what the callers waiting for
        #: its next statement wait on.
        self._sequencer: asyncio.Task[None] | None = None
        self._next_pass: asyncio.Future[None] | None = None
        #: The outbox rows the callers of the next statement wait for: each
        #: space's, up to an id.
        self._upto: dict[int, int] = {}
        #: Set when the server drains: every stream ends, none starts.
        self.closing = False

    async def publish(
        self, tx: Transaction, space_pk: int, type: str, data: Mapping[str, Any]
    ) -> None:
        """Append an event to the space's stream in ``tx``.

        Call it late in the transaction: on SQLite it takes the space row's
        next sequence number."""
        await self.publish_many(tx, space_pk, [(type, data)])

    async def publish_many(
        self, tx: Transaction, space_pk: int, batch: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> None:
        """Append several events to the space's stream in ``tx``, in order
        (as late as possible: see ``tx.before_commit``). They are numbered
        and in the stream by the time ``tx`` has ended."""
        if not batch:
            return
        payloads = []
        for type, data in batch:
            payload = json.dumps(dict(data), separators=(",", ":"), sort_keys=True)
            if len(payload) > MAX_EVENT_BYTES:
                raise ValueError(f"event {type!r} data exceeds {MAX_EVENT_BYTES} bytes")
            payloads.append((type, payload))
        now = self._app.clock.now_ms()
        if tx.dialect == "postgresql":
            upto = await tx.fetch_val(
                _ADD_TO_OUTBOX_PG,
                {
                    "space_pk": space_pk,
                    "now": now,
                    "types": [type for type, _ in payloads],
                    "datas": [payload for _, payload in payloads],
                },
            )
            tx.after_commit(lambda: self.sequenced({space_pk: int(upto)}))
            return
        last = await tx.fetch_val(_BUMP_SEQ, {"space_pk": space_pk, "count": len(batch)})
        if last is None:
            raise LookupError(f"no space with key {space_pk}")
        first = int(last) - len(batch) + 1
        for i, (type, payload) in enumerate(payloads):
            await tx.execute(
                _INSERT_EVENT,
                {
                    "space_id": space_pk,
                    "seq": first + i,
                    "type": type,
                    "data": payload,
                    "created_at": now,
                },
            )
        tx.after_commit(lambda: self.wake(space_pk))

    async def sequenced(self, upto: Mapping[int, int] | None = None) -> None:
        """PostgreSQL: return once a sequencer statement begun after this
        call has committed, and every outbox row ``upto`` names (a space's,
        up to an id: committed before the call) is numbered. Callers that
        arrive while a statement runs share the next one."""
        for space_pk, last in (upto or {}).items():
            self._upto[space_pk] = max(self._upto.get(space_pk, 0), last)
        if self._next_pass is None:
            self._next_pass = asyncio.get_running_loop().create_future()
            if self._sequencer is None:
                self._sequencer = asyncio.create_task(self._sequence(), name="buildmax-sequencer")
        # Shielded: a caller that gives up leaves the statement to the others.
        await asyncio.shield(self._next_pass)

    async def _sequence(self) -> None:
        """Run sequencer passes back to back while callers wait."""
        try:
            while self._next_pass is not None:
                done, self._next_pass = self._next_pass, None
                upto, self._upto = self._upto, {}
                try:
                    await self.sequence_once(upto)
                except Exception as exc:
                    # The rows stay in the outbox, for the next statement of
                    # any process; the callers' changes have committed.
                    log.warning("numbering events failed: %s", exc)
                done.set_result(None)
        finally:
            self._sequencer = None

    async def sequence_once(self, upto: Mapping[int, int] | None = None) -> int:
        """PostgreSQL: number the outbox rows committed so far, and wait for
        other statements that hold some of those ``upto`` names (a space's,
        up to an id); how many this process moved."""
        waited = dict(upto or {})
        params = {
            "batch": SEQUENCE_BATCH,
            "channel": CHANNEL,
            "spaces": list(waited),
            "uptos": list(waited.values()),
        }
        moved = attempt = 0
        while True:
            # An autocommit connection of the writers' pool: the statement
            # is its own transaction.
            async with self._app.db.read(background=True) as conn:
                row = await conn.fetch_one(_SEQUENCE_PG, params)
            assert row is not None
            count, waiting = int(row["moved"]), int(row["waiting"])
            moved += count
            if count < SEQUENCE_BATCH and waiting <= 0:
                return moved
            if count == 0:
                await asyncio.sleep(SEQUENCE_BACKOFF[min(attempt, len(SEQUENCE_BACKOFF) - 1)])
                attempt += 1

    def wake(self, space_pk: int) -> None:
        """Wake every subscriber of a space in this process."""
        for waiter in self._waiters.get(space_pk, ()):
            waiter.set()

    def close_streams(self) -> None:
        """End every stream of this process now (the server drains): each
        subscriber is woken and :func:`stream` ends."""
        self.closing = True
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.set()

    @contextlib.contextmanager
    def subscription(self, space_pk: int) -> Any:
        """An ``asyncio.Event`` set whenever the space may have new events."""
        waiter = asyncio.Event()
        self._waiters[space_pk].add(waiter)
        subscribers = self._app.metrics.stream_subscribers
        subscribers.inc()
        try:
            yield waiter
        finally:
            subscribers.dec()
            self._waiters[space_pk].discard(waiter)
            if not self._waiters[space_pk]:
                del self._waiters[space_pk]

    async def last_seq(self, space_pk: int) -> int:
        """The sequence number of the space's newest numbered event (0: none
        yet): where a stream that wants only what happens from now starts."""
        async with self._app.db.read() as conn:
            newest = await conn.fetch_val(
                sa.select(sa.func.max(events.c.seq)).where(events.c.space_id == space_pk)
            )
        return int(newest or 0)

    async def read_after(self, space_pk: int, after: int, limit: int = 100) -> list[dict[str, Any]]:
        """Up to ``limit`` events of a space with sequence above ``after``, in order."""
        async with self._app.db.read() as conn:
            rows = await conn.fetch_all(
                sa.select(events.c.seq, events.c.type, events.c.data, events.c.created_at)
                .where(events.c.space_id == space_pk, events.c.seq > after)
                .order_by(events.c.seq)
                .limit(limit)
            )
        return [dict(row) for row in rows]

    async def start(self) -> None:
        """On PostgreSQL, listen for notifications from every server process,
        and number what the outbox holds now and every :data:`SEQUENCE_EVERY`
        seconds."""
        if self._app.db.dialect == "postgresql":
            self._listener_task = asyncio.create_task(self._listen(), name="buildmax-events")
            self._sweeper_task = asyncio.create_task(self._sweep(), name="buildmax-sequence")

    async def stop(self) -> None:
        """Stop listening and numbering (after the statement under way)."""
        for task in (self._listener_task, self._sweeper_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._listener_task = self._sweeper_task = None
        if self._sequencer is not None:
            await asyncio.shield(self._sequencer)

    async def _sweep(self) -> None:
        while True:
            await self.sequenced()
            await asyncio.sleep(SEQUENCE_EVERY)

    async def _listen(self) -> None:
        import asyncpg

        def on_notify(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
            with contextlib.suppress(ValueError):
                self.wake(int(payload))

        while True:
            conn = None
            try:
                conn = await asyncpg.connect(self._app.db.url)
                closed = asyncio.Event()
                conn.add_termination_listener(lambda _c, ev=closed: ev.set())
                await conn.add_listener(CHANNEL, on_notify)
                log.info("listening for events on PostgreSQL")
                # Anything published while we were not listening is picked
                # up by the subscribers' periodic re-read.
                for space_pk in list(self._waiters):
                    self.wake(space_pk)
                await closed.wait()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("event listener lost its connection: %s; retrying", exc)
            finally:
                if conn is not None and not conn.is_closed():
                    await conn.close()
            await asyncio.sleep(1)


async def stream(
    hub: EventHub, space_pk: int, after: int, keepalive_seconds: float
) -> AsyncIterator[list[dict[str, Any]]]:
    """Yield the space's events after ``after`` in sequence order, in batches;
    an empty batch when nothing happened for ``keepalive_seconds``. Ends only
    when the server drains (:meth:`EventHub.close_streams`), after what was
    committed by then."""
    with hub.subscription(space_pk) as waiter:
        while True:
            waiter.clear()
            rows = await hub.read_after(space_pk, after)
            if rows:
                after = rows[-1]["seq"]
                yield rows
                continue
            if hub.closing:
                return
            try:
                await asyncio.wait_for(waiter.wait(), timeout=keepalive_seconds)
            except TimeoutError:
                yield []


def event_stream_response(
    app: BuildMax,
    space_pk: int,
    after: int,
    still_allowed: Callable[[], Awaitable[bool]],
    frame: Callable[[dict[str, Any]], bytes],
) -> Response:
    """A ``text/event-stream`` response of the space's events after
    ``after``, each written by ``frame``. ``still_allowed`` is asked again
    before every batch and every keep-alive, so a revoked token or a removed
    member gets nothing more (``access-ended``); a draining server says
    ``server-closing``, so the client reconnects from its last event id."""

    async def body() -> AsyncIterator[bytes]:
        yield b": connected\n\n"
        keepalive = app.settings.events_keepalive_seconds
        async for rows in stream(app.events, space_pk, after, keepalive):
            if not await still_allowed():
                yield b"event: access-ended\ndata: {}\n\n"
                return
            if not rows:
                yield b": keep-alive\n\n"
            for row in rows:
                yield frame(row)
        yield b"event: server-closing\ndata: {}\n\n"

    response = Response(body(), content_type="text/event-stream")
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Accel-Buffering"] = "no"
    response.timeout = None
    return response
