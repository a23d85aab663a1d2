"""Tampering is detected, exports verify offline, retention keeps the trail
verifiable: ``buildmax audit verify|export|sweep`` and ``GET /v1/audit/verify``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_audit.retention import DAY_MS, sweep
from buildmax_audit.schema import SYSTEM_CHAIN, chains, events
from buildmax_audit.settings import AuditSettings, audit_settings
from buildmax_audit.verify import verify_database
from buildmax_hookspecs import SYSTEM_ACTOR

from .conftest import heads, rename, tamper, trail


@pytest.fixture
async def space(app, admin, make_space):
    """A space whose chain holds events 1..6 (renames n1..n6); the system
    chain holds one event."""
    made = await make_space(admin, "tampered")
    await rename(app, made.id, *(f"n{i}" for i in range(1, 7)))
    async with app.db.write() as tx:
        await app.audit.record(
            tx, SYSTEM_ACTOR, "principal.enabled", target_type="principal", target_id=admin.id
        )
    return made


def at(space: Any, seq: int) -> Any:
    return sa.and_(events.c.chain == space.id, events.c.seq == seq)


async def test_an_untouched_trail_verifies(app, client, admin, space, audit_cli):
    result = await audit_cli("verify")
    assert f"ok      {space.id}: 6 event(s), through 6" in result.output
    response = await client.get("/v1/audit/verify", headers=admin.headers)
    body = await response.get_json()
    assert body["ok"] is True
    assert {"chain": space.id, "ok": True, "events": 6, "last_seq": 6}.items() <= next(
        c for c in body["chains"] if c["chain"] == space.id
    ).items()


@pytest.mark.parametrize(
    ("how", "broken", "cause"),
    [
        ("update", 3, "do not match its hash"),
        ("delete", 3, "event 3 is missing (next is 4)"),
        ("reorder", 3, "do not match its hash"),
        ("delete-last", 6, "events 6..6 are missing"),
        ("head", 6, "recorded head does not match"),
    ],
)
async def test_tampering_is_reported_at_the_first_bad_sequence(
    app, client, admin, space, audit_cli, how, broken, cause
):
    if how == "update":
        await tamper(app, events.update().where(at(space, 3)).values(details='{"name":"evil"}'))
    elif how == "delete":
        await tamper(app, events.delete().where(at(space, 3)))
    elif how == "reorder":
        # Swap the positions of events 3 and 4 (through a free number).
        await tamper(app, events.update().where(at(space, 3)).values(seq=-1))
        await tamper(app, events.update().where(at(space, 4)).values(seq=3))
        await tamper(app, events.update().where(at(space, -1)).values(seq=4))
    elif how == "delete-last":
        await tamper(app, events.delete().where(at(space, 6)))
    else:
        await tamper(
            app, chains.update().where(chains.c.chain == space.id).values(head_hash="0" * 64)
        )
    result = await audit_cli("verify", expect=1)
    assert f"BROKEN  {space.id}: first bad sequence {broken}: " in result.output
    assert cause in result.output
    assert "1 of " in result.output and "do not verify" in result.output
    # Other chains are not affected.
    assert f"ok      {SYSTEM_CHAIN}:" in result.output

    body = await (await client.get("/v1/audit/verify", headers=admin.headers)).get_json()
    assert body["ok"] is False
    report = next(c for c in body["chains"] if c["chain"] == space.id)
    assert (report["ok"], report["broken_seq"]) == (False, broken)
    assert cause in report["cause"]


async def test_verify_is_for_system_admins(client, make_principal, space):
    operator = await make_principal("human", system_role="operator")
    response = await client.get("/v1/audit/verify", headers=operator.headers)
    assert response.status_code == 403


async def test_an_export_verifies_offline_and_tampering_with_it_is_detected(
    app, space, audit_cli, tmp_path
):
    out = tmp_path / "trail.jsonl"
    result = await audit_cli("export", "--output", str(out))
    total = len(await trail(app))
    assert f"exported {total} event(s)" in result.output
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["kind"] == "header" and lines[-1]["kind"] == "end"
    assert lines[-1]["events"] == total
    anchors = {line["chain"]: line for line in lines if line["kind"] == "anchor"}
    assert anchors[space.id] == {"kind": "anchor", "chain": space.id, "seq": 0, "hash": "0" * 64}

    verified = await audit_cli("verify", str(out), offline=True)
    assert f"ok      {space.id}: 6 event(s), through 6" in verified.output

    def rewrite(edit: Any, name: str) -> Path:
        changed = [edit(dict(line)) for line in lines]
        path = tmp_path / name
        path.write_text("".join(json.dumps(c) + "\n" for c in changed if c is not None))
        return path

    def edit_details(line: dict[str, Any]) -> dict[str, Any]:
        if line.get("chain") == space.id and line.get("seq") == 2 and line["kind"] == "event":
            line["details"] = {"name": "evil"}
        return line

    def drop_fifth(line: dict[str, Any]) -> dict[str, Any] | None:
        keep = not (line.get("chain") == space.id and line.get("seq") == 5)
        return line if keep or line["kind"] != "event" else None

    for edit, name, expected in (
        (edit_details, "edited.jsonl", f"{space.id}: first bad sequence 2"),
        (drop_fifth, "dropped.jsonl", f"{space.id}: first bad sequence 5"),
        (lambda line: None if line["kind"] == "end" else line, "cut.jsonl", "ends early"),
    ):
        broken = await audit_cli("verify", str(rewrite(edit, name)), expect=1, offline=True)
        assert expected in broken.output

    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not json\n")
    refused = await audit_cli("verify", str(garbage), expect=1, offline=True)
    assert "line 1 is not JSON" in refused.output
    garbage.write_text('{"kind": "event"}\n')
    refused = await audit_cli("verify", str(garbage), expect=1, offline=True)
    assert "does not start with an audit export header" in refused.output


async def test_an_export_of_one_space_and_a_time_window(app, clock, space, audit_cli, tmp_path):
    clock.advance(seconds=60)
    middle = clock.now_ms()
    await rename(app, space.id, "n7", "n8")
    clock.advance(seconds=60)
    await rename(app, space.id, "n9")
    from buildmax.clock import to_rfc3339

    out = tmp_path / "window.jsonl"
    await audit_cli(
        "export",
        "--space",
        "tampered",
        "--since",
        str(to_rfc3339(middle)),
        "--until",
        str(to_rfc3339(middle + 30_000)),
        "--output",
        str(out),
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    exported = [(line["chain"], line["seq"]) for line in lines if line["kind"] == "event"]
    assert exported == [(space.id, 7), (space.id, 8)]
    [anchor] = [line for line in lines if line["kind"] == "anchor"]
    [sixth] = await trail(app, events.c.chain == space.id, events.c.seq == 6)
    assert (anchor["seq"], anchor["hash"]) == (6, sixth["hash"])
    await audit_cli("verify", str(out), offline=True)

    await audit_cli("export", "--space", "nowhere", "--output", str(out), expect=1)
    await audit_cli("export", "--since", "yesterday", "--output", str(out), expect=2)


async def test_retention_keeps_the_chain_verifiable_and_is_audited(
    app, clock, space, audit_cli, tmp_path
):
    clock.advance(seconds=10 * 86400)
    await rename(app, space.id, "recent")
    old_sixth = (await trail(app, events.c.chain == space.id, events.c.seq == 6))[0]

    swept = await sweep(app, retention_days=5)
    assert any(s.chain == space.id and (s.removed, s.through_seq) == (6, 6) for s in swept)

    remaining = await trail(app, events.c.chain == space.id)
    assert [e["seq"] for e in remaining] == [7, 8]
    assert remaining[1]["action"] == "audit.retention.applied"
    assert remaining[1]["actor_kind"] == "system"
    assert remaining[1]["details"] == {
        "removed": 6,
        "through_seq": 6,
        "anchor_hash": old_sixth["hash"],
        "retention_days": 5,
    }
    head = (await heads(app))[space.id]
    assert (head["anchor_seq"], head["anchor_hash"]) == (6, old_sixth["hash"])
    assert all(report.ok for report in await verify_database(app))

    out = tmp_path / "after.jsonl"
    await audit_cli("export", "--space", space.id, "--output", str(out))
    await audit_cli("verify", str(out), offline=True)

    # A second sweep with nothing old enough removes nothing and says nothing.
    assert [s for s in await sweep(app, retention_days=5) if s.chain == space.id] == []
    # No retention configured: the sweep keeps everything.
    assert await sweep(app) == []
    result = await audit_cli("sweep")
    assert "Nothing to remove." in result.output


async def test_the_sweep_command_applies_retention(app, clock, admin, make_space, audit_cli):
    # The command runs on the real clock: these events are three days old.
    clock.advance(ms=-3 * DAY_MS)
    space = await make_space(admin)
    await rename(app, space.id, "old", "older")
    result = await audit_cli("sweep", "--retention-days", "1")
    assert f"{space.id}: removed 2 event(s) through 2" in result.output
    assert all(report.ok for report in await verify_database(app))


@pytest.mark.engine_independent
def test_retention_settings_are_checked(tmp_path):
    from buildmax.app import create_app
    from buildmax.config import Config, ConfigError

    def build(table: dict[str, Any]) -> Any:
        return create_app(Config(data_dir=str(tmp_path), plugins={"audit": table}))

    assert audit_settings(build({})) == AuditSettings(retention_days=0)
    assert audit_settings(build({"retention_days": 30})).retention_days == 30
    for table, message in (
        ({"retention_day": 30}, r"\[plugins.audit\]: unknown setting\(s\) retention_day"),
        ({"retention_days": -1}, "retention_days: expected an integer of at least 0"),
        ({"retention_days": "30"}, "retention_days: expected an integer"),
        ({"sweep_interval_seconds": 0}, "sweep_interval_seconds: expected at least 1"),
    ):
        with pytest.raises(ConfigError, match=message):
            build(table)


async def test_the_server_sweeps_on_its_own_when_retention_is_set(buildmax_database_url, tmp_path):
    from buildmax.app import create_app
    from buildmax.clock import ManualClock, SystemClock
    from buildmax.config import Config

    url = buildmax_database_url if buildmax_database_url.startswith("postgresql") else ""
    settings = Config(
        data_dir=str(tmp_path / "swept"),
        database_url=url,
        plugins={"audit": {"retention_days": 1, "sweep_interval_seconds": 1}},
    )
    clock = ManualClock(SystemClock().now_ms())
    app = create_app(settings, clock=clock, auto_migrate=True)
    async with app.test_app():
        await rename(app, "sp_swept", "old")
        clock.advance(ms=2 * DAY_MS)
        for _ in range(40):
            if (await heads(app))["sp_swept"]["anchor_seq"] == 1:
                break
            await asyncio.sleep(0.1)
        stored = await trail(app, events.c.chain == "sp_swept")
        assert [e["action"] for e in stored] == ["audit.retention.applied"]
        assert all(report.ok for report in await verify_database(app))
