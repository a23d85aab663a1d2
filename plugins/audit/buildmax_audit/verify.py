"""Recomputing chains: over the database, or over an export offline.

A chain is checked from its anchor (the genesis hash, or the hash of the
last event retention removed): every sequence number must follow the one
before it, every event's hash must be ``sha256(previous || record)``, and
the last event must be the head the chain recorded. The first sequence
number that breaks any of these is reported with its cause; a chain is not
checked past it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import sqlalchemy as sa

from .chain import GENESIS, RECORD_FIELDS, chain_hash, record_of
from .schema import chains, events

#: Events read per query while verifying or exporting.
BATCH = 1000


@dataclass
class ChainReport:
    """What verifying one chain found."""

    chain: str
    anchor_seq: int
    events: int = 0
    last_seq: int | None = None
    #: The first sequence number that does not verify, and why.
    broken_seq: int | None = None
    cause: str | None = None

    @property
    def ok(self) -> bool:
        """True when the chain verified."""
        return self.broken_seq is None

    def body(self) -> dict[str, Any]:
        """The report as JSON."""
        return {
            "chain": self.chain,
            "ok": self.ok,
            "events": self.events,
            "anchor_seq": self.anchor_seq,
            "last_seq": self.last_seq,
            "broken_seq": self.broken_seq,
            "cause": self.cause,
        }


@dataclass
class ChainCheck:
    """Checks one chain's events fed in sequence order."""

    report: ChainReport
    previous: str
    expected: int = field(init=False)

    def __post_init__(self) -> None:
        self.expected = self.report.anchor_seq + 1

    @classmethod
    def start(cls, chain: str, anchor_seq: int, anchor_hash: str) -> ChainCheck:
        """A check of ``chain`` from its anchor."""
        return cls(ChainReport(chain, anchor_seq), anchor_hash)

    def fail(self, seq: int, cause: str) -> None:
        """Mark the chain broken at ``seq`` (only the first break counts)."""
        if self.report.ok:
            self.report.broken_seq, self.report.cause = seq, cause

    def feed(self, record: Mapping[str, Any], stored_hash: str) -> None:
        """The next event of the chain: its hashed record and stored hash."""
        if not self.report.ok:
            return
        seq = record["seq"]
        self.report.events += 1
        if seq != self.expected:
            if isinstance(seq, int) and seq > self.expected:
                self.fail(self.expected, f"event {self.expected} is missing (next is {seq})")
            else:
                self.fail(self.expected, f"event {seq} appears where {self.expected} belongs")
            return
        if chain_hash(self.previous, record) != stored_hash:
            self.fail(seq, "its contents or position do not match its hash")
            return
        self.report.last_seq = seq
        self.previous = stored_hash
        self.expected += 1

    def finish(self, head_seq: int | None, head_hash: str | None) -> ChainReport:
        """Compare the end of the chain with the head it recorded (``None``
        when the source records none) and return the report."""
        if self.report.ok and head_seq is not None:
            if self.expected - 1 < head_seq:
                self.fail(
                    self.expected,
                    f"events {self.expected}..{head_seq} are missing (the chain's head is "
                    f"{head_seq})",
                )
            elif self.expected - 1 > head_seq or self.previous != head_hash:
                self.fail(head_seq, "the chain's recorded head does not match its events")
        return self.report


# -- the database ---------------------------------------------------------------------

_EVENT_COLUMNS = [events.c[name] for name in (*RECORD_FIELDS, "hash")]


async def chain_heads(app: Any, only: str | None = None) -> list[dict[str, Any]]:
    """Every chain's head and anchor (or just ``only``'s), sorted by chain."""
    query = sa.select(chains).order_by(chains.c.chain)
    if only is not None:
        query = query.where(chains.c.chain == only)
    async with app.db.read() as conn:
        return [dict(row) for row in await conn.fetch_all(query)]


async def stored_events(
    app: Any, chain: str, first: int, last: int | None = None
) -> AsyncIterator[dict[str, Any]]:
    """The stored events of ``chain`` from sequence ``first`` (to ``last``),
    in order, read in batches (memory stays bounded)."""
    after = first - 1
    while True:
        query = (
            sa.select(*_EVENT_COLUMNS)
            .where(events.c.chain == chain, events.c.seq > after)
            .order_by(events.c.seq)
            .limit(BATCH)
        )
        if last is not None:
            query = query.where(events.c.seq <= last)
        async with app.db.read(background=True) as conn:
            rows = await conn.fetch_all(query)
        for row in rows:
            yield dict(row)
        if len(rows) < BATCH:
            return
        after = rows[-1]["seq"]


async def verify_database(app: Any, only: str | None = None) -> list[ChainReport]:
    """Verify every chain in the database (or just ``only``)."""
    heads = await chain_heads(app, only)
    reports = []
    for head in heads:
        check = ChainCheck.start(head["chain"], head["anchor_seq"], head["anchor_hash"])
        async for row in stored_events(app, head["chain"], head["anchor_seq"] + 1):
            check.feed(record_of(row), row["hash"])
            if not check.report.ok:
                break
        reports.append(check.finish(head["seq"], head["head_hash"]))
    known = {head["chain"] for head in heads}
    query = sa.select(events.c.chain, sa.func.min(events.c.seq).label("first")).group_by(
        events.c.chain
    )
    if only is not None:
        query = query.where(events.c.chain == only)
    async with app.db.read(background=True) as conn:
        orphans = [dict(r) for r in await conn.fetch_all(query) if r["chain"] not in known]
    for orphan in orphans:
        report = ChainReport(orphan["chain"], 0)
        report.broken_seq, report.cause = orphan["first"], "the chain has events but no head"
        reports.append(report)
    return sorted(reports, key=lambda r: r.chain)


# -- an export ------------------------------------------------------------------------


class ExportError(Exception):
    """The file is not an audit export at all."""


def _lines(stream: IO[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    for number, line in enumerate(stream, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            raise ExportError(f"line {number} is not JSON") from None
        if not isinstance(item, dict):
            raise ExportError(f"line {number} is not a JSON object")
        yield number, item


def verify_export(stream: IO[str]) -> list[ChainReport]:
    """Verify an export read line by line (memory bounded by the number of
    chains, not events)."""
    items = _lines(stream)
    first = next(items, None)
    if first is None or first[1].get("kind") != "header":
        raise ExportError("the file does not start with an audit export header")
    checks: dict[str, ChainCheck] = {}
    end: dict[str, Any] | None = None
    for number, item in items:
        kind = item.get("kind")
        if end is not None:
            raise ExportError(f"line {number} follows the end line")
        if kind == "anchor":
            chain = str(item.get("chain"))
            if chain in checks:
                raise ExportError(f"line {number}: a second anchor for chain {chain!r}")
            checks[chain] = ChainCheck.start(
                chain, int(item.get("seq", 0)), str(item.get("hash", GENESIS))
            )
        elif kind == "event":
            chain = str(item.get("chain"))
            check = checks.get(chain)
            if check is None:
                raise ExportError(f"line {number}: an event of chain {chain!r} before its anchor")
            try:
                record = {name: item[name] for name in RECORD_FIELDS}
            except KeyError as missing:
                check.feed({"seq": item.get("seq")}, "")
                check.report.cause = f"the event lacks {missing}"
                continue
            check.feed(record, str(item.get("hash")))
        elif kind == "end":
            end = item
        else:
            raise ExportError(f"line {number} is of no known kind")
    return _finish_export(checks, end)


def _finish_export(
    checks: Mapping[str, ChainCheck], end: Mapping[str, Any] | None
) -> list[ChainReport]:
    if end is None:
        for check in checks.values():
            check.fail(check.expected, "the export ends early (no end line)")
        return [check.report for check in checks.values()]
    heads = end.get("chains")
    if not isinstance(heads, dict):
        raise ExportError("the end line lists no chains")
    reports = []
    for chain, check in checks.items():
        head = heads.get(chain) or {}
        last = head.get("last_seq")
        reports.append(check.finish(last if isinstance(last, int) else None, head.get("hash")))
    for chain in sorted(set(heads) - set(checks)):
        report = ChainReport(chain, 0)
        report.broken_seq, report.cause = 0, "the end line names a chain the export lacks"
        reports.append(report)
    return sorted(reports, key=lambda r: r.chain)


def first_problem(reports: Iterable[ChainReport]) -> ChainReport | None:
    """The first chain that did not verify, if any."""
    return next((report for report in reports if not report.ok), None)
