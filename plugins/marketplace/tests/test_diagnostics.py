"""The disk reserve at publish, and failed materializations: reported by
the worker with a reason's code, recorded, counted, and shown to the
space's admins."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from buildmax_audit.tables import events as audit_events
from buildmax_marketplace import diagnostics
from buildmax_marketplace.materialize import REASONS, MaterializationFailed
from buildmax_marketplace.tables import materialization_failures, plugins, releases
from buildmax_tasks.tables import attempts
from click.testing import CliRunner

from buildmax.cli import _register_commands, cli
from buildmax.client import TOKEN_ENV, URL_ENV
from buildmax.tables import idempotency_receipts

from .archives import SKILL_ONLY, tar_gz
from .conftest import PROBLEM

SKILLS = "notes"
PLENTY = 10**15
DAY_S = 24 * 3600


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch, tmp_path):
    for name in (URL_ENV, TOKEN_ENV, "GITHUB_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def free(market: Any, n: int) -> None:
    """Make every volume report ``n`` free bytes."""
    market.app.disk.free_space = lambda path: n


def files_under(root: Path) -> list[str]:
    """Every file under ``root`` (stored blobs, spooled uploads, temporary files)."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


async def everything(market: Any) -> dict[str, Any]:
    """What a publish could change: catalog rows, audit events, receipts,
    stored blobs and spooled files."""
    return {
        "plugins": await market.rows(plugins),
        "releases": await market.rows(releases),
        "audit": len(await market.rows(audit_events)),
        "receipts": await market.rows(idempotency_receipts),
        "files": files_under(market.app.settings.data_path),
    }


async def publish(market: Any, archive: bytes, *, declared: bool, key: str | None = None) -> Any:
    """Publish ``archive`` as ``notes`` as the admin, with or without ``Content-Length``."""
    headers = {**market.admin.headers, "Content-Type": "application/octet-stream"}
    if declared:
        headers["Content-Length"] = str(len(archive))
    if key is not None:
        headers["Idempotency-Key"] = key
    return await market.client.post(f"/v1/catalog/{SKILLS}/releases", data=archive, headers=headers)


async def test_a_publish_that_would_cross_the_disk_reserve_is_507_and_changes_nothing(
    market, tmp_path
):
    archive = tar_gz(tmp_path / "s.tar.gz", SKILL_ONLY).read_bytes()
    before = await everything(market)
    free(market, 10)
    for declared in (True, False):
        refused = await publish(market, archive, declared=declared, key="publish-1")
        problem = await refused.get_json()
        assert refused.status_code == 507, problem
        assert problem["type"] == PROBLEM + "disk-reserve-reached"
        assert await everything(market) == before

    free(market, PLENTY)
    made = await publish(market, archive, declared=True, key="publish-1")
    assert made.status_code == 201, await made.get_json()


async def test_claims_and_renewals_go_on_while_publishing_is_refused(market, tmp_path):
    base = f"/v1/spaces/{market.space.id}"
    await market.call("POST", f"{base}/projects", market.owner, json={"name": "main"}, expect=201)
    free(market, 10)
    archive = tar_gz(tmp_path / "s.tar.gz", SKILL_ONLY)
    await market.publish(archive, SKILLS, expect=507, problem="disk-reserve-reached")
    task = await market.call(
        "POST", f"{base}/tasks", market.owner, json={"project": "main", "title": "t"}, expect=201
    )
    claim = await market.call(
        "POST", f"{base}/tasks/{task['id']}/claim", market.agent, json={}, expect=201
    )
    await market.call(
        "POST",
        f"{base}/attempts/{claim['attempt']['id']}/renew",
        claim["token"],
        json={"generation": 1},
        expect=200,
    )


@pytest.fixture
async def run(market, tmp_path):
    """An agent naming ``notes`` and a claimed attempt of its task: (claim
    answer, the release)."""
    base = f"/v1/spaces/{market.space.id}"
    published = await market.publish(tar_gz(tmp_path / "s.tar.gz", SKILL_ONLY), SKILLS)
    await market.call("POST", f"{base}/projects", market.owner, json={"name": "main"}, expect=201)
    body = {"name": "scribe", "instructions": "", "plugins": [SKILLS]}
    await market.call("POST", f"{base}/agents", market.owner, json=body, expect=201)
    return await market.claim_new(base, "write", "scribe"), published


def failures_counted(app: Any, reason: str) -> float:
    value = app.metrics.registry.get_sample_value(
        "buildmax_materializations_failed_total", {"reason": reason}
    )
    return value or 0.0


async def failed_items(app: Any, space_pk: int | None = None) -> list[Any]:
    async with app.db.read() as conn:
        items = await app.hooks.attention(conn, app.clock.now_ms(), space_pk)
    return [item for item in items if item.kind == "materialization.failed"]


async def test_a_failed_materialization_is_recorded_counted_and_shown_to_the_spaces_admins(
    market, run, live_server, tmp_path, clock
):
    claim, published = run
    attempt = claim["attempt"]["id"]
    blob = market.app.settings.data_path / "blobs" / "marketplace" / "sha256" / published["sha256"]
    data = bytearray(blob.read_bytes())
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    before = failures_counted(market.app, "download")

    _register_commands()
    argv = ["run", "materialize", "--attempt", attempt, "--home", str(tmp_path / "home")]
    argv += ["--url", live_server, "--token", claim["token"]]
    result = await asyncio.to_thread(CliRunner().invoke, cli, argv, catch_exceptions=False)
    assert result.exit_code == 1 and "materialization failed" in result.stderr
    assert "warning" not in result.stderr

    (row,) = await market.rows(materialization_failures)
    assert (row["attempt_id"], row["space_id"], row["reason"]) == (
        attempt,
        market.space.pk,
        "download",
    )
    assert row["reported_by"] == market.agent.pk
    assert failures_counted(market.app, "download") == before + 1
    (audited,) = await market.audited("run.materialization_failed")
    assert (audited["target_type"], audited["target_id"]) == ("attempt", attempt)
    (attempt_row,) = await market.rows(attempts)
    assert attempt_row["state"] == "failed"  # reported first, then failed, as before

    (item,) = await failed_items(market.app)
    assert (item.role, item.space_pk, item.target) == (
        "admin",
        market.space.pk,
        ("attempt", attempt),
    )
    assert item.since == row["created_at"]
    assert "download" in item.summary and attempt in item.summary
    assert await failed_items(market.app, market.space.pk) == [item]
    assert await failed_items(market.app, market.space.pk + 1000) == []
    # Only the space's admins (and owners) see it.
    seen = await market.call(
        "GET", f"/v1/spaces/{market.space.id}/attention", market.owner, expect=200
    )
    assert "materialization.failed" in {i["kind"] for i in seen["items"]}
    hidden = await market.call(
        "GET", f"/v1/spaces/{market.space.id}/attention", market.agent, expect=200
    )
    assert "materialization.failed" not in {i["kind"] for i in hidden["items"]}

    clock.advance(seconds=DAY_S + 1)  # a day later it is history, not news
    assert await failed_items(market.app) == []
    assert len(await market.rows(materialization_failures)) == 1


async def test_a_failure_is_reported_with_a_code_by_the_runs_own_token_once(market, run):
    claim, _ = run
    attempt = claim["attempt"]["id"]
    path = f"/v1/attempts/{attempt}/materialization-failures"
    before = failures_counted(market.app, "digest")
    await market.call(
        "POST",
        path,
        claim["token"],
        json={"reason": "it broke"},
        expect=422,
        problem="validation-error",
    )
    await market.call("POST", path, market.owner, json={"reason": "digest"}, expect=404)
    await market.call(
        "POST",
        "/v1/attempts/at_someone_else/materialization-failures",
        claim["token"],
        json={"reason": "digest"},
        expect=404,
    )
    for _ in range(2):  # a retry with the same key is answered from its receipt
        made = await market.call(
            "POST", path, claim["token"], json={"reason": "digest"}, key="report-1", expect=201
        )
        assert (made["attempt_id"], made["reason"]) == (attempt, "digest")
    # The claimant's own token may report too.
    await market.call("POST", path, market.agent, json={"reason": "local"}, expect=201)
    rows = await market.rows(materialization_failures)
    assert sorted(r["reason"] for r in rows) == ["digest", "local"]
    assert failures_counted(market.app, "digest") == before + 1

    # An attempt that ended takes no report.
    await market.call(
        "POST",
        f"/v1/spaces/{market.space.id}/attempts/{attempt}/fail",
        claim["token"],
        json={"generation": 1, "reason": "gave up"},
        expect=200,
    )
    await market.call("POST", path, market.agent, json={"reason": "digest"}, expect=409)
    assert len(await market.rows(materialization_failures)) == 2


async def test_the_attention_list_is_bounded_oldest_first(market, run, clock, monkeypatch):
    claim, _ = run
    path = f"/v1/attempts/{claim['attempt']['id']}/materialization-failures"
    for reason in ("listing", "download", "digest"):
        await market.call("POST", path, claim["token"], json={"reason": reason}, expect=201)
        clock.advance(seconds=1)
    monkeypatch.setattr(diagnostics, "MAX_ITEMS", 2)
    items = await failed_items(market.app)
    assert ["listing" in items[0].summary, "download" in items[1].summary] == [True, True]
    assert len(items) == 2


@pytest.mark.engine_independent
def test_every_failure_has_a_known_reason():
    assert set(REASONS) == {"listing", "download", "digest", "package", "server", "local"}
    assert MaterializationFailed("x", reason="digest").reason == "digest"
    with pytest.raises(ValueError, match="reason"):
        MaterializationFailed("x", reason="mystery")
