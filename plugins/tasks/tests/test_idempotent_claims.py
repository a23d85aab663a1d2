"""J05: a claim whose answer is lost, retried with the same Idempotency-Key.

The retry answers with the same attempt and a fresh, working token; the
token of the lost answer (nobody saw it) is revoked; no second attempt
exists.
"""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlsplit

import httpx
import sqlalchemy as sa
from buildmax_tasks.tables import attempts, tasks

from buildmax.tables import idempotency_receipts, tokens

PROBLEM = "urn:buildmax:problem:"


async def send_and_drop(
    base: str, path: str, headers: dict[str, str], body: dict
) -> asyncio.StreamWriter:
    """Send a request on a raw connection; the caller closes it without
    reading a byte of the answer."""
    parts = urlsplit(base)
    payload = json.dumps(body).encode()
    head = [
        f"POST {path} HTTP/1.1",
        f"Host: {parts.netloc}",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        *(f"{name}: {value}" for name, value in headers.items()),
        "",
        "",
    ]
    _reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    writer.write("\r\n".join(head).encode() + payload)
    await writer.drain()
    return writer


async def wait_for_receipt(app, key: str, within: float = 10) -> dict:
    """The idempotency receipt for ``key``, once its transaction committed."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        async with app.db.read() as conn:
            row = await conn.fetch_one(
                sa.select(idempotency_receipts).where(idempotency_receipts.c.key == key)
            )
        if row is not None:
            return dict(row)
        await asyncio.sleep(0.02)
    raise AssertionError(f"no receipt for {key} within {within} s")


async def token_row(work, token_id: str) -> dict:
    [row] = await work.rows(tokens, tokens.c.public_id == token_id)
    return row


async def test_j05_a_dropped_claim_retried_with_its_key_returns_the_same_attempt(
    app, work, live_server, audit_log
):
    task = await work.task("claim me once")
    path = f"{work.base}/tasks/{task['id']}/claim"
    key = "claim-j05-dropped"
    headers = {**work.agent.headers, "Idempotency-Key": key}

    writer = await send_and_drop(live_server, path, headers, {"lease_seconds": 300})
    receipt = await wait_for_receipt(app, key)
    writer.close()  # the answer is never read
    await writer.wait_closed()
    assert receipt["status"] == 201
    [first] = await work.rows(attempts)
    lost_token_id = first["token_id"]
    # The receipt holds no secret.
    assert "bmx_" not in receipt["body"]

    async with httpx.AsyncClient(base_url=live_server, timeout=30) as http:
        retry = await http.post(path, headers=headers, json={"lease_seconds": 300})
        assert retry.status_code == 201
        assert retry.headers["Idempotent-Replayed"] == "true"
        body = retry.json()
        assert body["attempt"]["id"] == first["public_id"]
        assert body["attempt"]["generation"] == 1
        assert body["attempt"]["claimant_id"] == work.agent.id
        assert body["token_id"] != lost_token_id
        # The fresh token works for its attempt.
        renewed = await http.post(
            f"{work.base}/attempts/{first['public_id']}/renew",
            headers={"Authorization": f"Bearer {body['token']}"},
            json={"generation": 1},
        )
        assert renewed.status_code == 200, renewed.json()
        assert renewed.json()["renewed_at"] is not None

    # Durable: one attempt, which now names the fresh token; the lost one is revoked.
    rows = await work.rows(attempts)
    assert [(r["public_id"], r["token_id"], r["state"]) for r in rows] == [
        (first["public_id"], body["token_id"], "active")
    ]
    [task_row] = await work.rows(tasks, tasks.c.public_id == task["id"])
    assert (task_row["state"], task_row["generation"]) == ("claimed", 1)
    assert (await token_row(work, lost_token_id))["revoked_at"] is not None
    fresh = await token_row(work, body["token_id"])
    assert (fresh["revoked_at"], fresh["scope_type"], fresh["scope_id"]) == (
        None,
        "attempt",
        first["public_id"],
    )
    live_scoped = await work.rows(
        tokens, tokens.c.scope_type == "attempt", tokens.c.revoked_at.is_(None)
    )
    assert [t["public_id"] for t in live_scoped] == [body["token_id"]]
    # Audit: one claim, one rotation of the lost token.
    assert audit_log.actions().count("task.claimed") == 1
    [rotated] = [e for e in audit_log.events if e.action == "token.rotated"]
    assert (rotated.target_id, rotated.details["replaces"], rotated.actor_id) == (
        body["token_id"],
        lost_token_id,
        work.agent.id,
    )


async def test_a_replayed_claim_revokes_the_unseen_token(app, work, audit_log):
    task = await work.task("replayed")
    key = "claim-replayed"
    first = await work.call(
        "POST", f"/tasks/{task['id']}/claim", work.agent, json={}, key=key, expect=201
    )
    again = await work.call(
        "POST", f"/tasks/{task['id']}/claim", work.agent, json={}, key=key, expect=201
    )
    assert again["attempt"]["id"] == first["attempt"]["id"]
    assert again["token"] != first["token"]
    renew = f"/attempts/{first['attempt']['id']}/renew"
    await work.call("POST", renew, first["token"], json={"generation": 1}, expect=401)
    await work.call("POST", renew, again["token"], json={"generation": 1}, expect=200)
    assert len(await work.rows(attempts)) == 1
    assert audit_log.actions().count("task.claimed") == 1


async def test_claim_next_with_the_same_key_twice_claims_once(app, work, audit_log):
    first_task = await work.task("first", priority=5)
    second_task = await work.task("second", priority=1)
    key = "claim-next-once"
    first = await work.call("POST", "/claims", work.agent, json={}, key=key, expect=201)
    again = await work.call("POST", "/claims", work.agent, json={}, key=key, expect=201)
    assert first["task"]["id"] == again["task"]["id"] == first_task["id"]
    assert again["attempt"]["id"] == first["attempt"]["id"]
    await work.call(
        "POST",
        f"/attempts/{again['attempt']['id']}/renew",
        again["token"],
        json={"generation": 1},
        expect=200,
    )
    # Forbidden: the replay claimed nothing more.
    rows = await work.rows(attempts)
    assert [r["public_id"] for r in rows] == [first["attempt"]["id"]]
    [untouched] = await work.rows(tasks, tasks.c.public_id == second_task["id"])
    assert (untouched["state"], untouched["generation"]) == ("ready", 0)
    assert [e.target_id for e in audit_log.events if e.action == "task.claimed"] == [
        first_task["id"]
    ]


async def attempt_tokens(work):
    """The attempt tokens that exist, without their last-used time.

    The last-used time is written in the background after a request, so it
    may land between two reads; the identity and revocation are what count.
    """
    rows = await work.rows(tokens, tokens.c.scope_type == "attempt")
    return [(r["public_id"], r["verifier"], r["revoked_at"]) for r in rows]


async def test_replaying_a_claim_whose_attempt_ended_is_refused(app, work, audit_log):
    task = await work.task("finished")
    key = "claim-then-submit"
    claim = await work.call(
        "POST", f"/tasks/{task['id']}/claim", work.agent, json={}, key=key, expect=201
    )
    await work.call(
        "POST",
        f"/attempts/{claim['attempt']['id']}/submit",
        claim["token"],
        json={"generation": 1, "summary": "done"},
        expect=201,
    )
    tokens_before = await attempt_tokens(work)
    refused = await work.call(
        "POST", f"/tasks/{task['id']}/claim", work.agent, json={}, key=key, expect=409
    )
    assert refused["type"] == PROBLEM + "conflict"
    assert len(await work.rows(attempts)) == 1
    [row] = await work.rows(tasks, tasks.c.public_id == task["id"])
    assert row["state"] == "done"
    # No token was minted for the ended attempt.
    assert await attempt_tokens(work) == tokens_before
    assert "token.rotated" not in audit_log.actions()


async def test_the_same_key_with_another_body_is_refused(app, work):
    task = await work.task("one body per key")
    key = "claim-body"
    url = f"/tasks/{task['id']}/claim"
    await work.call("POST", url, work.agent, json={"lease_seconds": 60}, key=key, expect=201)
    await work.call(
        "POST",
        url,
        work.agent,
        json={"lease_seconds": 120},
        key=key,
        expect=422,
        problem="idempotency-key-reused",
    )
    [row] = await work.rows(attempts)
    assert row["lease_expires_at"] - row["created_at"] == 60_000


async def test_another_principal_with_the_same_key_gets_no_replay(app, work, audit_log):
    task = await work.task("mine")
    key = "shared-key"
    url = f"/tasks/{task['id']}/claim"
    mine = await work.call("POST", url, work.agent, json={}, key=key, expect=201)
    theirs = await work.call(
        "POST", url, work.agent2, json={}, key=key, expect=409, problem="task-claimed"
    )
    assert theirs["holder"]["attempt_id"] == mine["attempt"]["id"]
    assert "token" not in theirs
    assert len(await work.rows(attempts)) == 1
    assert "token.rotated" not in audit_log.actions()
