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


@dataclass
class _Admitted:
    """The admission the current request holds (``held`` is false while it
    has stepped out)."""

    admission: WriteAdmission
    held: bool = True


_CURRENT: ContextVar[_Admitted | None] = ContextVar("buildmax_write_admission", default=None)


class WriteAdmission:
    """Admits ``slots`` request handlers at a time, first come first served;
    ``None`` admits every one at once."""

    def __init__(self, slots: int | None) -> None:
        self.slots = slots
        self._slots = asyncio.Semaphore(slots) if slots is not None else None

    @contextlib.asynccontextmanager
    async def admitted(self) -> AsyncIterator[None]:
        """Hold one slot for the block (at once when there is no limit, or
        when this request or its in-process caller holds one already)."""
        current = _CURRENT.get()
        if self._slots is None or (current is not None and current.admission is self):
            yield
            return
        await self._slots.acquire()
        mine = _Admitted(self)
        token = _CURRENT.set(mine)
        try:
            yield
        finally:
            _CURRENT.reset(token)
            if mine.held:
                self._slots.release()


@contextlib.asynccontextmanager
async def stepped_out() -> AsyncIterator[None]:
    """Give the current request's slot, if it holds one, to the next request
    for the block (a slow wait that is neither CPU nor database work), and
    queue for it again after (a request cancelled while it queues ends
    without one, and gives none back)."""
    current = _CURRENT.get()
    slots = current.admission._slots if current is not None and current.held else None
    if current is None or slots is None:  # not admitted, or stepped out already
        yield
        return
    current.held = False
    slots.release()
    try:
        yield
    finally:
        await slots.acquire()
        current.held = True


def for_engine(dialect: str) -> WriteAdmission:
    """The admission of a server on ``dialect``: one at a time on SQLite,
    none on PostgreSQL."""
    return WriteAdmission(1 if dialect == "sqlite" else None)
