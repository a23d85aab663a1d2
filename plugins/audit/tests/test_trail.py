"""J15: every kernel mutation leaves exactly one stored event per audited
action and target, with actor, space, action and target, on the right chain;
a change that fails or rolls back leaves none; an undeclared detail key is
refused loudly and nothing is written."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from buildmax_audit.chain import GENESIS, chain_hash, record_of
from buildmax_audit.tables import SYSTEM_CHAIN, chains, events
from buildmax_audit.verify import verify_database
from buildmax_hookspecs import SYSTEM_ACTOR, AuditAction, hookimpl

from buildmax.audit import AuditError
from buildmax.bootstrap import bootstrap_admin
from buildmax.tables import principals, spaces

from .conftest import heads, record_rename, rename, trail

PASSWORD = "correct horse battery staple"
#: The space is the one the request creates.
CREATED = "<created>"


class Step:
    """One HTTP mutation and the single event it must leave."""

    def __init__(self, client: Any, app: Any) -> None:
        self.client, self.app = client, app
        self.seen = 0

    async def __call__(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        json: Any,
        *,
        status: int,
        action: str,
        actor: str,
        actor_kind: str,
        space: str | None,
        target: tuple[str, str | None],
        details: dict[str, Any] | None = None,
    ) -> Any:
        response = await self.client.open(path, method=method, headers=headers, json=json)
        assert response.status_code == status, await response.get_data(as_text=True)
        body = await response.get_json() if status != 204 else None
        events = await trail(self.app)
        new = sorted(events, key=lambda e: e["id"])[self.seen :]
        self.seen = len(events)
        assert len(new) == 1, [e["action"] for e in new]
        event = new[0]
        target_id = target[1] if target[1] is not None else (body or {}).get("id")
        if space == CREATED:
            space = target_id
        assert (
            event["action"],
            event["actor_id"],
            event["actor_kind"],
            event["space_id"],
            event["chain"],
            event["target_type"],
            event["target_id"],
        ) == (
            action,
            actor,
            actor_kind,
            space,
            space or SYSTEM_CHAIN,
            target[0],
            target_id,
        )
        if details is not None:
            assert event["details"] == details
        assert event["request_id"] == response.headers.get("X-Request-Id")
        return body


async def test_every_kernel_mutation_leaves_exactly_one_event(app, client, admin, make_space):
    step = Step(client, app)
    step.seen = len(await trail(app))
    as_admin = admin.headers
    system = {"actor": admin.id, "actor_kind": "human", "space": None}

    alice = await step(
        "POST", "/v1/principals", as_admin,
        {"kind": "human", "name": "alice", "password": PASSWORD},
        status=201, action="principal.created", target=("principal", None), **system,
        details={"kind": "human", "name": "alice", "system_role": None},
    )  # fmt: skip
    bot = await step(
        "POST", "/v1/principals", as_admin, {"kind": "agent", "name": "bot"},
        status=201, action="principal.created", target=("principal", None), **system,
    )  # fmt: skip
    for body, action in (
        ({"display_name": "Alice A."}, "principal.updated"),
        ({"system_role": "operator"}, "principal.role_changed"),
        ({"password": PASSWORD + "!"}, "principal.password_set"),
        ({"disabled": True}, "principal.disabled"),
        ({"disabled": False}, "principal.enabled"),
    ):
        await step(
            "PATCH", f"/v1/principals/{alice['id']}", as_admin, body,
            status=200, action=action, target=("principal", alice["id"]), **system,
        )  # fmt: skip

    session = await step(
        "POST", "/v1/sessions", {}, {"name": "alice", "password": PASSWORD + "!"},
        status=201, action="session.created", target=("token", None),
        actor=alice["id"], actor_kind="human", space=None,
    )  # fmt: skip
    as_alice = {"Authorization": f"Bearer {session['token']}"}
    token = await step(
        "POST", "/v1/tokens", as_admin, {"name": "ci", "principal_id": bot["id"]},
        status=201, action="token.created", target=("token", None), **system,
        details={"principal_id": bot["id"], "name": "ci"},
    )  # fmt: skip
    rotated = await step(
        "POST", f"/v1/tokens/{token['id']}/rotate", as_admin, None,
        status=201, action="token.rotated", target=("token", None), **system,
    )  # fmt: skip
    await step(
        "DELETE", f"/v1/tokens/{rotated['id']}", as_admin, None,
        status=204, action="token.revoked", target=("token", rotated["id"]), **system,
    )  # fmt: skip

    space = await step(
        "POST", "/v1/spaces", as_admin, {"slug": "alpha", "name": "Alpha"},
        status=201, action="space.created", target=("space", None),
        actor=admin.id, actor_kind="human", space=CREATED,
    )  # fmt: skip
    in_space = {"actor": admin.id, "actor_kind": "human", "space": space["id"]}
    await step(
        "PATCH", f"/v1/spaces/{space['id']}", as_admin, {"name": "Alpha 2"},
        status=200, action="space.updated", target=("space", space["id"]), **in_space,
    )  # fmt: skip
    member = f"/v1/spaces/{space['id']}/members/{bot['id']}"
    for body, status, action in (
        ({"role": "member"}, 200, "space.member.added"),
        ({"role": "admin"}, 200, "space.member.role_changed"),
    ):
        await step(
            "PUT", member, as_admin, body, status=status, action=action,
            target=("principal", bot["id"]), **in_space,
        )  # fmt: skip
    await step(
        "DELETE", member, as_admin, None, status=204, action="space.member.removed",
        target=("principal", bot["id"]), **in_space,
    )  # fmt: skip
    await step(
        "DELETE", "/v1/sessions/current", as_alice, None,
        status=204, action="token.revoked", target=("token", session["id"]),
        actor=alice["id"], actor_kind="human", space=None,
    )  # fmt: skip

    # The space's chain holds its events and only those; every chain verifies.
    chains = await heads(app)
    assert chains[space["id"]]["seq"] == 5
    assert all(report.ok for report in await verify_database(app))


async def test_a_read_or_a_refused_mutation_leaves_no_event(app, client, admin, make_principal):
    agent = await make_principal("agent")
    before = await trail(app)
    assert (await client.get("/v1/principals", headers=admin.headers)).status_code == 200
    refused = await client.post(
        "/v1/principals", headers=agent.headers, json={"kind": "agent", "name": "x"}
    )
    assert refused.status_code == 403
    invalid = await client.post("/v1/spaces", headers=admin.headers, json={"slug": "NO"})
    assert invalid.status_code == 422
    wrong = await client.post("/v1/sessions", json={"name": "admin", "password": "nope-nope"})
    assert wrong.status_code == 401
    assert await trail(app) == before


async def test_bootstrap_is_a_system_event_on_the_system_chain(app):
    issued = await bootstrap_admin(app, name="root")
    bootstrapped, token = await trail(app)
    assert (
        bootstrapped["action"],
        bootstrapped["actor_id"],
        bootstrapped["actor_kind"],
        bootstrapped["chain"],
    ) == ("admin.bootstrapped", None, "system", SYSTEM_CHAIN)
    assert (token["action"], token["target_id"], token["details"]["name"]) == (
        "token.created",
        issued.public_id,
        "bootstrap",
    )
    assert [bootstrapped["seq"], token["seq"]] == [1, 2]
    assert bootstrapped["hash"] == chain_hash(GENESIS, record_of(bootstrapped))


async def test_a_new_password_audits_every_session_it_ends(app, client, admin):
    created = await client.post(
        "/v1/principals",
        headers=admin.headers,
        json={"kind": "human", "name": "dora", "password": PASSWORD},
    )
    dora = (await created.get_json())["id"]
    sessions = []
    for _ in range(3):
        response = await client.post("/v1/sessions", json={"name": "dora", "password": PASSWORD})
        sessions.append(await response.get_json())
    as_first = {"Authorization": f"Bearer {sessions[0]['token']}"}
    changed = await client.patch(
        f"/v1/principals/{dora}",
        headers=as_first,
        json={"password": PASSWORD + "?", "current_password": PASSWORD},
    )
    assert changed.status_code == 200
    revoked = await trail(app, events.c.action == "token.revoked")
    assert sorted(e["target_id"] for e in revoked) == sorted(s["id"] for s in sessions[1:])
    assert {(e["actor_id"], e["details"]["principal_id"]) for e in revoked} == {(dora, dora)}


async def test_two_sign_outs_at_once_are_audited_once(app, client, admin):
    response = await client.post("/v1/tokens", headers=admin.headers, json={"name": "twice"})
    token = await response.get_json()
    headers = {"Authorization": f"Bearer {token['token']}"}
    answers = await asyncio.gather(
        *(client.delete("/v1/sessions/current", headers=headers) for _ in range(5))
    )
    assert {a.status_code for a in answers} <= {204, 401}
    revoked = await trail(app, events.c.action == "token.revoked")
    assert [e["target_id"] for e in revoked] == [token["id"]]


class FailAfter:
    """Fails a change after the audit plugin took its event: at once (in
    the hook), or at the very end, after the chain was appended to."""

    def __init__(self, action: str, *, at_commit: bool) -> None:
        self.action, self.at_commit = action, at_commit

    @hookimpl(trylast=True)
    def buildmax_audit_record(self, tx: Any, event: Any) -> None:
        if event.action != self.action:
            return
        if not self.at_commit:
            raise RuntimeError("injected failure after the audit hook")

        async def fail() -> None:
            raise RuntimeError("injected failure after the chain append")

        tx.before_commit(fail, last=True)


@pytest.mark.parametrize("at_commit", [False, True], ids=["in-hook", "after-append"])
async def test_a_change_that_rolls_back_after_the_hook_leaves_no_event(
    app, client, admin, at_commit
):
    before, chains_before = await trail(app), await heads(app)
    app.plugins.pm.register(FailAfter("space.created", at_commit=at_commit), name="fail-after")
    try:
        response = await client.post(
            "/v1/spaces", headers=admin.headers, json={"slug": "doomed", "name": "Doomed"}
        )
    finally:
        app.plugins.pm.unregister(name="fail-after")
    assert response.status_code == 500
    async with app.db.read() as conn:
        assert await conn.fetch_all(spaces.select().where(spaces.c.slug == "doomed")) == []
    assert await trail(app) == before
    assert await heads(app) == chains_before
    # The next change appends where the chain left off.
    ok = await client.post("/v1/spaces", headers=admin.headers, json={"slug": "fine"})
    assert ok.status_code == 201
    assert all(report.ok for report in await verify_database(app))


async def test_an_undeclared_detail_key_is_refused_and_nothing_is_written(app, admin):
    before = await trail(app)
    with pytest.raises(AuditError, match=r"does not declare \['password'\]"):
        async with app.db.write() as tx:
            await tx.execute(principals.update().values(display_name="changed"))
            await app.audit.record(
                tx,
                SYSTEM_ACTOR,
                "principal.updated",
                target_type="principal",
                target_id=admin.id,
                details={"display_name": "changed", "password": "hunter22hunter22"},
            )
    assert await trail(app) == before
    async with app.db.read() as conn:
        names = {r["display_name"] for r in await conn.fetch_all(principals.select())}
    assert "changed" not in names


async def test_events_of_one_transaction_keep_their_order_on_each_chain(app, make_space, admin):
    space = await make_space(admin)
    async with app.db.write() as tx:
        for name in ("a", "b", "c"):
            await record_rename(app, tx, space.id, name)
            await app.audit.record(
                tx, SYSTEM_ACTOR, "principal.updated", target_type="principal", target_id=admin.id
            )
    on_space = await trail(app, events.c.chain == space.id)
    assert [(e["seq"], e["details"]["name"]) for e in on_space] == [(1, "a"), (2, "b"), (3, "c")]
    system = await trail(app, events.c.chain == SYSTEM_CHAIN)
    assert [e["action"] for e in system][-3:] == ["principal.updated"] * 3
    assert all(report.ok for report in await verify_database(app))


async def test_the_chain_is_appended_to_after_every_other_before_commit_callback(
    app, make_space, admin
):
    """The head lock is the last a transaction takes: work registered after
    the event (such as publishing the space's events) still sees the old head."""
    space = await make_space(admin)
    seen = []

    async def later() -> None:
        row = await tx.fetch_one(chains.select().where(chains.c.chain == space.id))
        seen.append(None if row is None else row["seq"])

    async with app.db.write() as tx:
        await record_rename(app, tx, space.id, "x")
        tx.before_commit(later)
    assert seen == [None]
    assert (await heads(app))[space.id]["seq"] == 1


async def test_a_transaction_with_many_events_appends_them_all_in_order(app, make_space, admin):
    space = await make_space(admin)
    async with app.db.write() as tx:
        for index in range(120):
            await record_rename(app, tx, space.id, f"n{index}")
    stored = await trail(app, events.c.chain == space.id)
    assert [(e["seq"], e["details"]["name"]) for e in stored] == [
        (index + 1, f"n{index}") for index in range(120)
    ]
    assert (await heads(app))[space.id]["head_hash"] == stored[-1]["hash"]
    assert all(report.ok for report in await verify_database(app))


async def test_a_retried_mutation_is_audited_once(app, client, admin):
    before = len(await trail(app))
    headers = {**admin.headers, "Idempotency-Key": "create-retry-1"}
    for _ in range(2):
        response = await client.post("/v1/spaces", headers=headers, json={"slug": "retried"})
        assert response.status_code == 201
    created = await trail(app, events.c.action == "space.created")
    assert len(created) == 1 and len(await trail(app)) == before + 1


TRICKY_NAMES = [
    "Ünïcode ✓ 🚀",
    'quotes " and \\ backslashes',
    '"seq":0, inside a value',
    "tab\tnew\nline\r and \u2028",
    "",
]


async def test_any_text_is_hashed_alike_by_every_engine(app, make_space, admin):
    """On PostgreSQL a single event's hash is computed by the database; it
    must agree with the canonical JSON hashed here, for any text."""
    space = await make_space(admin)
    for name in TRICKY_NAMES:
        await rename(app, space.id, name)
    stored = await trail(app, events.c.chain == space.id)
    previous = GENESIS
    for event, name in zip(stored, TRICKY_NAMES, strict=True):
        assert event["details"] == {"name": name}
        assert event["hash"] == chain_hash(previous, record_of(event))
        previous = event["hash"]
    assert all(report.ok for report in await verify_database(app))


async def test_details_over_8_kib_are_refused(app, make_space, admin):
    space = await make_space(admin)
    before = await trail(app)
    # 4,100 characters of two bytes each: under 8 KiB in characters, over it in bytes.
    for name in ("x" * 9000, "é" * 4100):
        with pytest.raises(AuditError, match="exceed 8192 bytes"):
            async with app.db.write() as tx:
                await record_rename(app, tx, space.id, name)
    assert await trail(app) == before
    await rename(app, space.id, "x" * 8000)


async def test_nested_details_hash_alike_on_every_engine(app, make_space, admin):
    """A detail holding its own ``seq`` key must not confuse the database's
    half of the hash (PostgreSQL splits the record around the top-level one)."""
    space = await make_space(admin)
    app.audit.actions["probe.nested"] = AuditAction(
        "probe.nested", "nested details", frozenset({"data"}), "space"
    )
    async with app.db.write() as tx:
        await app.audit.record(
            tx,
            SYSTEM_ACTOR,
            "probe.nested",
            space_id=space.id,
            target_type="space",
            target_id=space.id,
            details={"data": {"seq": 0, "z": [{"seq": 0}]}},
        )
    [event] = await trail(app, events.c.chain == space.id)
    assert event["hash"] == chain_hash(GENESIS, record_of(event))


async def test_concurrent_writers_on_shared_and_new_chains_neither_deadlock_nor_collide(
    app, make_space, admin
):
    """Transactions naming two chains in opposite orders lock them in one
    order; first appends to a chain nobody has written yet all land."""
    first, second = await make_space(admin), await make_space(admin)

    async def write(index: int) -> None:
        pair = (first.id, second.id) if index % 2 else (second.id, first.id)
        async with app.db.write() as tx:
            for chain in (*pair, f"sp_fresh_{index % 4}"):
                await record_rename(app, tx, chain, f"w{index}")
                await asyncio.sleep(0)

    await asyncio.gather(*(write(index) for index in range(40)))
    chains_now = await heads(app)
    assert chains_now[first.id]["seq"] == chains_now[second.id]["seq"] == 40
    assert [chains_now[f"sp_fresh_{n}"]["seq"] for n in range(4)] == [10] * 4
    assert all(report.ok for report in await verify_database(app))
