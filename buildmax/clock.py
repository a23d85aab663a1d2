"""Time, injectable so expiry and leases are testable.

Internally every timestamp is UTC epoch milliseconds; the API speaks
RFC 3339.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from buildmax_hookspecs import Clock

__all__ = ["Clock", "ManualClock", "SystemClock", "from_rfc3339", "to_rfc3339"]


class SystemClock:
    """The real wall clock."""

    def now_ms(self) -> int:
        """The current time in UTC epoch milliseconds."""
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that moves only when told to (tests, simulations)."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        """The clock's current time."""
        return self._now

    def advance(self, *, seconds: float = 0, ms: int = 0) -> None:
        """Move the clock forward."""
        self._now += ms + int(seconds * 1000)


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_rfc3339(epoch_ms: int | None) -> str | None:
    """``1700000000123`` -> ``"2023-11-14T22:13:20.123Z"``; ``None`` stays ``None``."""
    if epoch_ms is None:
        return None
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def from_rfc3339(text: str) -> int:
    """``"2023-11-14T22:13:20.123Z"`` -> ``1700000000123``; a date alone is its
    midnight UTC, a time without an offset is UTC. ``ValueError`` otherwise."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // timedelta(milliseconds=1)
