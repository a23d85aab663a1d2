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
from buildmax_hookspecs import App

from .chain import RECORD_FIELDS, chain_hash, record_of
from .tables import RETENTION_ACTION, chains, events

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

    def finish(self, committed_seq: int, head_seq: int, head_hash: str | None) -> ChainReport:
        """Compare the end of the chain with its recorded head and return the
        report. Every event up to ``committed_seq`` must have been seen;
        ``head_seq``/``head_hash`` is the head as recorded now (on a live
        database it may have moved on past ``committed_seq`` meanwhile)."""
        last = self.expected - 1
        if not self.report.ok:
            pass
        elif last < committed_seq:
            self.fail(
                self.expected,
                f"events {self.expected}..{committed_seq} are missing (the chain's head is "
                f"{committed_seq})",
            )
        elif last > head_seq:
            self.fail(
                head_seq + 1,
                f"event {head_seq + 1} is beyond the chain's recorded head ({head_seq})",
            )
        elif last == head_seq and head_hash is not None and self.previous != head_hash:
            self.fail(head_seq, "the chain's recorded head does not match its events")
        return self.report


# -- the database ---------------------------------------------------------------------

_EVENT_COLUMNS = [events.c[name] for name in (*RECORD_FIELDS, "hash")]


async def chain_heads(app: App, only: str | None = None) -> list[dict[str, Any]]:
    """Every chain's head and anchor (or just ``only``'s), sorted by chain."""
    query = sa.select(chains).order_by(chains.c.chain)
    if only is not None:
        query = query.where(chains.c.chain == only)
    async with app.db.read() as conn:
        return [dict(row) for row in await conn.fetch_all(query)]


async def stored_events(
    app: App, chain: str, first: int, last: int | None = None
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


async def _head(app: App, chain: str) -> dict[str, Any] | None:
    async with app.db.read() as conn:
        row = await conn.fetch_one(sa.select(chains).where(chains.c.chain == chain))
    return None if row is None else dict(row)


async def _anchor_recorded(app: App, head: dict[str, Any]) -> bool:
    """Whether the chain's newest retention event names its anchor (each
    sweep appends one after moving the anchor)."""
    async with app.db.read() as conn:
        details = await conn.fetch_val(
            sa.select(events.c.details)
            .where(events.c.chain == head["chain"], events.c.action == RETENTION_ACTION)
            .order_by(events.c.seq.desc())
            .limit(1)
        )
    if details is None:
        return False
    recorded = json.loads(details)
    return bool(
        recorded.get("through_seq") == head["anchor_seq"]
        and recorded.get("anchor_hash") == head["anchor_hash"]
    )


async def verify_chain(app: App, chain: str) -> ChainReport:
    """Verify one chain of a live database: events appended while it runs
    are checked too, and a retention sweep that moves the anchor meanwhile
    makes it start again from the new anchor."""
    while True:
        head = await _head(app, chain)
        if head is None:
            report = ChainReport(chain, 0)
            report.broken_seq, report.cause = 0, "the chain's head is gone"
            return report
        check = ChainCheck.start(chain, head["anchor_seq"], head["anchor_hash"])
        async for row in stored_events(app, chain, head["anchor_seq"] + 1):
            check.feed(record_of(row), row["hash"])
            if not check.report.ok:
                break
        now = await _head(app, chain)
        if now is not None and now["anchor_seq"] != head["anchor_seq"]:
            continue
        now = now or head
        report = check.finish(head["seq"], now["seq"], now["head_hash"])
        if report.ok and head["anchor_seq"] > 0 and not await _anchor_recorded(app, head):
            check.fail(
                head["anchor_seq"],
                f"the anchor (event {head['anchor_seq']}) was not set by a recorded "
                "retention sweep",
            )
        return report


async def verify_database(app: App, only: str | None = None) -> list[ChainReport]:
    """Verify every chain in the database (or just ``only``)."""
    heads = await chain_heads(app, only)
    reports = [await verify_chain(app, head["chain"]) for head in heads]
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
    seen = 0
    for number, item in items:
        kind = item.get("kind")
        if end is not None:
            raise ExportError(f"line {number} follows the end line")
        if kind == "anchor":
            chain, seq, anchor = item.get("chain"), item.get("seq"), item.get("hash")
            if not (isinstance(chain, str) and isinstance(seq, int) and isinstance(anchor, str)):
                raise ExportError(f"line {number}: an anchor needs a chain, a seq and a hash")
            if chain in checks:
                raise ExportError(f"line {number}: a second anchor for chain {chain!r}")
            checks[chain] = ChainCheck.start(chain, seq, anchor)
        elif kind == "event":
            seen += 1
            _feed_line(checks, number, item)
        elif kind == "end":
            end = item
        else:
            raise ExportError(f"line {number} is of no known kind")
    reports = _finish_export(checks, end)
    if end is not None and end.get("events") != seen and all(r.ok for r in reports):
        raise ExportError(f"the end line counts {end.get('events')} events; the file holds {seen}")
    return reports


def _feed_line(checks: Mapping[str, ChainCheck], number: int, item: Mapping[str, Any]) -> None:
    chain = str(item.get("chain"))
    check = checks.get(chain)
    if check is None:
        raise ExportError(f"line {number}: an event of chain {chain!r} before its anchor")
    missing = [name for name in RECORD_FIELDS if name not in item]
    seq = item.get("seq")
    if missing:
        check.fail(check.expected, f"line {number}: the event lacks {', '.join(missing)}")
        return
    try:
        check.feed({name: item[name] for name in RECORD_FIELDS}, str(item.get("hash")))
    except (TypeError, ValueError):
        at = seq if isinstance(seq, int) else check.expected
        check.fail(at, f"line {number}: the event is not plain JSON")


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
        head = heads.get(chain)
        if not (isinstance(head, dict) and isinstance(head.get("last_seq"), int)):
            check.fail(check.report.anchor_seq + 1, "the end line does not name this chain")
            reports.append(check.report)
            continue
        last = head["last_seq"]
        reports.append(check.finish(last, last, head.get("hash")))
    for chain in sorted(set(heads) - set(checks)):
        report = ChainReport(chain, 0)
        report.broken_seq, report.cause = 0, "the end line names a chain the export lacks"
        reports.append(report)
    return sorted(reports, key=lambda r: r.chain)


def first_problem(reports: Iterable[ChainReport]) -> ChainReport | None:
    """The first chain that did not verify, if any."""
    return next((report for report in reports if not report.ok), None)
