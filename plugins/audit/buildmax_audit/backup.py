"""The audit trail in a backup: its chain heads are recorded in the
manifest, and a backup's (or a restored) database must verify up to them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import App, Transaction

from .tables import chains
from .verify import verify_database


async def chain_heads_in(conn: Transaction) -> dict[str, Any]:
    """Every chain's head, read through ``conn`` (the backup's snapshot)."""
    rows = await conn.fetch_all(
        sa.select(chains.c.chain, chains.c.seq, chains.c.head_hash).order_by(chains.c.chain)
    )
    return {
        "chains": {r["chain"]: {"seq": int(r["seq"]), "head_hash": r["head_hash"]} for r in rows}
    }


async def check_heads(app: App, facts: Mapping[str, Any]) -> list[str]:
    """Every chain verifies and ends at the head the manifest recorded."""
    recorded = facts.get("chains")
    if not isinstance(recorded, Mapping):
        return ["the manifest records no audit chain heads"]
    problems = []
    reports = {report.chain: report for report in await verify_database(app)}
    for chain, report in sorted(reports.items()):
        if not report.ok:
            problems.append(
                f"audit chain {chain} breaks at event {report.broken_seq}: {report.cause}"
            )
    async with app.db.read() as conn:
        heads = {
            r["chain"]: (int(r["seq"]), r["head_hash"])
            for r in await conn.fetch_all(
                sa.select(chains.c.chain, chains.c.seq, chains.c.head_hash)
            )
        }
    for chain in sorted(set(heads) | set(recorded)):
        head = recorded.get(chain)
        expected = (
            None if not isinstance(head, Mapping) else (head.get("seq"), head.get("head_hash"))
        )
        if heads.get(chain) != expected:
            problems.append(
                f"audit chain {chain} ends at {heads.get(chain, 'nothing')} where the manifest "
                f"recorded {expected or 'no chain'}"
            )
    return problems
