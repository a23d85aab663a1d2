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
from buildmax_audit.settings import AuditSettings, audit_settings
from buildmax_audit.tables import SYSTEM_CHAIN, chains, events
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


async def test_verifying_a_trail_that_is_being_written_reports_no_false_break(
    app, admin, make_space
):
    space = await make_space(admin)
    await rename(app, space.id, *(f"n{i}" for i in range(30)))
    writing = True

    async def writer() -> None:
        index = 0
        while writing:
            await rename(app, space.id, f"w{index}")
            index += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(writer())
    try:
        found = []
        for _ in range(15):
            found += [r.body() for r in await verify_database(app) if not r.ok]
    finally:
        writing = False
        await task
    assert found == []


async def test_a_sweep_during_verification_restarts_the_chain_from_its_new_anchor(
    app, clock, space, monkeypatch
):
    import buildmax_audit.verify as verify_module

    clock.advance(ms=10 * DAY_MS)
    await rename(app, space.id, "recent")
    read = verify_module.stored_events
    swept: list[Any] = []

    async def sweep_first(*args: Any, **kwargs: Any) -> Any:
        if not swept:
            swept.append(await sweep(app, retention_days=5))
        async for row in read(*args, **kwargs):
            yield row

    monkeypatch.setattr(verify_module, "stored_events", sweep_first)
    reports = await verify_database(app, space.id)
    assert swept and [r.body() for r in reports if not r.ok] == []
    assert reports[0].anchor_seq == 6


async def test_an_export_that_loses_events_to_a_sweep_fails(
    app, clock, space, monkeypatch, tmp_path
):
    import buildmax_audit.export as export_module

    clock.advance(ms=10 * DAY_MS)
    plan = export_module.plan

    async def plan_then_sweep(*args: Any, **kwargs: Any) -> Any:
        slices = await plan(*args, **kwargs)
        await sweep(app, retention_days=5)
        return slices

    monkeypatch.setattr(export_module, "plan", plan_then_sweep)
    slices = await export_module.plan(app)
    with pytest.raises(export_module.TrailChanged, match="lost events"):
        async for _ in export_module.export_lines(app, slices):
            pass


async def test_an_anchor_moved_without_a_retention_sweep_is_reported(app, space, audit_cli):
    [third] = await trail(app, at(space, 3))
    await tamper(app, events.delete().where(events.c.chain == space.id, events.c.seq <= 3))
    await tamper(
        app,
        chains.update()
        .where(chains.c.chain == space.id)
        .values(anchor_seq=3, anchor_hash=third["hash"]),
    )
    result = await audit_cli("verify", expect=1)
    assert f"{space.id}: first bad sequence 3: the anchor (event 3) was not set" in result.output


async def test_events_without_a_chain_head_are_reported(app, space, audit_cli):
    await tamper(app, chains.delete().where(chains.c.chain == space.id))
    result = await audit_cli("verify", expect=1)
    assert f"{space.id}: first bad sequence 1: the chain has events but no head" in result.output


async def test_forged_and_malformed_exports_are_refused(app, space, audit_cli, tmp_path):
    out = tmp_path / "trail.jsonl"
    await audit_cli("export", "--output", str(out))
    lines = [json.loads(line) for line in out.read_text().splitlines()]

    async def check(name: str, changed: list[dict[str, Any]], expected: str) -> None:
        path = tmp_path / name
        path.write_text("".join(json.dumps(line) + "\n" for line in changed))
        result = await audit_cli("verify", str(path), expect=1, offline=True)
        assert expected in result.output, result.output

    mine = [i for i, line in enumerate(lines) if line.get("chain") == space.id]
    anchor, third = lines[mine[0]], lines[mine[3]]
    forged = [
        {**anchor, "chain": "sp_forged"},
        {**third, "chain": "sp_forged", "seq": 1},
    ]
    await check("forged.jsonl", lines[:-1] + forged + lines[-1:], "sp_forged: first bad sequence")
    await check(
        "twice.jsonl", [*lines[: mine[3] + 1], third, *lines[mine[3] + 1 :]], "first bad sequence 4"
    )
    await check("anchors.jsonl", [*lines[:-1], anchor, *lines[-1:]], "a second anchor")
    await check(
        "count.jsonl", [*lines[:-1], {**lines[-1], "events": 999}], "end line counts 999 events"
    )
    await check(
        "seq.jsonl",
        [*lines[: mine[0]], {**anchor, "seq": "abc"}, *lines[mine[0] + 1 :]],
        "an anchor needs a chain, a seq and a hash",
    )
    nan = out.read_text().replace('"details":{"name":"n2"}', '"details":{"name":NaN}')
    (tmp_path / "nan.jsonl").write_text(nan)
    result = await audit_cli("verify", str(tmp_path / "nan.jsonl"), expect=1, offline=True)
    assert "not plain JSON" in result.output


async def test_retention_keeps_an_event_recorded_at_the_horizon(app, clock, admin, make_space):
    space = await make_space(admin)
    clock.now_ms()
    await rename(app, space.id, "older")
    clock.advance(ms=1)
    await rename(app, space.id, "at the horizon")
    clock.advance(ms=DAY_MS)  # the second event is exactly at the horizon now
    [swept] = [s for s in await sweep(app, retention_days=1) if s.chain == space.id]
    assert (swept.removed, swept.through_seq) == (1, 1)
    kept = await trail(app, events.c.chain == space.id)
    assert [e["details"].get("name") for e in kept] == ["at the horizon", None]


async def test_export_refuses_what_it_cannot_write(app, space, audit_cli, tmp_path):
    missing = tmp_path / "no" / "such" / "dir" / "trail.jsonl"
    result = await audit_cli("export", "--output", str(missing), expect=1)
    assert "cannot write" in result.output
    ancient = "0001-01-01T00:00:00+23:59"
    result = await audit_cli(
        "export", "--since", ancient, "--output", str(tmp_path / "x"), expect=2
    )
    assert "not an RFC 3339 time" in result.output
