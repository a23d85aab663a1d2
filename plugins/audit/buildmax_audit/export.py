"""Exporting the trail as JSON Lines that verify offline.

An export is a header line, then for each chain an ``anchor`` line (the
sequence number and hash just before its first exported event) followed by
that chain's ``event`` lines in sequence order, then an ``end`` line naming
each chain's last exported sequence number and hash (so a truncated file is
detected). ``--since``/``--until`` pick, per chain, the contiguous run of
sequence numbers from the first event at or after ``since`` to the last
event before ``until``: a chain is only verifiable without gaps, so an event
appended concurrently with a slightly earlier time may come along.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import App

from buildmax.clock import to_rfc3339

from .chain import RECORD_FIELDS
from .tables import events
from .verify import chain_heads, stored_events

FORMAT = "buildmax-audit-export"
VERSION = 1


class TrailChanged(Exception):
    """Events the export planned to write were gone when it read them (a
    retention sweep ran meanwhile)."""


@dataclass(frozen=True)
class ChainSlice:
    """The run of one chain's sequence numbers an export covers."""

    chain: str
    first: int
    last: int
    #: Hash of the event before ``first`` (or the chain's anchor).
    anchor_hash: str

    @property
    def size(self) -> int:
        """Events in the slice."""
        return self.last - self.first + 1


def _line(item: dict[str, Any]) -> str:
    return json.dumps(item, ensure_ascii=False, separators=(",", ":")) + "\n"


async def plan(
    app: App, *, since: int | None = None, until: int | None = None, chain: str | None = None
) -> list[ChainSlice]:
    """The slice of every chain (or of ``chain``) an export covers."""
    slices = []
    for head in await chain_heads(app, chain):
        key, first, last = head["chain"], head["anchor_seq"] + 1, head["seq"]
        async with app.db.read() as conn:
            if since is not None:
                found = await conn.fetch_val(
                    sa.select(sa.func.min(events.c.seq)).where(
                        events.c.chain == key, events.c.time >= since
                    )
                )
                first = last + 1 if found is None else max(first, int(found))
            if until is not None:
                found = await conn.fetch_val(
                    sa.select(sa.func.max(events.c.seq)).where(
                        events.c.chain == key, events.c.time < until
                    )
                )
                last = 0 if found is None else min(last, int(found))
            if first > last:
                continue
            anchor = head["anchor_hash"]
            if first - 1 > head["anchor_seq"]:
                anchor = await conn.fetch_val(
                    sa.select(events.c.hash).where(events.c.chain == key, events.c.seq == first - 1)
                )
        slices.append(ChainSlice(key, first, last, str(anchor)))
    return slices


async def export_lines(
    app: App,
    slices: list[ChainSlice],
    *,
    since: int | None = None,
    until: int | None = None,
) -> AsyncIterator[str]:
    """The lines of an export of ``slices``, one at a time."""
    yield _line(
        {
            "kind": "header",
            "format": FORMAT,
            "version": VERSION,
            "exported_at": to_rfc3339(app.clock.now_ms()),
            "since": to_rfc3339(since),
            "until": to_rfc3339(until),
            "hash": "sha256(previous_hash_hex || canonical_json(record))",
        }
    )
    ends: dict[str, dict[str, Any]] = {}
    for piece in slices:
        yield _line(
            {
                "kind": "anchor",
                "chain": piece.chain,
                "seq": piece.first - 1,
                "hash": piece.anchor_hash,
            }
        )
        last_hash, written = piece.anchor_hash, 0
        async for row in stored_events(app, piece.chain, piece.first, piece.last):
            written += 1
            item: dict[str, Any] = {"kind": "event"}
            for name in RECORD_FIELDS:
                item[name] = row[name]
            item["details"] = json.loads(row["details"])
            item["admin_override"] = bool(row["admin_override"])
            item["hash"] = last_hash = row["hash"]
            yield _line(item)
        if written != piece.size:
            raise TrailChanged(
                f"chain {piece.chain} lost events {piece.first}..{piece.last} while it was "
                "exported (a retention sweep?); export again"
            )
        ends[piece.chain] = {"last_seq": piece.last, "hash": last_hash}
    yield _line({"kind": "end", "events": sum(p.size for p in slices), "chains": ends})
