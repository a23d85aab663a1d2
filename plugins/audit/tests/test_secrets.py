"""No audit row holds a secret. The ``app`` fixture of every test in the
suite checks it when the test ends (``buildmax.testing.SecretWatch``); these
tests show the watch sees the secrets and catches a leak."""

from __future__ import annotations

from .conftest import record_rename

PASSWORD = "a long enough password"


async def test_the_watch_sees_minted_tokens_and_secret_fields(app, client, admin, secret_watch):
    created = await client.post(
        "/v1/principals",
        headers=admin.headers,
        json={"kind": "human", "name": "carol", "password": PASSWORD},
    )
    assert created.status_code == 201
    session = await (
        await client.post("/v1/sessions", json={"name": "carol", "password": PASSWORD})
    ).get_json()
    token = await (await client.post("/v1/tokens", headers=admin.headers, json={})).get_json()
    wrong = "a wrong but long password"  # seen only by the sign-in's secret field
    refused = await client.post("/v1/sessions", json={"name": "carol", "password": wrong})
    assert refused.status_code == 401
    assert {PASSWORD, wrong, session["token"], token["token"], admin.token} <= secret_watch.values
    assert await secret_watch.found_in_audit_tables(app) == []


async def test_the_watch_catches_a_secret_written_to_the_trail(
    app, admin, make_space, secret_watch
):
    space = await make_space(admin)
    async with app.db.write() as tx:
        # A declared key carrying a secret value: only the watch can see it.
        await record_rename(app, tx, space.id, f"leaked {admin.token}")
    assert await secret_watch.found_in_audit_tables(app) == [f"audit_events: {admin.token[:6]}..."]
    secret_watch.values.discard(admin.token)  # so the fixture's own check passes


async def test_the_watch_finds_a_secret_stored_escaped_in_json(
    app, admin, make_space, secret_watch
):
    space = await make_space(admin)
    tricky = 'pass"word\\with\nescapes'
    secret_watch.values.add(tricky)
    async with app.db.write() as tx:
        await record_rename(app, tx, space.id, tricky)
    assert len(await secret_watch.found_in_audit_tables(app)) == 1
    secret_watch.values.discard(tricky)


async def test_the_watch_ignores_values_of_too_few_characters_to_be_told_from_a_hash(
    app, admin, make_space, secret_watch
):
    # Every chain starts from a hash of 64 zeros; a password of eight zeros
    # is inside it without having leaked. A value of three characters or
    # more is still looked for.
    space = await make_space(admin)
    secret_watch.values.update({"00000000", "0101010101"})
    assert await secret_watch.found_in_audit_tables(app) == []
    async with app.db.write() as tx:
        await record_rename(app, tx, space.id, "012012012")
    secret_watch.values.add("012012012")
    assert await secret_watch.found_in_audit_tables(app) == ["audit_events: 012012..."]
    secret_watch.values.discard("012012012")
