"""The kernel's identity routes: sign-in, principals, tokens, spaces and members.

Each journey asserts the HTTP answer, the rows it left (or did not leave),
the audit events, and the side effects that must not happen: a second row,
a secret in the audit trail or the log, a change that survived a refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from typing import Any

import pytest
import sqlalchemy as sa
from argon2 import PasswordHasher
from buildmax_hookspecs import hookimpl

from buildmax import passwords
from buildmax.clock import to_rfc3339
from buildmax.passwords import hash_password
from buildmax.tables import (
    events,
    idempotency_receipts,
    principals,
    sign_in_failures,
    space_members,
    spaces,
    tokens,
)

PASSWORD = "correct horse battery staple"
OTHER_PASSWORD = "tr0ub4dor & 3 more words"
PROBLEM = "urn:buildmax:problem:"
_DEFAULT_HASHING = (passwords._hasher, passwords._dummy_hash)


# -- helpers ---------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def fast_password_hashing(monkeypatch):
    """Argon2id at its lowest cost: the same algorithm and checks, a thousandth
    of the time (at library defaults a hash costs ~0.3 s on a small CI box,
    and the limiter tests verify two dozen passwords)."""
    cheap = PasswordHasher(time_cost=1, memory_cost=64, parallelism=1)
    monkeypatch.setattr(passwords, "_hasher", cheap)
    dummy = cheap.hash("buildmax-dummy-password")
    monkeypatch.setattr(passwords, "_dummy_hash", lambda: dummy)


@pytest.fixture
def real_password_hashing(fast_password_hashing, monkeypatch):
    """The library-default cost, for a test whose race window is that cost."""
    hasher, dummy = _DEFAULT_HASHING
    monkeypatch.setattr(passwords, "_hasher", hasher)
    monkeypatch.setattr(passwords, "_dummy_hash", dummy)


async def _rows(app, table, *where) -> list[dict[str, Any]]:
    query = sa.select(table)
    if where:
        query = query.where(*where)
    async with app.db.read() as conn:
        return [dict(r) for r in await conn.fetch_all(query)]


async def _count(app, table, *where) -> int:
    return len(await _rows(app, table, *where))


async def _problem(response, status: int, slug: str) -> dict[str, Any]:
    """Assert a problem+json answer with this status and type; return it."""
    body = await response.get_json()
    assert response.status_code == status, body
    assert response.content_type == "application/problem+json"
    assert body["type"] == PROBLEM + slug
    return body


def _bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def _from(address: str) -> dict[str, Any]:
    """``scope_base`` for a request from ``address`` (the sign-in limiter's key)."""
    return {"client": (address, 40000)}


async def _create_human(client, admin, name: str, password: str = PASSWORD, **extra) -> dict:
    body = {"kind": "human", "name": name, "password": password, **extra}
    response = await client.post("/v1/principals", json=body, headers=admin.headers)
    assert response.status_code == 201, await response.get_data()
    return await response.get_json()


async def _sign_in(client, name: str, password: str, address: str = "192.0.2.1"):
    return await client.post(
        "/v1/sessions", json={"name": name, "password": password}, scope_base=_from(address)
    )


async def _me(client, secret: str):
    return await client.get("/v1/principals/me", headers=_bearer(secret))


def _secrets_absent(texts: list[str], *secrets_: str) -> None:
    for secret in secrets_:
        for text in texts:
            assert secret not in text


def _audit_text(audit_log) -> str:
    return "\n".join(repr(event) for event in audit_log.events)


async def _create_space(client, who, slug: str, **extra):
    return await client.post("/v1/spaces", json={"slug": slug, **extra}, headers=who.headers)


async def _put_member(client, who, space, principal, role: str):
    return await client.put(
        f"/v1/spaces/{space.id}/members/{principal.id}", json={"role": role}, headers=who.headers
    )


async def _space_events(app, space) -> list[tuple[int, str, dict[str, Any]]]:
    rows = await _rows(app, events, events.c.space_id == space.pk)
    return sorted((r["seq"], r["type"], json.loads(r["data"])) for r in rows)


async def _members(app, space) -> dict[int, str]:
    rows = await _rows(app, space_members, space_members.c.space_id == space.pk)
    return {r["principal_id"]: r["role"] for r in rows}


# == sign-in =============================================================================


async def test_a_human_created_with_a_password_signs_in_and_the_token_works(
    app, client, admin, audit_log, caplog
):
    caplog.set_level(logging.DEBUG)
    created = await _create_human(client, admin, "ada")
    assert "password" not in created
    stored = (await _rows(app, principals, principals.c.name == "ada"))[0]
    assert stored["password_hash"].startswith("$argon2id$")

    response = await _sign_in(client, "ada", PASSWORD)
    assert response.status_code == 201
    issued = await response.get_json()
    secret = issued["token"]
    assert secret.startswith("bmx_")
    assert issued["principal_id"] == created["id"]
    assert issued["origin"] == "session"
    ttl_ms = app.settings.session_ttl_seconds * 1000
    assert issued["expires_at"] == to_rfc3339(app.clock.now_ms() + ttl_ms)

    me = await _me(client, secret)
    assert me.status_code == 200
    assert (await me.get_json())["name"] == "ada"

    # Durable: one session token for ada, stored as its verifier; no failures.
    rows = await _rows(app, tokens, tokens.c.principal_id == stored["id"])
    assert [(r["public_id"], r["origin"]) for r in rows] == [(issued["id"], "session")]
    assert rows[0]["verifier"] == hashlib.sha256(secret.encode()).hexdigest()
    assert await _count(app, sign_in_failures) == 0

    # Audit: creation, then the session, each about the right thing.
    assert audit_log.actions() == ["principal.created", "session.created"]
    made, session = audit_log.events
    assert made.target_id == created["id"]
    assert dict(made.details) == {"kind": "human", "name": "ada", "system_role": None}
    assert session.actor_id == created["id"]
    assert (session.target_type, session.target_id) == ("token", issued["id"])

    # Forbidden: neither secret appears in the audit trail or in the log.
    _secrets_absent([_audit_text(audit_log), caplog.text], PASSWORD, secret)


async def test_a_wrong_password_is_401_recorded_and_issues_nothing(
    app, client, admin, audit_log, caplog
):
    caplog.set_level(logging.DEBUG)
    created = await _create_human(client, admin, "ada")
    wrong = await _sign_in(client, "ada", "not the password at all", address="198.51.100.7")
    body = await _problem(wrong, 401, "unauthenticated")
    assert wrong.headers["WWW-Authenticate"].startswith("Bearer")

    # An unknown name gets the very same answer: names are not enumerable.
    unknown = await _sign_in(client, "nobody", "not the password at all")
    assert (await _problem(unknown, 401, "unauthenticated"))["detail"] == body["detail"]

    failures = await _rows(app, sign_in_failures)
    now = app.clock.now_ms()
    assert sorted((r["name"], r["address"], r["at"]) for r in failures) == [
        ("ada", "198.51.100.7", now),
        ("nobody", "192.0.2.1", now),
    ]
    ada_pk = (await _rows(app, principals, principals.c.public_id == created["id"]))[0]["id"]
    assert await _count(app, tokens, tokens.c.principal_id == ada_pk) == 0
    assert audit_log.actions() == ["principal.created"]
    _secrets_absent([caplog.text, _audit_text(audit_log)], "not the password at all", PASSWORD)


async def test_a_successful_sign_in_forgets_the_names_failures(app, client, admin):
    await _create_human(client, admin, "ada")
    for _ in range(3):
        assert (await _sign_in(client, "ada", "wrong password!!")).status_code == 401
    assert await _count(app, sign_in_failures, sign_in_failures.c.name == "ada") == 3
    assert (await _sign_in(client, "ada", PASSWORD)).status_code == 201
    assert await _count(app, sign_in_failures, sign_in_failures.c.name == "ada") == 0


async def test_the_public_id_is_not_a_sign_in_name(app, client, admin):
    created = await _create_human(client, admin, "ada")
    response = await _sign_in(client, created["id"], PASSWORD)
    await _problem(response, 401, "unauthenticated")


async def test_after_five_failures_for_a_name_even_the_right_password_is_429(
    app, client, clock, admin, audit_log
):
    """Failures from five different addresses still count against the one name."""
    created = await _create_human(client, admin, "ada")
    await _create_human(client, admin, "bob")
    limit = app.settings.sign_in_max_failures_per_name
    assert limit == 5
    for i in range(limit):
        wrong = await _sign_in(client, "ada", "wrong password!!", address=f"203.0.113.{i + 1}")
        assert wrong.status_code == 401

    blocked = await _sign_in(client, "ada", PASSWORD, address="203.0.113.99")
    await _problem(blocked, 429, "too-many-requests")

    # Nothing was issued or recorded for the refused attempt.
    ada_pk = (await _rows(app, principals, principals.c.public_id == created["id"]))[0]["id"]
    assert await _count(app, tokens, tokens.c.principal_id == ada_pk) == 0
    assert await _count(app, sign_in_failures, sign_in_failures.c.name == "ada") == limit
    assert "session.created" not in audit_log.actions()

    # The limit is per name: bob signs in from an address ada's attacker used.
    assert (await _sign_in(client, "bob", PASSWORD, address="203.0.113.1")).status_code == 201

    # Still inside the window: still refused.
    clock.advance(seconds=app.settings.sign_in_window_seconds - 1)
    await _problem(await _sign_in(client, "ada", PASSWORD), 429, "too-many-requests")
    # Past the window the failures no longer count.
    clock.advance(seconds=2)
    response = await _sign_in(client, "ada", PASSWORD)
    assert response.status_code == 201
    assert (await _me(client, (await response.get_json())["token"])).status_code == 200


async def test_the_per_address_limit_spans_different_names(app, client, clock, admin):
    await _create_human(client, admin, "ada")
    limit = app.settings.sign_in_max_failures_per_address
    assert limit == 20
    attacker = "198.51.100.66"
    for i in range(limit):
        # A different name each time: no single name reaches its own limit.
        wrong = await _sign_in(client, f"guess-{i}", "wrong password!!", address=attacker)
        assert wrong.status_code == 401
    assert await _count(app, sign_in_failures, sign_in_failures.c.address == attacker) == limit

    await _problem(
        await _sign_in(client, "ada", PASSWORD, address=attacker), 429, "too-many-requests"
    )
    # Another address is not affected.
    assert (await _sign_in(client, "ada", PASSWORD, address="198.51.100.67")).status_code == 201

    clock.advance(seconds=15 * 60 + 1)
    assert (await _sign_in(client, "ada", PASSWORD, address=attacker)).status_code == 201


@pytest.mark.parametrize("limit_by", ["name", "address"])
async def test_a_refused_sign_in_says_when_a_slot_frees_up(app, client, clock, admin, limit_by):
    """The 429 carries ``Retry-After``: the seconds until the oldest failure
    of the window leaves it and frees a slot. A second before, sign-in is
    still refused; at that moment it is allowed. Catches a 429 without the
    header, a fixed value (the whole window), or one counted from the newest
    failure."""
    await _create_human(client, admin, "ada")
    settings = app.settings
    limit = getattr(settings, f"sign_in_max_failures_per_{limit_by}")
    attacker = "198.51.100.66"
    spacing = 7
    for i in range(limit):
        name, address = (
            ("ada", f"203.0.113.{i + 1}") if limit_by == "name" else (f"g-{i}", attacker)
        )
        assert (
            await _sign_in(client, name, "wrong password!!", address=address)
        ).status_code == 401
        clock.advance(seconds=spacing)
    address = "203.0.113.99" if limit_by == "name" else attacker

    blocked = await _sign_in(client, "ada", PASSWORD, address=address)
    await _problem(blocked, 429, "too-many-requests")
    # The first failure was limit * spacing seconds ago.
    wait = settings.sign_in_window_seconds - limit * spacing
    assert blocked.headers["Retry-After"] == str(wait)

    clock.advance(seconds=wait - 1)
    still = await _sign_in(client, "ada", PASSWORD, address=address)
    await _problem(still, 429, "too-many-requests")
    assert still.headers["Retry-After"] == "1"
    clock.advance(seconds=1)
    assert (await _sign_in(client, "ada", PASSWORD, address=address)).status_code == 201


async def test_concurrent_guesses_cannot_exceed_the_per_name_limit(
    app, client, admin, real_password_hashing
):
    """Ten guesses sent at once for one name: at most five may be checked
    (401); the rest must be refused (429). Catches a limiter whose count is
    read in one step and bumped in a later one."""
    await _create_human(client, admin, "ada")
    limit = app.settings.sign_in_max_failures_per_name
    answers = await asyncio.gather(
        *(
            _sign_in(client, "ada", f"wrong guess number {i}", address=f"192.0.2.{i + 10}")
            for i in range(2 * limit)
        )
    )
    statuses = sorted(r.status_code for r in answers)
    assert statuses.count(401) <= limit, statuses
    assert await _count(app, sign_in_failures, sign_in_failures.c.name == "ada") <= limit


async def test_agents_cannot_be_given_a_password_nor_sign_in_with_one(
    app, client, admin, make_principal, audit_log
):
    for kind in ("agent", "service"):
        refused = await client.post(
            "/v1/principals",
            json={"kind": kind, "name": f"bot-{kind}", "password": PASSWORD},
            headers=admin.headers,
        )
        body = await _problem(refused, 422, "validation-error")
        assert "password" in body["errors"]
        assert await _count(app, principals, principals.c.name == f"bot-{kind}") == 0
    assert audit_log.events == []

    # Even with a password hash forced into its row, an agent cannot sign in.
    agent = await make_principal("agent")
    forced = await hash_password(PASSWORD)
    async with app.db.write() as tx:
        await tx.execute(
            sa.update(principals).where(principals.c.id == agent.pk).values(password_hash=forced)
        )
    await _problem(await _sign_in(client, agent.name, PASSWORD), 401, "unauthenticated")
    assert await _count(app, tokens, tokens.c.principal_id == agent.pk) == 1  # its test token
    assert await _count(app, sign_in_failures, sign_in_failures.c.name == agent.name) == 1


async def test_a_password_shorter_than_twelve_characters_is_refused(app, client, admin):
    refused = await client.post(
        "/v1/principals",
        json={"kind": "human", "name": "shorty", "password": "elevenchars"},
        headers=admin.headers,
    )
    body = await _problem(refused, 422, "validation-error")
    assert "12" in body["errors"]["password"][0]
    assert await _count(app, principals, principals.c.name == "shorty") == 0


async def test_a_disabled_human_cannot_sign_in_and_its_tokens_stop(app, client, admin, audit_log):
    created = await _create_human(client, admin, "ada")
    session = await (await _sign_in(client, "ada", PASSWORD)).get_json()

    disabled = await client.patch(
        f"/v1/principals/{created['id']}", json={"disabled": True}, headers=admin.headers
    )
    assert disabled.status_code == 200
    assert (await disabled.get_json())["disabled_at"] is not None

    await _problem(await _sign_in(client, "ada", PASSWORD), 401, "unauthenticated")
    await _problem(await _me(client, session["token"]), 401, "unauthenticated")
    ada_pk = (await _rows(app, principals, principals.c.public_id == created["id"]))[0]["id"]
    assert await _count(app, tokens, tokens.c.principal_id == ada_pk) == 1
    assert audit_log.actions() == ["principal.created", "session.created", "principal.disabled"]

    # Enabled again, the same old token works and sign-in works.
    await client.patch(
        f"/v1/principals/{created['id']}", json={"disabled": False}, headers=admin.headers
    )
    assert (await _me(client, session["token"])).status_code == 200
    assert (await _sign_in(client, "ada", PASSWORD)).status_code == 201


async def test_signing_out_revokes_only_the_token_used(app, client, admin, audit_log, caplog):
    caplog.set_level(logging.DEBUG)
    created = await _create_human(client, admin, "ada")
    first = await (await _sign_in(client, "ada", PASSWORD)).get_json()
    second = await (await _sign_in(client, "ada", PASSWORD)).get_json()

    out = await client.delete("/v1/sessions/current", headers=_bearer(first["token"]))
    assert out.status_code == 204

    await _problem(await _me(client, first["token"]), 401, "unauthenticated")
    assert (await _me(client, second["token"])).status_code == 200
    by_id = {r["public_id"]: r for r in await _rows(app, tokens)}
    assert by_id[first["id"]]["revoked_at"] == app.clock.now_ms()
    assert by_id[second["id"]]["revoked_at"] is None

    revoked = [e for e in audit_log.events if e.action == "token.revoked"]
    assert [(e.actor_id, e.target_id) for e in revoked] == [(created["id"], first["id"])]
    # Signing out with a revoked token is an authentication failure, not a second event.
    again = await client.delete("/v1/sessions/current", headers=_bearer(first["token"]))
    await _problem(again, 401, "unauthenticated")
    assert audit_log.actions().count("token.revoked") == 1
    _secrets_absent(
        [_audit_text(audit_log), caplog.text], PASSWORD, first["token"], second["token"]
    )


async def test_a_session_token_expires_after_the_session_lifetime(app, client, clock, admin):
    await _create_human(client, admin, "ada")
    session = await (await _sign_in(client, "ada", PASSWORD)).get_json()
    clock.advance(seconds=app.settings.session_ttl_seconds - 1)
    assert (await _me(client, session["token"])).status_code == 200
    clock.advance(seconds=1)
    body = await _problem(await _me(client, session["token"]), 401, "unauthenticated")
    assert "expired" in body["detail"]


# == principals ============================================================================


async def test_only_admins_create_principals(app, client, admin, make_principal, audit_log):
    operator = await make_principal("human", system_role="operator")
    agent = await make_principal("agent")
    human = await make_principal("human")
    for who in (operator, agent, human):
        refused = await client.post(
            "/v1/principals", json={"kind": "agent", "name": "mallory"}, headers=who.headers
        )
        await _problem(refused, 403, "forbidden")
    assert await _count(app, principals, principals.c.name == "mallory") == 0
    assert audit_log.events == []

    made = await client.post(
        "/v1/principals",
        json={"kind": "agent", "name": "builder", "display_name": "Builder"},
        headers=admin.headers,
    )
    assert made.status_code == 201
    body = await made.get_json()
    assert (body["kind"], body["name"], body["display_name"], body["system_role"]) == (
        "agent",
        "builder",
        "Builder",
        None,
    )
    row = (await _rows(app, principals, principals.c.name == "builder"))[0]
    assert (row["public_id"], row["kind"], row["password_hash"]) == (body["id"], "agent", None)
    assert [(e.action, e.actor_id, e.target_id) for e in audit_log.events] == [
        ("principal.created", admin.id, body["id"])
    ]


async def test_a_duplicate_name_is_409_name_taken_with_no_second_row(app, client, admin, audit_log):
    first = await client.post(
        "/v1/principals", json={"kind": "agent", "name": "dup"}, headers=admin.headers
    )
    assert first.status_code == 201
    second = await client.post(
        "/v1/principals", json={"kind": "human", "name": "dup"}, headers=admin.headers
    )
    await _problem(second, 409, "name-taken")
    rows = await _rows(app, principals, principals.c.name == "dup")
    assert [(r["public_id"], r["kind"]) for r in rows] == [
        ((await first.get_json())["id"], "agent")
    ]
    assert audit_log.actions() == ["principal.created"]


async def test_listing_principals_needs_the_admin_or_operator_role(client, make_principal):
    for who in (await make_principal("agent"), await make_principal("human")):
        await _problem(await client.get("/v1/principals", headers=who.headers), 403, "forbidden")
    operator = await make_principal("human", system_role="operator")
    listed = await client.get("/v1/principals", headers=operator.headers)
    assert listed.status_code == 200
    assert operator.name in [p["name"] for p in (await listed.get_json())["items"]]


async def test_listing_principals_pages_through_everyone_once_in_name_order(app, client, admin):
    for name in ("p-g", "p-c", "p-a", "p-f", "p-b", "p-e", "p-d"):
        made = await client.post(
            "/v1/principals", json={"kind": "agent", "name": name}, headers=admin.headers
        )
        assert made.status_code == 201
    seen: list[str] = []
    sizes: list[int] = []
    cursor = None
    while True:
        query = {"limit": "3", **({"cursor": cursor} if cursor else {})}
        page = await client.get("/v1/principals", query_string=query, headers=admin.headers)
        assert page.status_code == 200
        body = await page.get_json()
        sizes.append(len(body["items"]))
        seen.extend(p["name"] for p in body["items"])
        cursor = body["next_cursor"]
        if cursor is None:
            break
    expected = sorted(r["name"] for r in await _rows(app, principals))
    assert len(expected) == 8  # the admin and the seven
    assert seen == expected
    assert sizes == [3, 3, 2]

    bad = await client.get(
        "/v1/principals", query_string={"cursor": "not-a-cursor"}, headers=admin.headers
    )
    await _problem(bad, 400, "bad-cursor")
    too_big = await client.get("/v1/principals", query_string={"limit": "0"}, headers=admin.headers)
    await _problem(too_big, 422, "validation-error")


async def test_disabling_enabling_and_role_changes_are_audited(
    app, client, clock, admin, make_principal, audit_log
):
    worker = await make_principal("agent")
    url = f"/v1/principals/{worker.id}"

    disabled = await client.patch(url, json={"disabled": True}, headers=admin.headers)
    assert disabled.status_code == 200
    row = (await _rows(app, principals, principals.c.id == worker.pk))[0]
    assert row["disabled_at"] == clock.now_ms()
    await _problem(await _me(client, worker.token), 401, "unauthenticated")

    clock.advance(seconds=5)
    enabled = await client.patch(url, json={"disabled": False}, headers=admin.headers)
    assert (await enabled.get_json())["disabled_at"] is None
    assert (await _rows(app, principals, principals.c.id == worker.pk))[0]["disabled_at"] is None
    assert (await _me(client, worker.token)).status_code == 200

    promoted = await client.patch(url, json={"system_role": "operator"}, headers=admin.headers)
    assert (await promoted.get_json())["system_role"] == "operator"
    assert (await _rows(app, principals, principals.c.id == worker.pk))[0][
        "system_role"
    ] == "operator"
    # The new role takes effect on the worker's next request.
    assert (await client.get("/v1/principals", headers=worker.headers)).status_code == 200

    assert [(e.action, e.actor_id, e.target_id, dict(e.details)) for e in audit_log.events] == [
        ("principal.disabled", admin.id, worker.id, {}),
        ("principal.enabled", admin.id, worker.id, {}),
        ("principal.role_changed", admin.id, worker.id, {"system_role": "operator"}),
    ]


@pytest.mark.parametrize(
    "change",
    [
        {"disabled": True},
        {"system_role": None},
        {"system_role": "operator"},
        {"display_name": "Renamed", "disabled": True},
    ],
)
async def test_the_last_admin_cannot_be_disabled_or_demoted(app, client, admin, audit_log, change):
    refused = await client.patch(f"/v1/principals/{admin.id}", json=change, headers=admin.headers)
    await _problem(refused, 409, "last-admin")
    row = (await _rows(app, principals, principals.c.id == admin.pk))[0]
    # Nothing changed, not even the display name sent alongside.
    assert (row["system_role"], row["disabled_at"], row["display_name"]) == ("admin", None, "")
    assert (await _me(client, admin.token)).status_code == 200
    assert audit_log.events == []


async def test_with_a_second_admin_the_first_can_be_demoted(
    app, client, admin, make_principal, audit_log
):
    other = await make_principal("human", system_role="admin")
    demoted = await client.patch(
        f"/v1/principals/{admin.id}", json={"system_role": None}, headers=other.headers
    )
    assert demoted.status_code == 200
    assert (await _rows(app, principals, principals.c.id == admin.pk))[0]["system_role"] is None
    assert [(e.action, dict(e.details)) for e in audit_log.events] == [
        ("principal.role_changed", {"system_role": None})
    ]
    # Now `other` is the last admin.
    last = await client.patch(
        f"/v1/principals/{other.id}", json={"disabled": True}, headers=other.headers
    )
    await _problem(last, 409, "last-admin")


async def test_concurrent_demotions_cannot_leave_no_admin(
    app, client, admin, make_principal, buildmax_engine, request
):
    """Two admins disable each other at the same moment: one must win, one
    must get 409. A barrier in an audit hook holds both transactions after
    their last-admin check. Catches a last-admin check that counts without
    locking (read-then-write): both see one other admin and both commit."""
    other = await make_principal("human", system_role="admin")
    arrived = 0
    both_in = asyncio.Event()

    class Barrier:
        @hookimpl
        async def buildmax_audit_record(self, tx, event):
            nonlocal arrived
            if event.action != "principal.disabled":
                return
            arrived += 1
            if arrived == 2:
                both_in.set()
            # SQLite serialises writers: the second cannot arrive; do not wait forever.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(both_in.wait(), timeout=1.0)

    app.plugins.pm.register(Barrier(), name="barrier")
    try:
        answers = await asyncio.gather(
            client.patch(
                f"/v1/principals/{admin.id}", json={"disabled": True}, headers=admin.headers
            ),
            client.patch(
                f"/v1/principals/{other.id}", json={"disabled": True}, headers=admin.headers
            ),
        )
    finally:
        app.plugins.pm.unregister(name="barrier")
    enabled_admins = await _count(
        app, principals, principals.c.system_role == "admin", principals.c.disabled_at.is_(None)
    )
    assert enabled_admins == 1
    assert sorted(r.status_code for r in answers) == [200, 409]


async def test_a_non_admin_changes_its_own_name_and_password_but_not_its_role(
    app, client, admin, make_principal, audit_log, caplog
):
    caplog.set_level(logging.DEBUG)
    created = await _create_human(client, admin, "ada")
    bob = await make_principal("human")
    session = await (await _sign_in(client, "ada", PASSWORD)).get_json()
    me = _bearer(session["token"])
    url = f"/v1/principals/{created['id']}"

    renamed = await client.patch(url, json={"display_name": "Ada L."}, headers=me)
    assert (await renamed.get_json())["display_name"] == "Ada L."
    other_session = await (await _sign_in(client, "ada", PASSWORD)).get_json()
    # A token alone cannot take the account over: the current password is needed.
    for proof in ({}, {"current_password": "not the password"}):
        refused = await client.patch(url, json={"password": OTHER_PASSWORD, **proof}, headers=me)
        await _problem(refused, 403, "forbidden")
    reset = await client.patch(
        url, json={"password": OTHER_PASSWORD, "current_password": PASSWORD}, headers=me
    )
    assert reset.status_code == 200
    await _problem(await _sign_in(client, "ada", PASSWORD), 401, "unauthenticated")
    assert (await _sign_in(client, "ada", OTHER_PASSWORD)).status_code == 201
    # The session that changed it goes on; the other sign-in session ended.
    assert (await client.get("/v1/principals/me", headers=me)).status_code == 200
    ended = await client.get("/v1/principals/me", headers=_bearer(other_session["token"]))
    assert ended.status_code == 401

    for change in ({"system_role": "admin"}, {"disabled": True}, {"system_role": None}):
        await _problem(await client.patch(url, json=change, headers=me), 403, "forbidden")
    # Someone else's record is not even visible.
    await _problem(
        await client.patch(f"/v1/principals/{bob.id}", json={"display_name": "x"}, headers=me),
        404,
        "not-found",
    )

    row = (await _rows(app, principals, principals.c.public_id == created["id"]))[0]
    assert (row["display_name"], row["system_role"], row["disabled_at"]) == ("Ada L.", None, None)
    bob_row = (await _rows(app, principals, principals.c.id == bob.pk))[0]
    assert bob_row["display_name"] == ""
    changes = [
        (e.action, dict(e.details))
        for e in audit_log.events
        if e.action.startswith("principal.") and e.target_id == created["id"]
    ]
    assert changes == [
        ("principal.created", {"kind": "human", "name": "ada", "system_role": None}),
        ("principal.updated", {"display_name": "Ada L."}),
        ("principal.password_set", {}),
    ]
    _secrets_absent([_audit_text(audit_log), caplog.text], PASSWORD, OTHER_PASSWORD)


# == tokens ==================================================================================


async def test_a_token_secret_is_shown_once_and_stored_only_as_its_verifier(
    app, client, make_principal, audit_log, caplog
):
    caplog.set_level(logging.DEBUG)
    agent = await make_principal("agent")
    made = await client.post(
        "/v1/tokens",
        json={"name": "ci"},
        headers={**agent.headers, "Idempotency-Key": "token-ci-1"},
    )
    assert made.status_code == 201
    issued = await made.get_json()
    secret = issued["token"]
    assert secret.startswith("bmx_")
    assert (issued["principal_id"], issued["name"], issued["origin"]) == (agent.id, "ci", "api")
    assert (await _me(client, secret)).status_code == 200

    listed = await client.get("/v1/tokens", headers=agent.headers)
    listed_text = (await listed.get_data()).decode()
    items = (await listed.get_json())["items"]
    assert issued["id"] in [t["id"] for t in items]
    assert all("token" not in item for item in items)
    shown = await client.get(f"/v1/tokens/{issued['id']}", headers=agent.headers)
    shown_body = await shown.get_json()
    assert shown_body["id"] == issued["id"] and "token" not in shown_body
    _secrets_absent([listed_text, (await shown.get_data()).decode()], secret)

    # Durable: the row holds the SHA-256 verifier, and no column holds the secret.
    rows = await _rows(app, tokens)
    row = next(r for r in rows if r["public_id"] == issued["id"])
    assert row["verifier"] == hashlib.sha256(secret.encode()).hexdigest()
    for each in rows:
        for value in each.values():
            assert secret not in str(value)
    # Nor does the idempotency receipt of the answer that carried it.
    receipts = await _rows(app, idempotency_receipts)
    assert len(receipts) == 1
    assert secret not in json.dumps(receipts, default=str)

    created = [e for e in audit_log.events if e.action == "token.created"]
    assert [(e.target_id, dict(e.details)) for e in created] == [
        (issued["id"], {"principal_id": agent.id, "name": "ci"})
    ]
    _secrets_absent([_audit_text(audit_log), caplog.text], secret, agent.token)


async def test_rotating_a_token_returns_a_new_secret_and_ends_the_old(
    app, client, make_principal, audit_log
):
    agent = await make_principal("agent")
    old = await (
        await client.post("/v1/tokens", json={"name": "ci"}, headers=agent.headers)
    ).get_json()
    rotated = await client.post(f"/v1/tokens/{old['id']}/rotate", headers=agent.headers)
    assert rotated.status_code == 201
    new = await rotated.get_json()
    assert new["id"] != old["id"]
    assert new["token"] != old["token"]
    assert new["name"] == "ci"

    await _problem(await _me(client, old["token"]), 401, "unauthenticated")
    me = await _me(client, new["token"])
    assert (await me.get_json())["id"] == agent.id

    by_id = {r["public_id"]: r for r in await _rows(app, tokens)}
    assert by_id[old["id"]]["revoked_at"] == app.clock.now_ms()
    assert by_id[new["id"]]["revoked_at"] is None
    assert by_id[new["id"]]["verifier"] == hashlib.sha256(new["token"].encode()).hexdigest()

    rotations = [e for e in audit_log.events if e.action == "token.rotated"]
    assert [(e.target_id, dict(e.details)) for e in rotations] == [
        (new["id"], {"principal_id": agent.id, "replaces": old["id"]})
    ]
    # A revoked token cannot be rotated again.
    again = await client.post(f"/v1/tokens/{old['id']}/rotate", headers=agent.headers)
    await _problem(again, 404, "not-found")
    assert len(by_id) == await _count(app, tokens)


async def test_a_principal_cannot_see_or_revoke_anothers_token_but_an_admin_can(
    app, client, admin, make_principal, audit_log
):
    alice = await make_principal("agent")
    bob = await make_principal("agent")
    token = await (
        await client.post("/v1/tokens", json={"name": "alice-ci"}, headers=alice.headers)
    ).get_json()
    tid = token["id"]

    await _problem(await client.get(f"/v1/tokens/{tid}", headers=bob.headers), 404, "not-found")
    await _problem(await client.delete(f"/v1/tokens/{tid}", headers=bob.headers), 404, "not-found")
    await _problem(
        await client.post(f"/v1/tokens/{tid}/rotate", headers=bob.headers), 404, "not-found"
    )
    await _problem(
        await client.get("/v1/tokens", query_string={"principal": alice.id}, headers=bob.headers),
        403,
        "forbidden",
    )
    bobs = await (await client.get("/v1/tokens", headers=bob.headers)).get_json()
    assert tid not in [t["id"] for t in bobs["items"]]
    assert (await _me(client, token["token"])).status_code == 200
    assert (await _rows(app, tokens, tokens.c.public_id == tid))[0]["revoked_at"] is None
    assert audit_log.actions() == ["token.created"]

    shown = await client.get(f"/v1/tokens/{tid}", headers=admin.headers)
    assert (await shown.get_json())["principal_id"] == alice.id
    listed = await client.get(
        "/v1/tokens", query_string={"principal": alice.id}, headers=admin.headers
    )
    assert tid in [t["id"] for t in (await listed.get_json())["items"]]
    revoked = await client.delete(f"/v1/tokens/{tid}", headers=admin.headers)
    assert revoked.status_code == 204
    await _problem(await _me(client, token["token"]), 401, "unauthenticated")
    assert (await _me(client, alice.token)).status_code == 200  # only that one token ended
    assert [(e.action, e.actor_id, e.target_id, dict(e.details)) for e in audit_log.events][-1] == (
        "token.revoked",
        admin.id,
        tid,
        {"principal_id": alice.id},
    )

    # Revoking again is not an error, and not a second event.
    assert (await client.delete(f"/v1/tokens/{tid}", headers=admin.headers)).status_code == 204
    assert audit_log.actions().count("token.revoked") == 1


async def test_last_used_at_is_written_at_most_once_per_interval(
    app, client, clock, make_principal, monkeypatch
):
    agent = await make_principal("agent")
    token_row = (await _rows(app, tokens, tokens.c.principal_id == agent.pk))[0]
    assert token_row["last_used_at"] is None
    toucher = app.token_toucher
    original = toucher._write
    writes: list[tuple[int, int]] = []

    async def counting_write(tx: Any, token_pk: int, now: int) -> None:
        writes.append((token_pk, now))
        await original(tx, token_pk, now)

    monkeypatch.setattr(toucher, "_write", counting_write)

    async def last_used() -> int | None:
        await toucher.drain()
        return (await _rows(app, tokens, tokens.c.id == token_row["id"]))[0]["last_used_at"]

    interval = app.settings.token_touch_interval_seconds
    first = clock.now_ms()
    assert (await _me(client, agent.token)).status_code == 200
    assert await last_used() == first

    clock.advance(seconds=interval / 2)
    assert (await _me(client, agent.token)).status_code == 200
    assert await last_used() == first  # within the interval: not written again

    mine = [w for w in writes if w[0] == token_row["id"]]
    assert mine == [(token_row["id"], first)]

    clock.advance(seconds=interval / 2 + 1)
    later = clock.now_ms()
    assert (await _me(client, agent.token)).status_code == 200
    assert await last_used() == later
    assert [w for w in writes if w[0] == token_row["id"]] == [
        (token_row["id"], first),
        (token_row["id"], later),
    ]
    shown = await client.get(f"/v1/tokens/{token_row['public_id']}", headers=agent.headers)
    assert (await shown.get_json())["last_used_at"] == to_rfc3339(later)


# == spaces and members =======================================================================


async def test_admins_and_operators_create_spaces_and_own_them(
    app, client, admin, make_principal, audit_log
):
    operator = await make_principal("human", system_role="operator")
    made = await _create_space(client, admin, "alpha", name="Alpha")
    assert made.status_code == 201
    alpha = await made.get_json()
    assert (alpha["slug"], alpha["name"], alpha["role"]) == ("alpha", "Alpha", "owner")
    by_operator = await _create_space(client, operator, "beta")
    assert (await by_operator.get_json())["role"] == "owner"

    rows = {r["slug"]: r for r in await _rows(app, spaces)}
    assert set(rows) == {"alpha", "beta"}
    assert rows["alpha"]["created_by"] == admin.pk
    owners = {
        (r["space_id"], r["principal_id"], r["role"]) for r in await _rows(app, space_members)
    }
    assert owners == {
        (rows["alpha"]["id"], admin.pk, "owner"),
        (rows["beta"]["id"], operator.pk, "owner"),
    }
    created = [e for e in audit_log.events if e.action == "space.created"]
    assert [(e.actor_id, e.space_id, dict(e.details)) for e in created] == [
        (admin.id, alpha["id"], {"slug": "alpha", "name": "Alpha", "owner_id": admin.id}),
        (
            operator.id,
            rows["beta"]["public_id"],
            {"slug": "beta", "name": "beta", "owner_id": operator.id},
        ),
    ]

    for who in (await make_principal("human"), await make_principal("agent")):
        await _problem(await _create_space(client, who, "gamma"), 403, "forbidden")
    assert await _count(app, spaces, spaces.c.slug == "gamma") == 0
    assert audit_log.actions().count("space.created") == 2


async def test_a_space_can_be_created_for_another_owner(app, client, admin, make_principal):
    bob = await make_principal("human")
    made = await _create_space(client, admin, "bobs", owner_id=bob.id)
    assert made.status_code == 201
    assert (await made.get_json())["role"] is None  # the creator is not a member
    space_pk = (await _rows(app, spaces, spaces.c.slug == "bobs"))[0]["id"]
    members = await _rows(app, space_members, space_members.c.space_id == space_pk)
    assert [(m["principal_id"], m["role"]) for m in members] == [(bob.pk, "owner")]


async def test_a_duplicate_slug_is_409_slug_taken_with_no_second_row(
    app, client, admin, make_principal, audit_log
):
    operator = await make_principal("human", system_role="operator")
    assert (await _create_space(client, admin, "dup")).status_code == 201
    await _problem(await _create_space(client, operator, "dup"), 409, "slug-taken")
    rows = await _rows(app, spaces, spaces.c.slug == "dup")
    assert len(rows) == 1
    members = await _rows(app, space_members)
    assert [(m["principal_id"], m["role"]) for m in members] == [(admin.pk, "owner")]
    assert audit_log.actions() == ["space.created"]


async def test_putting_a_member_adds_then_changes_its_role_with_audit_and_events(
    app, client, make_principal, make_space, audit_log
):
    owner = await make_principal("human")
    agent = await make_principal("agent")
    space = await make_space(owner)

    added = await _put_member(client, owner, space, agent, "member")
    assert added.status_code == 200
    body = await added.get_json()
    assert (body["principal_id"], body["name"], body["kind"], body["role"]) == (
        agent.id,
        agent.name,
        "agent",
        "member",
    )
    assert (await _members(app, space))[agent.pk] == "member"

    changed = await _put_member(client, owner, space, agent, "admin")
    assert (await changed.get_json())["role"] == "admin"
    assert (await _members(app, space)) == {owner.pk: "owner", agent.pk: "admin"}

    # The same role again changes nothing: no event, no audit.
    assert (await _put_member(client, owner, space, agent, "admin")).status_code == 200

    assert [(e.action, e.space_id, e.target_id, dict(e.details)) for e in audit_log.events] == [
        ("space.member.added", space.id, agent.id, {"role": "member", "previous_role": None}),
        (
            "space.member.role_changed",
            space.id,
            agent.id,
            {"role": "admin", "previous_role": "member"},
        ),
    ]
    assert await _space_events(app, space) == [
        (1, "space.member.changed", {"principal_id": agent.id, "role": "member"}),
        (2, "space.member.changed", {"principal_id": agent.id, "role": "admin"}),
    ]


async def test_only_owners_grant_or_take_the_owner_role(
    app, client, make_principal, make_space, audit_log
):
    owner = await make_principal("human")
    space_admin = await make_principal("human")
    carol = await make_principal("agent")
    space = await make_space(owner)
    await _put_member(client, owner, space, space_admin, "admin")
    await _put_member(client, owner, space, carol, "member")
    before_events = await _space_events(app, space)
    before_audit = len(audit_log.events)

    refused = [
        await _put_member(client, space_admin, space, carol, "owner"),
        await _put_member(client, space_admin, space, owner, "admin"),
        await client.delete(
            f"/v1/spaces/{space.id}/members/{owner.id}", headers=space_admin.headers
        ),
    ]
    for response in refused:
        await _problem(response, 403, "forbidden")
    assert await _members(app, space) == {
        owner.pk: "owner",
        space_admin.pk: "admin",
        carol.pk: "member",
    }
    assert await _space_events(app, space) == before_events
    assert len(audit_log.events) == before_audit

    # A space admin manages the roles below owner; an owner grants owner.
    assert (await _put_member(client, space_admin, space, carol, "viewer")).status_code == 200
    assert (await _put_member(client, owner, space, carol, "owner")).status_code == 200
    assert (await _members(app, space))[carol.pk] == "owner"


async def test_the_last_owner_cannot_be_demoted_or_removed(
    app, client, admin, make_principal, make_space, audit_log
):
    owner = await make_principal("human")
    space = await make_space(owner)
    leave = f"/v1/spaces/{space.id}/members/{owner.id}"

    await _problem(await _put_member(client, owner, space, owner, "admin"), 409, "last-owner")
    await _problem(await client.delete(leave, headers=owner.headers), 409, "last-owner")
    # Not even a system admin can leave the space ownerless.
    await _problem(await _put_member(client, admin, space, owner, "member"), 409, "last-owner")
    await _problem(await client.delete(leave, headers=admin.headers), 409, "last-owner")
    assert await _members(app, space) == {owner.pk: "owner"}
    assert await _space_events(app, space) == []
    assert audit_log.events == []

    # With a second owner, the first may go.
    co_owner = await make_principal("human")
    assert (await _put_member(client, owner, space, co_owner, "owner")).status_code == 200
    assert (await client.delete(leave, headers=owner.headers)).status_code == 204
    assert await _members(app, space) == {co_owner.pk: "owner"}


async def test_a_space_admin_cannot_tell_a_hidden_name_from_an_unknown_one(
    app, client, admin, make_principal, make_space, audit_log
):
    """A space admin (no system role) may name, in ``PUT`` and ``DELETE
    /members/{principal}``, only principals it can see: itself and those
    sharing a space with it. Any other name gets the very answer a name
    nobody has gets, and changes nothing; a public id (handed out, not
    guessable) still works, and a system admin sees everyone. Catches a
    lookup of the name server-wide (the 200 or the different 404 told the
    admin the name exists)."""
    space_admin = await make_principal("human")
    space = await make_space(space_admin)
    elsewhere = await make_space(space_admin)
    hidden = await make_principal("agent", name="hidden-agent")
    colleague = await make_principal("agent", name="colleague-agent")
    await _put_member(client, space_admin, elsewhere, colleague, "member")
    before_members, before_audit = await _members(app, space), len(audit_log.events)

    def answer(body: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in body.items() if k not in ("instance", "request_id")}

    for method, kwargs in (("PUT", {"json": {"role": "member"}}), ("DELETE", {})):
        answers = []
        for name in ("hidden-agent", "nobody-has-this-name"):
            url = f"/v1/spaces/{space.id}/members/{name}"
            response = await client.open(url, method=method, headers=space_admin.headers, **kwargs)
            answers.append(
                (response.status_code, answer(await _problem(response, 404, "not-found")))
            )
        assert answers[0] == answers[1], method
    assert await _members(app, space) == before_members
    assert len(audit_log.events) == before_audit

    # Visible by name: a principal sharing another space with the admin.
    added = await client.put(
        f"/v1/spaces/{space.id}/members/colleague-agent",
        json={"role": "member"},
        headers=space_admin.headers,
    )
    assert added.status_code == 200, await added.get_json()
    assert colleague.pk in await _members(app, space)
    # By public id, any principal; a system admin names anyone.
    by_id = await _put_member(client, space_admin, space, hidden, "viewer")
    assert by_id.status_code == 200
    system = await client.delete(
        f"/v1/spaces/{space.id}/members/hidden-agent", headers=admin.headers
    )
    assert system.status_code == 204
    assert hidden.pk not in await _members(app, space)


async def test_a_member_can_remove_itself_but_not_others(
    app, client, make_principal, make_space, audit_log
):
    owner = await make_principal("human")
    viewer = await make_principal("agent")
    member = await make_principal("agent")
    space = await make_space(owner)
    await _put_member(client, owner, space, viewer, "viewer")
    await _put_member(client, owner, space, member, "member")

    for target in (viewer, owner):
        url = f"/v1/spaces/{space.id}/members/{target.id}"
        await _problem(await client.delete(url, headers=member.headers), 403, "forbidden")
    assert len(await _members(app, space)) == 3

    left = await client.delete(f"/v1/spaces/{space.id}/members/{viewer.id}", headers=viewer.headers)
    assert left.status_code == 204
    assert viewer.pk not in await _members(app, space)
    removed = audit_log.events[-1]
    assert (removed.action, removed.actor_id, removed.target_id, dict(removed.details)) == (
        "space.member.removed",
        viewer.id,
        viewer.id,
        {"previous_role": "viewer"},
    )
    assert (await _space_events(app, space))[-1] == (
        3,
        "space.member.changed",
        {"principal_id": viewer.id, "role": None},
    )
    # Gone means gone: the space is now invisible to it.
    gone = await client.get(f"/v1/spaces/{space.id}", headers=viewer.headers)
    await _problem(gone, 404, "not-found")


async def test_listing_members_pages_through_everyone_once_in_name_order(
    app, client, make_principal, make_space
):
    owner = await make_principal("human", name="member-0-owner")
    space = await make_space(owner)
    for letter in "ecadb":
        joined = await make_principal("agent", name=f"member-{letter}")
        assert (await _put_member(client, owner, space, joined, "viewer")).status_code == 200
    names: list[str] = []
    cursor = None
    pages = 0
    while True:
        query = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        page = await client.get(
            f"/v1/spaces/{space.id}/members", query_string=query, headers=owner.headers
        )
        body = await page.get_json()
        names.extend(m["name"] for m in body["items"])
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert names == ["member-0-owner", *(f"member-{c}" for c in "abcde")]
    assert pages == 3


async def test_disabling_twice_changes_and_audits_once(client, admin, make_principal, audit_log):
    agent = await make_principal("agent")
    url = f"/v1/principals/{agent.id}"
    first = await (
        await client.patch(url, json={"disabled": True}, headers=admin.headers)
    ).get_json()
    again = await (
        await client.patch(url, json={"disabled": True}, headers=admin.headers)
    ).get_json()
    assert first["disabled_at"] == again["disabled_at"]
    assert audit_log.actions() == ["principal.disabled"]
