"""Named locks held until the end of a write transaction.

On PostgreSQL these are transaction-scoped advisory locks, for rules that
no row lock covers (counting rows, a key that has no row yet). On SQLite a
write transaction already excludes every other writer, so they are no-ops
that always succeed.
"""

from __future__ import annotations

import hashlib

import sqlalchemy as sa
from buildmax_hookspecs import Transaction


def lock_id(*parts: object) -> int:
    """A stable signed 64-bit key for ``parts``."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


async def lock(tx: Transaction, *parts: object) -> None:
    """Wait for the named lock; it is released when ``tx`` ends."""
    if tx.dialect == "postgresql":
        await tx.execute(sa.select(sa.func.pg_advisory_xact_lock(lock_id(*parts))))


async def try_lock(tx: Transaction, *parts: object) -> bool:
    """Take the named lock if nobody holds it; ``False`` otherwise."""
    if tx.dialect != "postgresql":
        return True
    return bool(await tx.fetch_val(sa.select(sa.func.pg_try_advisory_xact_lock(lock_id(*parts)))))
