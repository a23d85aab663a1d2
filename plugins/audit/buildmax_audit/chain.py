"""The hash chain: what an event's hash covers, and appending to a chain.

Each space has a chain of its own and events with no space go on the system
chain, so appends in different spaces never wait for each other. An event's
hash is ``sha256(previous_hash || canonical_json(record))``: the previous
hash as its 64 hex characters, then the canonical JSON (sorted keys, no
whitespace, UTF-8) of the event's record (:data:`RECORD_FIELDS`; see
:func:`record_of`). The first event of a chain follows :data:`GENESIS`.

Appending takes the chain's head row lock. The events of a transaction are
kept aside and appended in one batch per chain by a ``last`` before-commit
callback, so the lock is the last one the transaction takes and is held
only until COMMIT: concurrent transactions append in commit order, each
chain stays gap-free, and two transactions can never wait on each other's
chains in opposite orders (chains are locked in sorted order). On
PostgreSQL a single event is appended in one statement whose update of the
head row computes the new hash in SQL from the row it locked
(:data:`_APPEND_ONE`); both engines hash the same bytes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import App, AuditEvent, Transaction
from sqlalchemy.dialects import postgresql, sqlite

from buildmax.audit import canonical_json
from buildmax.tables import spaces

from .tables import SYSTEM_CHAIN, chains, events

#: The "previous hash" of a chain's first event.
GENESIS = "0" * 64

#: The fields of an event its hash covers, in the order exports write them.
RECORD_FIELDS = (
    "chain",
    "seq",
    "time",
    "actor_id",
    "actor_kind",
    "acting_through",
    "space_id",
    "action",
    "target_type",
    "target_id",
    "details",
    "request_id",
    "admin_override",
)


def chain_of(space_id: str | None) -> str:
    """The chain an event of ``space_id`` goes on."""
    return SYSTEM_CHAIN if space_id is None else space_id


async def chain_named(app: App, ref: str) -> str | None:
    """The chain ``ref`` names: ``system``, or a space by slug or public id
    (``None`` when no space has that name)."""
    if ref == SYSTEM_CHAIN:
        return ref
    async with app.db.read() as conn:
        public_id = await conn.fetch_val(
            sa.select(spaces.c.public_id).where(
                sa.or_(spaces.c.public_id == ref, spaces.c.slug == ref)
            )
        )
    return None if public_id is None else str(public_id)


def chain_hash(previous: str, record: Mapping[str, Any]) -> str:
    """``sha256(previous || canonical_json(record))`` in hex."""
    return hashlib.sha256(previous.encode("ascii") + canonical_json(record)).hexdigest()


def record_of(row: Mapping[str, Any]) -> dict[str, Any]:
    """The hashed record of a stored event row (details parsed, the flag a
    boolean): exactly :data:`RECORD_FIELDS`."""
    record = {name: row[name] for name in RECORD_FIELDS}
    if isinstance(record["details"], str):
        record["details"] = json.loads(record["details"])
    record["admin_override"] = bool(record["admin_override"])
    return record


def _record(chain: str, seq: int, event: AuditEvent) -> dict[str, Any]:
    return {
        "chain": chain,
        "seq": seq,
        "time": event.time,
        "actor_id": event.actor_id,
        "actor_kind": event.actor_kind,
        "acting_through": event.acting_through,
        "space_id": event.space_id,
        "action": event.action,
        "target_type": event.target_type,
        "target_id": event.target_id,
        "details": dict(event.details),
        "request_id": event.request_id,
        "admin_override": event.admin_override,
    }


_ADVANCE = (
    sa.update(chains)
    .where(chains.c.chain == sa.bindparam("chain_key"))
    .values(seq=chains.c.seq + sa.bindparam("count", type_=sa.BigInteger))
    .returning(chains.c.seq, chains.c.head_hash)
)
_SET_HEAD = (
    sa.update(chains)
    .where(chains.c.chain == sa.bindparam("chain_key"))
    .values(head_hash=sa.bindparam("head"))
)
_NEW_CHAIN = {"seq": 0, "head_hash": GENESIS, "anchor_seq": 0, "anchor_hash": GENESIS}
_CREATE_CHAIN = {
    name: insert(chains)
    .values(chain=sa.bindparam("chain_key"), **_NEW_CHAIN)
    .on_conflict_do_nothing(index_elements=["chain"])
    for name, insert in (("sqlite", sqlite.insert), ("postgresql", postgresql.insert))
}
_COLUMNS = (*RECORD_FIELDS, "hash")

#: Events per INSERT statement when a transaction appends many.
INSERT_BATCH = 50


@functools.cache
def _insert(count: int, set_head: bool) -> Any:
    """One INSERT of ``count`` events (placeholders ``<column>_<i>``), built
    once per shape so it is compiled once. ``set_head`` (PostgreSQL) makes it
    a data-modifying CTE of the head's update: one round trip for both."""
    rows: list[dict[str, Any]] = [
        {name: sa.bindparam(f"{name}_{i}") for name in _COLUMNS} for i in range(count)
    ]
    statement = events.insert().values(rows)
    return _SET_HEAD.add_cte(statement.cte("appended")) if set_head else statement


def _hashed_in_sql() -> Any:
    """The new head hash computed by PostgreSQL from the locked head row:
    ``sha256(head_hash || before || seq + 1 || after)``, where ``before`` and
    ``after`` are the record's canonical JSON around its ``seq`` value."""
    text = (
        chains.c.head_hash
        + sa.bindparam("before", type_=sa.Text)
        + sa.cast(chains.c.seq + 1, sa.Text)
        + sa.bindparam("after", type_=sa.Text)
    )
    return sa.func.encode(sa.func.sha256(sa.func.convert_to(text, "UTF8")), "hex")


#: PostgreSQL: append one event in one round trip. The head row's update
#: (which takes its lock, and re-reads it after waiting) computes the new
#: hash; the event row is inserted from what it returns.
_HEAD_ONE = (
    sa.update(chains)
    .where(chains.c.chain == sa.bindparam("chain_key"))
    .values(seq=chains.c.seq + 1, head_hash=_hashed_in_sql())
    .returning(chains.c.seq, chains.c.head_hash)
    .cte("head")
)
_APPEND_ONE = (
    events.insert()
    .from_select(
        list(_COLUMNS),
        sa.select(
            *(
                _HEAD_ONE.c.seq
                if name == "seq"
                else _HEAD_ONE.c.head_hash
                if name == "hash"
                else sa.bindparam(name, type_=events.c[name].type)
                for name in _COLUMNS
            )
        ),
    )
    .returning(events.c.seq)
)


def _split_at_seq(record: dict[str, Any]) -> dict[str, str]:
    """The record's canonical JSON before and after the value of its ``seq``
    (the last ``"seq":`` key: a nested one sorts inside ``details``, before
    it, and a string cannot hold an unescaped quote)."""
    text = canonical_json({**record, "seq": 0}).decode()
    at = text.rindex('"seq":0,') + len('"seq":')
    return {"before": text[:at], "after": text[at + 1 :]}


async def _append_one_in_sql(tx: Transaction, chain: str, event: AuditEvent) -> int | None:
    """Append one event on PostgreSQL in one statement; ``None`` when the
    chain has no head row yet."""
    record = _record(chain, 0, event)
    params = {
        **record,
        **_split_at_seq(record),
        "chain_key": chain,
        "details": canonical_json(record["details"]).decode(),
        "admin_override": int(event.admin_override),
    }
    del params["seq"]
    seq = await tx.fetch_val(_APPEND_ONE, params)
    return None if seq is None else int(seq)


async def append(tx: Transaction, chain: str, batch: Sequence[AuditEvent]) -> list[int]:
    """Append ``batch`` to ``chain`` in ``tx`` (locking its head until
    commit); the sequence numbers given, in order."""
    if tx.dialect == "postgresql" and len(batch) == 1:
        seq = await _append_one_in_sql(tx, chain, batch[0])
        if seq is None:
            await tx.execute(_CREATE_CHAIN[tx.dialect], {"chain_key": chain})
            seq = await _append_one_in_sql(tx, chain, batch[0])
            assert seq is not None
        return [seq]
    advance = {"chain_key": chain, "count": len(batch)}
    head = await tx.fetch_one(_ADVANCE, advance)
    if head is None:
        await tx.execute(_CREATE_CHAIN[tx.dialect], {"chain_key": chain})
        head = await tx.fetch_one(_ADVANCE, advance)
        assert head is not None
    first = int(head["seq"]) - len(batch) + 1
    previous = str(head["head_hash"])
    rows: list[dict[str, Any]] = []
    for offset, event in enumerate(batch):
        record = _record(chain, first + offset, event)
        previous = chain_hash(previous, record)
        rows.append(
            {
                **record,
                "details": canonical_json(record["details"]).decode(),
                "admin_override": int(event.admin_override),
                "hash": previous,
            }
        )
    head = {"chain_key": chain, "head": previous}
    for start in range(0, len(rows), INSERT_BATCH):
        chunk = rows[start : start + INSERT_BATCH]
        params = {f"{name}_{i}": row[name] for i, row in enumerate(chunk) for name in _COLUMNS}
        last = start + INSERT_BATCH >= len(rows)
        if last and tx.dialect == "postgresql":
            await tx.execute(_insert(len(chunk), True), params | head)
            break
        await tx.execute(_insert(len(chunk), False), params)
    else:
        await tx.execute(_SET_HEAD, head)
    return [first + offset for offset in range(len(batch))]


class Appender:
    """Keeps each transaction's events aside and appends them, chain by
    chain in sorted order, as the transaction's last work before COMMIT."""

    def __init__(self) -> None:
        self._pending: weakref.WeakKeyDictionary[Any, list[AuditEvent]] = (
            weakref.WeakKeyDictionary()
        )

    def add(self, tx: Transaction, event: AuditEvent) -> None:
        """Append ``event`` when ``tx`` commits (and never if it rolls back)."""
        pending = self._pending.get(tx)
        if pending is None:
            pending = self._pending[tx] = []

            async def flush() -> None:
                await self._flush(tx)

            tx.before_commit(flush, last=True)
        pending.append(event)

    async def _flush(self, tx: Transaction) -> None:
        by_chain: dict[str, list[AuditEvent]] = {}
        for event in self._pending.pop(tx, []):
            by_chain.setdefault(chain_of(event.space_id), []).append(event)
        for chain in sorted(by_chain):
            await append(tx, chain, by_chain[chain])
