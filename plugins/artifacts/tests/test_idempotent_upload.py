"""A retried upload with the same ``Idempotency-Key`` stores and charges
nothing twice: the key is claimed before any quota is reserved, kept with
the artifact, and replayed; other bytes under the key are refused, and a
duplicate arriving while the first still streams is 409."""

from __future__ import annotations

import asyncio
import json

from buildmax_artifacts.tables import artifacts, quotas

from buildmax.tables import idempotency_receipts

from .conftest import PROBLEM, sha

DATA = b"the build log\n" * 100


async def used(shelf) -> dict[str, int]:
    return {row["scope"]: row["used"] for row in await shelf.rows(quotas)}


async def test_a_retry_with_the_same_key_and_bytes_answers_the_first_artifact(shelf, audit_log):
    first = await shelf.upload(DATA, key="up-1")
    charged = await used(shelf)
    blobs = shelf.blob_files()
    again = await shelf.upload(DATA, key="up-1")
    assert again == first
    assert [row["public_id"] for row in await shelf.rows(artifacts)] == [first["id"]]
    assert await used(shelf) == charged and sum(charged.values()) >= len(DATA)
    assert shelf.blob_files() == blobs
    assert len(audit_log.of("artifact.uploaded")) == 1
    (receipt,) = await shelf.rows(idempotency_receipts)
    assert (receipt["status"], json.loads(receipt["body"])["body"]["id"]) == (201, first["id"])


async def test_the_replay_says_so_and_a_digest_named_in_the_query_is_part_of_the_request(shelf):
    first = await shelf.upload(DATA, key="up-2", sha256=sha(DATA))
    response = await shelf.client.post(
        shelf.base,
        data=DATA,
        headers={**shelf.member.headers, "Content-Type": "text/plain", "Idempotency-Key": "up-2"},
        query_string={"name": "log.txt", "sha256": sha(DATA)},
    )
    assert response.status_code == 201
    assert response.headers["Idempotent-Replayed"] == "true"
    assert (await response.get_json())["id"] == first["id"]
    other = b"other bytes"
    refused = await shelf.upload(other, key="up-2", sha256=sha(other), expect=422)
    assert refused["type"] == PROBLEM + "idempotency-key-reused"


async def test_other_bytes_under_the_same_key_are_refused_and_change_nothing(shelf):
    await shelf.upload(DATA, key="up-3")
    before = await shelf.leftovers()
    charged = await used(shelf)
    refused = await shelf.upload(b"x" * len(DATA), key="up-3", expect=422)
    assert refused["type"] == PROBLEM + "idempotency-key-reused"
    assert await shelf.leftovers() == before and await used(shelf) == charged


async def test_a_duplicate_while_the_first_still_streams_is_409_and_the_first_completes(shelf):
    release = asyncio.Event()
    sent = iter(
        [
            {"type": "http.request", "body": DATA[:100], "more_body": True},
            {"type": "http.request", "body": DATA[100:], "more_body": False},
        ]
    )

    async def receive() -> dict[str, object]:
        message = next(sent, None)
        if message is None:
            await asyncio.Future()  # the client waits for its answer
        if not message["more_body"]:
            await release.wait()  # the rest of the body is still on the way
        return message

    first = asyncio.create_task(shelf.raw_upload(receive, "log.txt", len(DATA), key="up-4"))
    for _ in range(200):  # until the first holds the key
        if await shelf.rows(idempotency_receipts):
            break
        await asyncio.sleep(0.01)
    duplicate = await shelf.upload(DATA, key="up-4", expect=409)
    assert duplicate["type"] == PROBLEM + "idempotency-in-progress"
    release.set()
    answers = await first
    [start] = [a for a in answers if a["type"] == "http.response.start"]
    assert start["status"] == 201
    body = json.loads(
        b"".join(a.get("body", b"") for a in answers if a["type"] == "http.response.body")
    )
    assert [row["public_id"] for row in await shelf.rows(artifacts)] == [body["id"]]
    replay = await shelf.upload(DATA, key="up-4")
    assert replay["id"] == body["id"]


async def test_a_failed_upload_leaves_its_key_free_for_the_retry(shelf):
    refused = await shelf.upload(DATA, key="up-5", sha256=sha(b"something else"), expect=422)
    assert refused["type"] == PROBLEM + "digest-mismatch"
    assert await shelf.rows(idempotency_receipts) == []
    made = await shelf.upload(DATA, key="up-5", sha256=sha(DATA))
    assert [row["public_id"] for row in await shelf.rows(artifacts)] == [made["id"]]


async def test_a_key_another_server_process_holds_is_409_and_stores_nothing(shelf):
    """The receipt a request writes before it streams holds the key for
    every process sharing the database, not only this one."""
    now = shelf.app.clock.now_ms()
    async with shelf.app.db.write() as tx:
        await tx.execute(
            idempotency_receipts.insert().values(
                principal_id=shelf.member.pk,
                method="POST",
                path=shelf.base,
                key="up-6",
                fingerprint="whatever the other request was",
                status=0,
                body="",
                created_at=now,
                expires_at=now + 60_000,
            )
        )
    before = await shelf.leftovers()
    held = await shelf.upload(DATA, key="up-6", expect=409)
    assert held["type"] == PROBLEM + "idempotency-in-progress"
    assert await shelf.leftovers() == before
    shelf.app.clock.advance(seconds=16 * 60)  # the holder died mid-upload long ago
    made = await shelf.upload(DATA, key="up-6")
    assert [row["public_id"] for row in await shelf.rows(artifacts)] == [made["id"]]
