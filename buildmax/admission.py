"""Write admission: on SQLite, the handlers of mutating requests run one at
a time, so a read never shares the event loop with more than one of them.

SQLite has a single writer: write transactions run one after another
whatever the server does. What runs alongside them is everything else a
mutating request does between its body and its response (its reads, its
checks, rendering, the idempotency receipt). Left to interleave, every
request in flight takes turns on the one event loop, and a short read waits
its turn behind all of them: the ready query took 4-5 times its time alone under
50 agents writing. Admitted one at a time (FIFO), the writes keep the
writer as busy as before (measured: slightly more cycles per second, less
CPU per cycle) and a read shares the loop with one write at most.

Only the handler runs admitted: the request's authentication and its body
(read from the network, at the client's pace) come first, and routes that
stream a body of another type (uploads) are not admitted at all. Slow work
that is neither CPU nor database (Argon2 hashing in a thread) steps out of
its admission while it waits (:func:`stepped_out`). A
request made in process by an admitted one (``buildmax.internal``) is
served within its caller's admission.

On PostgreSQL writes run concurrently in the database and several
processes share it, so there is no admission (measured: limiting each
process to three lost a sixth of the claim cycles).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass

from .database.base import in_write_transaction


@dataclass
class _Admitted:
    """One request's admission: ``held`` while it holds its slot (not while
    it has stepped out), ``active`` until its admitted block has ended (a
    task it started may outlive it)."""

    admission: WriteAdmission
    held: bool = True
    active: bool = True


_CURRENT: ContextVar[_Admitted | None] = ContextVar("buildmax_write_admission", default=None)


class WriteAdmission:
    """Admits ``slots`` request handlers at a time, first come first served;
    ``None`` admits every one at once."""

    def __init__(self, slots: int | None) -> None:
        self.slots = slots
        self._slots = asyncio.Semaphore(slots) if slots is not None else None

    @contextlib.asynccontextmanager
    async def admitted(self) -> AsyncIterator[None]:
        """Hold one slot for the block: at once when there is no limit, or
        within the admission of the request (still running) that made this
        one in process."""
        current = _CURRENT.get()
        if self._slots is None or (
            current is not None and current.admission is self and current.active
        ):
            yield
            return
        await self._slots.acquire()
        mine = _Admitted(self)
        token = _CURRENT.set(mine)
        try:
            yield
        finally:
            _CURRENT.reset(token)
            mine.active = False
            if mine.held:
                mine.held = False
                self._slots.release()


@contextlib.asynccontextmanager
async def stepped_out() -> AsyncIterator[None]:
    """Give the current request's slot, if it holds one, to the next request
    for the block (a slow wait that is neither CPU nor database work), and
    queue for it again after (a request cancelled while it queues ends
    without one, and gives none back).

    Inside a write transaction it keeps the slot: on SQLite the transaction
    holds the single writer, so the next request could only wait for it,
    and this one for its slot back."""
    current = _CURRENT.get()
    if current is None or not (current.held and current.active) or in_write_transaction():
        yield
        return
    slots = current.admission._slots
    assert slots is not None
    current.held = False
    slots.release()
    try:
        yield
    finally:
        if current.active:
            await slots.acquire()
            if current.active:
                current.held = True
            else:  # the request ended while this (a task of its) queued
                slots.release()


def for_engine(dialect: str) -> WriteAdmission:
    """The admission of a server on ``dialect``: one at a time on SQLite,
    none on PostgreSQL."""
    return WriteAdmission(1 if dialect == "sqlite" else None)
