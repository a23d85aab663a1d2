"""Publishing with an ``Idempotency-Key``: a retry with the same bytes
answers the first answer and stores nothing twice; other bytes under the
key are 422; a key another request holds is 409."""

from __future__ import annotations

from buildmax_marketplace.tables import releases

from buildmax.tables import idempotency_receipts

from .archives import tar_gz, zip_file
from .conftest import PROBLEM

NAME = "lint-helpers"


async def test_a_retry_with_the_same_key_answers_the_first_publish(market, tmp_path):
    archive = tar_gz(tmp_path / "r.tar.gz")
    made = await market.publish(archive, NAME, key="pub-1")
    response = await market.client.post(
        f"/v1/catalog/{NAME}/releases",
        data=archive.read_bytes(),
        headers={
            **market.admin.headers,
            "Content-Type": "application/octet-stream",
            "Idempotency-Key": "pub-1",
        },
    )
    assert response.status_code == 201  # the first answer, not the 200 of a new publish
    assert response.headers["Idempotent-Replayed"] == "true"
    assert await response.get_json() == made
    assert len(await market.rows(releases)) == 1
    assert len(await market.audited("catalog.release.published")) == 1
    assert not list((market.app.settings.data_path / "tmp").iterdir())


async def test_other_bytes_under_the_key_are_refused_and_nothing_is_stored(market, tmp_path):
    await market.publish(tar_gz(tmp_path / "r.tar.gz"), NAME, key="pub-2")
    other = zip_file(tmp_path / "r.zip")
    await market.publish(other, NAME, key="pub-2", expect=422, problem="idempotency-key-reused")
    assert len(await market.rows(releases)) == 1
    assert not list((market.app.settings.data_path / "tmp").iterdir())


async def test_a_key_held_by_a_request_still_streaming_is_409(market, tmp_path):
    now = market.app.clock.now_ms()
    async with market.app.db.write() as tx:
        await tx.execute(
            idempotency_receipts.insert().values(
                principal_id=market.admin.pk,
                method="POST",
                path=f"/v1/catalog/{NAME}/releases",
                key="pub-3",
                fingerprint="the other request",
                status=0,
                body="",
                created_at=now,
                expires_at=now + 60_000,
            )
        )
    held = await market.publish(tar_gz(tmp_path / "r.tar.gz"), NAME, key="pub-3", expect=409)
    assert held["type"] == PROBLEM + "idempotency-in-progress"
    assert await market.rows(releases) == []


async def test_a_refused_publish_leaves_its_key_free(market, tmp_path):
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(b"not an archive")
    await market.publish(broken, NAME, key="pub-4", expect=422, problem="package-invalid")
    assert await market.rows(idempotency_receipts) == []
    await market.publish(tar_gz(tmp_path / "r.tar.gz"), NAME, key="pub-4")
