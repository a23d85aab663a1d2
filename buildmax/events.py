"""The per-space event stream: a durable outbox and its fan-out.

A mutation publishes events inside its own transaction: each takes the next
sequence number of its space (the space row's lock orders concurrent
publishers, so a space's events commit in sequence order with no gaps) and
lands in the ``events`` table. After commit, subscribers are woken: on
SQLite in-process, on PostgreSQL through ``LISTEN/NOTIFY`` on every server
process. Subscribers read from the table, so a missed wake-up costs latency,
never an event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import defaultdict
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from buildmax_hookspecs import Transaction

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
#: PostgreSQL: the same three steps (bump the space's sequence under its row
#: lock, insert the batch, notify the listening processes on commit) in one
#: statement, one round trip. A data-modifying CTE runs to completion
#: whether or not the outer query reads it.
_PUBLISH_PG = sa.text(
    "WITH bumped AS ("
    "UPDATE spaces SET event_seq = event_seq + :count WHERE id = :space_pk "
    "RETURNING event_seq), "
    "added AS ("
    "INSERT INTO events (space_id, seq, type, data, created_at) "
    "SELECT :space_pk, bumped.event_seq - :count + batch.n, batch.type, batch.data, :now "
    "FROM bumped, unnest(CAST(:types AS TEXT[]), CAST(:datas AS TEXT[])) "
    "WITH ORDINALITY AS batch(type, data, n)) "
    "SELECT (SELECT event_seq FROM bumped) AS last, "
    "pg_notify(:channel, CAST(:space_pk AS TEXT)) AS notified"
)


class EventHub:
    """Publishes events and wakes the subscribers of a space."""

    def __init__(self, app: BuildMax) -> None:
        self._app = app
        self._waiters: defaultdict[int, set[asyncio.Event]] = defaultdict(set)
        self._listener_task: asyncio.Task[None] | None = None
        #: Set when the server drains: every stream ends, none starts.
        self.closing = False

    async def publish(
        self, tx: Transaction, space_pk: int, type: str, data: Mapping[str, Any]
    ) -> int:
        """Append an event to the space's stream in ``tx``; returns its sequence number.

        Call it late in the transaction: it locks the space row until commit.
        """
        return (await self.publish_many(tx, space_pk, [(type, data)]))[0]

    async def publish_many(
        self, tx: Transaction, space_pk: int, batch: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> list[int]:
        """Append several events to the space's stream in ``tx``, in order;
        their sequence numbers. Locks the space row
        until commit (call it as late as possible: see ``tx.before_commit``)."""
        if not batch:
            return []
        payloads = []
        for type, data in batch:
            payload = json.dumps(dict(data), separators=(",", ":"), sort_keys=True)
            if len(payload) > MAX_EVENT_BYTES:
                raise ValueError(f"event {type!r} data exceeds {MAX_EVENT_BYTES} bytes")
            payloads.append((type, payload))
        now = self._app.clock.now_ms()
        if tx.dialect == "postgresql":
            # The notification is delivered by PostgreSQL on commit, to
            # every listening process.
            last = await tx.fetch_val(
                _PUBLISH_PG,
                {
                    "space_pk": space_pk,
                    "count": len(batch),
                    "now": now,
                    "types": [type for type, _ in payloads],
                    "datas": [payload for _, payload in payloads],
                    "channel": CHANNEL,
                },
            )
            if last is None:
                raise LookupError(f"no space with key {space_pk}")
            first = int(last) - len(batch) + 1
            return list(range(first, first + len(batch)))
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
        return list(range(first, first + len(batch)))

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
        """On PostgreSQL, listen for notifications from every server process."""
        if self._app.db.dialect == "postgresql":
            self._listener_task = asyncio.create_task(self._listen(), name="buildmax-events")

    async def stop(self) -> None:
        """Stop listening."""
        if self._listener_task is not None:
            self._listener_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener_task
            self._listener_task = None

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
