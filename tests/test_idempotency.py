"""Idempotency keys: a retried mutation returns the first answer, creates nothing twice."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa

from buildmax.app import create_app
from buildmax.tables import idempotency_receipts, spaces, tokens


async def _count(app, table) -> int:
    async with app.db.read() as conn:
        return await conn.fetch_val(sa.select(sa.func.count()).select_from(table))


def _key(value: str, headers: dict[str, str]) -> dict[str, str]:
    return {**headers, "Idempotency-Key": value}


async def test_same_key_same_body_replays_the_first_answer_without_a_second_row(
    app, client, admin, audit_log
):
    headers = _key("create-demo-1", admin.headers)
    first = await client.post("/v1/spaces", json={"slug": "demo"}, headers=headers)
    second = await client.post("/v1/spaces", json={"slug": "demo"}, headers=headers)
    assert first.status_code == second.status_code == 201
    assert await first.get_json() == await second.get_json()
    assert second.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert await _count(app, spaces) == 1
    assert audit_log.actions() == ["space.created"]


async def test_same_key_different_body_is_refused_and_changes_nothing(app, client, admin):
    headers = _key("k-1", admin.headers)
    assert (
        await client.post("/v1/spaces", json={"slug": "one"}, headers=headers)
    ).status_code == 201
    reused = await client.post("/v1/spaces", json={"slug": "two"}, headers=headers)
    assert reused.status_code == 422
    assert (await reused.get_json())["type"] == "urn:buildmax:problem:idempotency-key-reused"
    assert await _count(app, spaces) == 1


async def test_the_same_key_on_another_space_path_is_another_receipt(
    app, client, make_principal, make_space
):
    owner = await make_principal("human")
    space_a, space_b = await make_space(owner), await make_space(owner)
    headers = _key("same-key", owner.headers)
    a1 = await client.post(f"/v1/spaces/{space_a.id}/testplugin/increment", headers=headers)
    b1 = await client.post(f"/v1/spaces/{space_b.id}/testplugin/increment", headers=headers)
    a2 = await client.post(f"/v1/spaces/{space_a.id}/testplugin/increment", headers=headers)
    assert [await r.get_json() for r in (a1, b1, a2)] == [{"value": 1}] * 3
    assert a2.headers.get("Idempotent-Replayed") == "true"
    assert "Idempotent-Replayed" not in b1.headers
    assert await _count(app, idempotency_receipts) == 2


async def test_a_replayed_token_response_carries_a_fresh_token_and_the_unseen_one_is_dead(
    app, client, make_principal
):
    agent = await make_principal("agent")
    headers = _key("token-1", agent.headers)
    first = await (await client.post("/v1/tokens", json={"name": "ci"}, headers=headers)).get_json()
    replay = await client.post("/v1/tokens", json={"name": "ci"}, headers=headers)
    second = await replay.get_json()
    assert replay.status_code == 201
    assert second["token"] != first["token"] and second["id"] != first["id"]
    assert second["name"] == "ci"
    old = await client.get(
        "/v1/principals/me", headers={"Authorization": f"Bearer {first['token']}"}
    )
    new = await client.get(
        "/v1/principals/me", headers={"Authorization": f"Bearer {second['token']}"}
    )
    assert (old.status_code, new.status_code) == (401, 200)
    # The receipt holds no secret, and there is one live token besides the fixture's.
    async with app.db.read() as conn:
        stored = await conn.fetch_val(sa.select(idempotency_receipts.c.body))
        live = await conn.fetch_val(
            sa.select(sa.func.count()).select_from(tokens).where(tokens.c.revoked_at.is_(None))
        )
    assert first["token"] not in stored and second["token"] not in stored
    assert "bmx_" not in stored
    assert live == 2


async def test_a_refused_request_leaves_no_receipt(app, client, admin):
    await client.post("/v1/spaces", json={"slug": "taken"}, headers=admin.headers)
    headers = _key("k-conflict", admin.headers)
    refused = await client.post("/v1/spaces", json={"slug": "taken"}, headers=headers)
    assert refused.status_code == 409
    assert await _count(app, idempotency_receipts) == 0


async def test_a_receipt_expires_after_its_lifetime(app, client, clock, make_principal, make_space):
    owner = await make_principal("human")
    space = await make_space(owner)
    headers = _key("daily", owner.headers)
    url = f"/v1/spaces/{space.id}/testplugin/increment"
    assert await (await client.post(url, headers=headers)).get_json() == {"value": 1}
    clock.advance(seconds=app.settings.idempotency_ttl_seconds + 1)
    assert await (await client.post(url, headers=headers)).get_json() == {"value": 2}


@pytest.mark.parametrize("key", ["", "x" * 201, "with space", "tab\tkey"])
async def test_a_malformed_key_is_a_400(client, admin, key):
    response = await client.post(
        "/v1/spaces", json={"slug": "kk"}, headers=_key(key, admin.headers)
    )
    assert response.status_code == 400


async def _hold_counter_row(app, space_pk: int):
    """Open a transaction that holds the space's counter row (and on SQLite the
    writer), so a request incrementing it waits inside its own transaction."""
    from buildmax_testplugin import bump

    async with app.db.write() as tx:
        await bump(tx, space_pk)  # the row exists, so the next bump locks it
    ctx = app.db.write()
    tx = await ctx.__aenter__()
    await bump(tx, space_pk)
    return ctx


async def test_a_concurrent_duplicate_is_a_409_or_on_sqlite_waits_and_replays(
    app, client, make_principal, make_space
):
    """A repeat while the first request runs: on PostgreSQL a 409 at once;
    on SQLite, where mutating handlers are admitted one at a time, it waits
    for the first and gets its answer replayed. Either way the change is
    made once.

    Catches: the in-flight check removed (on PostgreSQL the duplicate would
    wait and replay); on SQLite, the duplicate's handler let in beside the
    first."""
    import sqlalchemy as sa
    from buildmax_testplugin import counters

    owner = await make_principal("human")
    space = await make_space(owner)
    url = f"/v1/spaces/{space.id}/testplugin/increment"
    headers = _key("dup", owner.headers)
    holder = await _hold_counter_row(app, space.pk)
    first = asyncio.create_task(client.post(url, headers=headers))
    await asyncio.sleep(0.2)
    duplicate = asyncio.create_task(client.post(url, headers=headers))
    done, _ = await asyncio.wait({duplicate}, timeout=1)
    if app.db.dialect == "postgresql":
        assert done, "the duplicate waited for the first"
        answer = duplicate.result()
        assert answer.status_code == 409
        assert (await answer.get_json())["type"] == "urn:buildmax:problem:idempotency-in-progress"
    else:
        assert not done, "the duplicate's handler ran beside the first's"
    await holder.__aexit__(None, None, None)
    answer, original = await duplicate, await first
    assert original.status_code == 200
    if app.db.dialect == "sqlite":
        assert answer.status_code == 200
        assert answer.headers["Idempotent-Replayed"] == "true"
        assert await answer.get_json() == await original.get_json()
    assert (await original.get_json())["value"] == 3  # after the holder's two bumps
    async with app.db.read() as conn:
        value = sa.select(counters.c.value).where(counters.c.space_id == space.pk)
        assert await conn.fetch_val(value) == 3


@pytest.mark.postgres_only
async def test_a_duplicate_on_another_server_process_is_a_409(
    app, buildmax_settings, make_principal, make_space
):
    """Two apps on one PostgreSQL database stand for two server processes.
    Catches: the advisory lock removed."""
    owner = await make_principal("human")
    space = await make_space(owner)
    url = f"/v1/spaces/{space.id}/testplugin/increment"
    headers = _key("dup-across", owner.headers)
    other = create_app(buildmax_settings)
    async with other.test_app():
        holder = await _hold_counter_row(app, space.pk)
        first = asyncio.create_task(app.test_client().post(url, headers=headers))
        await asyncio.sleep(0.3)
        duplicate = await other.test_client().post(url, headers=headers)
        await holder.__aexit__(None, None, None)
        assert duplicate.status_code == 409
        assert (await first).status_code == 200


async def test_a_receipt_belongs_to_its_principal(app, client, make_principal):
    """Catches: the receipt lookup without the principal (B would replay A's answer)."""
    alice, bob = await make_principal("agent"), await make_principal("agent")
    first = await client.post(
        "/v1/tokens", json={"name": "x"}, headers=_key("shared", alice.headers)
    )
    second = await client.post(
        "/v1/tokens", json={"name": "x"}, headers=_key("shared", bob.headers)
    )
    assert "Idempotent-Replayed" not in second.headers
    assert (await first.get_json())["principal_id"] == alice.id
    assert (await second.get_json())["principal_id"] == bob.id


async def test_a_replayed_token_is_audited_as_a_rotation(client, make_principal, audit_log):
    agent = await make_principal("agent")
    headers = _key("audited", agent.headers)
    first = await (await client.post("/v1/tokens", json={}, headers=headers)).get_json()
    second = await (await client.post("/v1/tokens", json={}, headers=headers)).get_json()
    assert [(e.action, e.target_id) for e in audit_log.events] == [
        ("token.created", first["id"]),
        ("token.rotated", second["id"]),
    ]
    assert audit_log.events[1].details == {"principal_id": agent.id, "replaces": first["id"]}


async def test_a_replay_never_hands_out_an_expired_token(client, clock, make_principal):
    agent = await make_principal("agent")
    headers = _key("short-lived", agent.headers)
    body = {"expires_in_seconds": 60}
    assert (await client.post("/v1/tokens", json=body, headers=headers)).status_code == 201
    clock.advance(seconds=120)
    replay = await client.post("/v1/tokens", json=body, headers=headers)
    assert replay.status_code == 409


async def test_replaying_a_rotation_checks_the_caller_again(app, client, admin, make_principal):
    """A replay does not run the handler's work: authorization must come first.
    Catches: the visibility check only inside the transaction."""
    second_admin = await make_principal("human", system_role="admin")
    victim = await make_principal("agent")
    victim_tokens = await (
        await client.get(f"/v1/tokens?principal={victim.id}", headers=admin.headers)
    ).get_json()
    token_id = victim_tokens["items"][0]["id"]
    headers = _key("rot-1", second_admin.headers)
    rotated = await client.post(f"/v1/tokens/{token_id}/rotate", headers=headers)
    assert rotated.status_code == 201
    demoted = await client.patch(
        f"/v1/principals/{second_admin.id}", json={"system_role": None}, headers=admin.headers
    )
    assert demoted.status_code == 200
    replay = await client.post(f"/v1/tokens/{token_id}/rotate", headers=headers)
    assert replay.status_code == 404


async def test_a_password_leaves_no_guessable_hash_in_the_receipt(app, client, admin):
    import hashlib
    import json

    body = {"kind": "human", "name": "carol", "password": "correct horse battery"}
    headers = _key("with-password", admin.headers)
    assert (await client.post("/v1/principals", json=body, headers=headers)).status_code == 201
    replay = await client.post("/v1/principals", json=body, headers=headers)
    assert replay.headers["Idempotent-Replayed"] == "true"
    async with app.db.read() as conn:
        receipt = await conn.fetch_one(sa.select(idempotency_receipts))
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert receipt["fingerprint"] != hashlib.sha256(canonical.encode()).hexdigest()
    assert "correct horse" not in receipt["body"]
