"""The disk reserve at upload, the artifacts' gauges and the sweep's
failure counter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from buildmax_artifacts import diagnostics, retention
from buildmax_artifacts.tables import quotas
from buildmax_hookspecs import BlobStoreUnavailable

from buildmax.tables import idempotency_receipts
from buildmax.testing import call

from .conftest import MAX_BYTES, PROBLEM, QUOTA_BYTES

DATA = b"build log\n" * 100
PLENTY = 10**15


def free(shelf: Any, n: int) -> None:
    """Make every volume report ``n`` free bytes."""
    shelf.app.disk.free_space = lambda path: n


async def post(shelf: Any, data: bytes, *, declared: bool, key: str | None = None) -> Any:
    """Upload ``data`` as the member, with or without ``Content-Length``."""
    headers = {**shelf.member.headers, "Content-Type": "text/plain"}
    if declared:
        headers["Content-Length"] = str(len(data))
    if key is not None:
        headers["Idempotency-Key"] = key
    return await shelf.client.post(
        shelf.base, data=data, headers=headers, query_string={"name": "log.txt"}
    )


async def everything(shelf: Any) -> dict[str, Any]:
    """What an upload could change: artifacts, reservations, quotas, blobs,
    idempotency receipts and temporary files."""
    tmp = Path(shelf.app.settings.data_dir) / "tmp"
    return {
        **await shelf.leftovers(),
        "quotas": sorted(map(repr, await shelf.rows(quotas))),
        "receipts": await shelf.rows(idempotency_receipts),
        "tmp": sorted(p.name for p in tmp.rglob("*")) if tmp.exists() else [],
    }


async def test_an_upload_that_would_cross_the_disk_reserve_is_507_and_changes_nothing(shelf):
    await shelf.upload(b"an earlier artifact")
    before = await everything(shelf)
    free(shelf, 10)
    for declared in (True, False):
        refused = await post(shelf, DATA, declared=declared, key="upload-1")
        problem = await refused.get_json()
        assert refused.status_code == 507, problem
        assert problem["type"] == PROBLEM + "disk-reserve-reached"
        assert "reserve" in problem["detail"]
        assert await everything(shelf) == before

    # Room again: the same key was never claimed, so the upload is stored now.
    free(shelf, PLENTY)
    stored = await post(shelf, DATA, declared=True, key="upload-1")
    assert stored.status_code == 201, await stored.get_json()


async def test_a_body_of_unknown_length_needs_room_for_its_limit(shelf):
    free(shelf, shelf.app.disk.min_free + MAX_BYTES - 1)
    assert (await post(shelf, DATA, declared=True)).status_code == 201
    refused = await post(shelf, DATA, declared=False)
    assert refused.status_code == 507
    free(shelf, shelf.app.disk.min_free + MAX_BYTES)
    assert (await post(shelf, DATA, declared=False)).status_code == 201


async def test_claims_renewals_and_reads_go_on_while_uploads_are_refused(shelf):
    made = await shelf.upload(DATA)
    free(shelf, 10)
    base = f"/v1/spaces/{shelf.space.id}"
    await call(
        shelf.client, "POST", f"{base}/projects", shelf.owner, json={"name": "p"}, expect=201
    )
    task = await call(
        shelf.client,
        "POST",
        f"{base}/tasks",
        shelf.owner,
        json={"project": "p", "title": "t"},
        expect=201,
    )
    claim = await call(
        shelf.client, "POST", f"{base}/tasks/{task['id']}/claim", shelf.member, json={}, expect=201
    )
    await call(
        shelf.client,
        "POST",
        f"{base}/attempts/{claim['attempt']['id']}/renew",
        claim["token"],
        json={"generation": 1},
        expect=200,
    )
    shown = await call(shelf.client, "GET", f"{shelf.base}/{made['id']}", shelf.member, expect=200)
    assert shown["size"] == len(DATA)
    await shelf.upload(DATA, expect=507)


async def gauges(app: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The artifacts plugin's gauges now, by (name, labels)."""
    async with app.db.read() as conn:
        found = await app.hooks.gauges(conn)
    return {(g.name, g.labels): g.value for plugin, g in found if plugin == "artifacts"}


def space(slug: str) -> tuple[tuple[str, str], ...]:
    return (("space", slug),)


async def test_bytes_stored_per_space_against_the_quotas(shelf, monkeypatch):
    mine = await shelf.upload(DATA)
    await shelf.upload(b"x" * 300)
    theirs = f"/v1/spaces/{shelf.other_space.id}/artifacts"
    answer = await shelf.client.post(
        theirs,
        data=b"y" * 5000,
        headers={**shelf.outsider.headers, "Content-Type": "text/plain"},
        query_string={"name": "big.bin"},
    )
    assert answer.status_code == 201
    mine_bytes, theirs_bytes = len(DATA) + 300, 5000
    assert await gauges(shelf.app) == {
        ("buildmax_artifact_bytes", space(shelf.other_space.slug)): theirs_bytes,
        ("buildmax_artifact_bytes", space(shelf.space.slug)): mine_bytes,
        ("buildmax_artifact_bytes", space(diagnostics.OTHER_SPACES)): 0,
        # No per-space quota is set: a space may use the deployment's.
        ("buildmax_artifact_quota_bytes", space(shelf.other_space.slug)): QUOTA_BYTES,
        ("buildmax_artifact_quota_bytes", space(shelf.space.slug)): QUOTA_BYTES,
        ("buildmax_artifact_deployment_bytes", ()): mine_bytes + theirs_bytes,
        ("buildmax_artifact_deployment_quota_bytes", ()): QUOTA_BYTES,
    }

    # The bound (50 spaces) is 1 here: the other space is summed.
    monkeypatch.setattr(diagnostics, "MAX_SPACES", 1)
    bounded = await gauges(shelf.app)
    assert {k: v for k, v in bounded.items() if k[0] != "buildmax_artifact_deployment_bytes"} == {
        ("buildmax_artifact_bytes", space(shelf.other_space.slug)): theirs_bytes,
        ("buildmax_artifact_bytes", space(diagnostics.OTHER_SPACES)): mine_bytes,
        ("buildmax_artifact_quota_bytes", space(shelf.other_space.slug)): QUOTA_BYTES,
        ("buildmax_artifact_deployment_quota_bytes", ()): QUOTA_BYTES,
    }

    # A deleted artifact's bytes are no longer counted.
    await call(shelf.client, "DELETE", f"{shelf.base}/{mine['id']}", shelf.member, expect=204)
    after = await gauges(shelf.app)
    assert after[("buildmax_artifact_bytes", space(diagnostics.OTHER_SPACES))] == 300
    assert after[("buildmax_artifact_deployment_bytes", ())] == 300 + theirs_bytes


async def test_a_failed_sweep_is_counted_by_why(shelf, monkeypatch):
    def count(reason: str) -> float:
        value = shelf.app.metrics.registry.get_sample_value(
            "buildmax_artifact_sweep_failures_total", {"reason": reason}
        )
        return value or 0.0

    async def unreachable(*args: Any, **kwargs: Any) -> Any:
        raise BlobStoreUnavailable("the store did not answer")

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    await retention.sweep(shelf.app)
    assert (count("blob_store"), count("error")) == (0, 0)
    monkeypatch.setattr(retention, "collect", unreachable)
    await retention.sweep(shelf.app)
    assert (count("blob_store"), count("error")) == (1, 0)
    monkeypatch.setattr(retention, "collect", broken)
    await retention.sweep(shelf.app)
    assert (count("blob_store"), count("error")) == (1, 1)
