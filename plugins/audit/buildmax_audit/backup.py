"""The audit trail in a backup: its chain heads are recorded in the
manifest, a backup's (or a restored) database must verify up to them, and
an export taken after the backup tells a restore what happened since."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import App, AuditEvent, Transaction

from .tables import chains
from .verify import ExportError, verify_database, verify_export


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


def events_after(path: str, facts: Mapping[str, Any]) -> list[AuditEvent]:
    """The events of the export at ``path`` recorded after the backup whose
    chain heads ``facts`` names, oldest first. ``ValueError`` when the file
    does not verify or does not continue the backup's chains."""
    try:
        with open(path, encoding="utf-8") as fh:
            reports = verify_export(fh)
    except OSError as exc:
        raise ValueError(f"cannot read the audit export {path}: {exc.strerror or exc}") from None
    except ExportError as exc:
        raise ValueError(f"{path} is not an audit export: {exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not an audit export: it is not UTF-8 text") from None
    broken = [r for r in reports if not r.ok]
    if broken:
        raise ValueError(
            f"the audit export {path} does not verify: chain {broken[0].chain} breaks at "
            f"event {broken[0].broken_seq} ({broken[0].cause})"
        )
    heads = facts.get("chains") if isinstance(facts.get("chains"), Mapping) else {}
    assert isinstance(heads, Mapping)
    joined: set[str] = set()
    later: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            item = json.loads(line) if line.strip() else {}
            chain = item.get("chain")
            if item.get("kind") not in ("anchor", "event") or not isinstance(chain, str):
                continue
            head = heads.get(chain)
            if head is None:
                if item["kind"] == "event":
                    later.append(item)  # a chain begun after the backup
                continue
            if item.get("seq") == head["seq"] and item.get("hash") == head["head_hash"]:
                joined.add(chain)
            elif item["kind"] == "event" and item.get("seq", 0) > head["seq"]:
                later.append(item)
    unjoined = sorted(c for c, head in heads.items() if head["seq"] > 0 and c not in joined)
    if unjoined:
        raise ValueError(
            f"the audit export {path} does not continue the backup's audit chain {unjoined[0]}: "
            "export the trail after the backup, from the deployment it was taken of, covering "
            "its last event (buildmax audit export --since <the backup's time>)"
        )
    later.sort(key=lambda item: (item["time"], item["chain"], item["seq"]))
    return [_event(item) for item in later]


def _event(item: Mapping[str, Any]) -> AuditEvent:
    details = item["details"]
    return AuditEvent(
        time=item["time"],
        action=item["action"],
        actor_id=item["actor_id"],
        actor_kind=item["actor_kind"],
        space_id=item["space_id"],
        target_type=item["target_type"],
        target_id=item["target_id"],
        details=json.loads(details) if isinstance(details, str) else dict(details),
        acting_through=item["acting_through"],
        request_id=item["request_id"],
        admin_override=bool(item["admin_override"]),
    )
