"""Membership changes reach the plugins, and membership gates every route
an attempt's token may use (issue 14, item 6).

- ``buildmax_member_changed``: the kernel announces every added member,
  role change and removal (a member leaving too) inside the change's
  transaction; a plugin that fails rolls the change back.
- Every route that accepts an attempt-scoped token, whatever plugin serves
  it and whether or not its path names the space, answers 404 to a
  principal who is no longer a member of the attempt's space, with its main
  token and with a run token nobody revoked.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_hookspecs import hookimpl

from buildmax.spaces import put_member
from buildmax.tables import space_members

PROBLEM = "urn:buildmax:problem:"


class MembershipWatcher:
    """A plugin that records every ``buildmax_member_changed`` call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str | None, str | None, str | None]] = []
        self.fail = False

    @hookimpl
    async def buildmax_member_changed(
        self, tx: Any, space_id: str, principal_id: str, role: Any, previous_role: Any, actor: Any
    ) -> None:
        if self.fail:
            raise RuntimeError("injected: the plugin failed")
        self.calls.append((space_id, principal_id, role, previous_role, actor.principal_id))


@pytest.fixture
def watcher(app: Any) -> Any:
    plugin = MembershipWatcher()
    app.plugins.pm.register(plugin, name="membership-watcher")
    yield plugin
    app.plugins.pm.unregister(plugin)


async def test_every_membership_change_is_announced_once_with_who_made_it(
    client, make_principal, make_space, watcher
):
    owner = await make_principal("human")
    agent = await make_principal("agent")
    space = await make_space(owner)
    member = f"/v1/spaces/{space.id}/members/{agent.id}"

    async def put(role: str) -> None:
        answer = await client.put(member, json={"role": role}, headers=owner.headers)
        assert answer.status_code == 200

    await put("member")
    await put("viewer")
    await put("viewer")  # no change, no announcement
    assert (await client.delete(member, headers=owner.headers)).status_code == 204
    await put("member")
    assert (await client.delete(member, headers=agent.headers)).status_code == 204  # leaves
    assert watcher.calls == [
        (space.id, agent.id, "member", None, owner.id),
        (space.id, agent.id, "viewer", "member", owner.id),
        (space.id, agent.id, None, "viewer", owner.id),
        (space.id, agent.id, "member", None, owner.id),
        (space.id, agent.id, None, "member", agent.id),
    ]


async def test_a_plugin_failing_on_a_removal_rolls_the_removal_back(
    app, client, make_principal, make_space, watcher
):
    """Catches: the hook called outside the removal's transaction (the
    member would be gone while a plugin failed to end its work)."""
    owner = await make_principal("human")
    agent = await make_principal("agent")
    space = await make_space(owner)
    async with app.db.write() as tx:
        await put_member(tx, space.pk, agent.pk, "member", app.clock.now_ms())
    watcher.fail = True
    answer = await client.delete(f"/v1/spaces/{space.id}/members/{agent.id}", headers=owner.headers)
    assert answer.status_code == 500
    async with app.db.read() as conn:
        role = await conn.fetch_val(
            sa.select(space_members.c.role).where(
                space_members.c.space_id == space.pk, space_members.c.principal_id == agent.pk
            )
        )
        audited = await conn.fetch_val(
            sa.text("SELECT count(*) FROM audit_events WHERE action = 'space.member.removed'")
        )
    assert (role, audited) == ("member", 0)


# -- every route an attempt's token may use ------------------------------------------------


#: A valid body for the attempt-scoped routes that take another than
#: ``{"generation": ...}``: refused for its membership, not its body.
BODIES = {"/v1/attempts/{attempt}/materialization-failures": {"reason": "download"}}


#: Routes that accept an attempt's token but act on no space themselves:
#: ``/mcp`` relays each tool call to a route walked here (the MCP plugin's
#: tests show a removed member's tool calls refused the same way).
RELAYS = {("POST", "/mcp")}


def _attempt_scoped(document: dict[str, Any]) -> list[tuple[str, str]]:
    """(method, path) of every operation that accepts an attempt's token."""
    return sorted(
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        if "attempt" in operation.get("x-token-scopes", []) and (method.upper(), path) not in RELAYS
    )


async def test_no_route_an_attempts_token_may_use_serves_a_removed_member(
    app, client, make_principal, make_space
):
    """The attempt's claimant is no longer a member of its space and its
    run token is still live (its membership row deleted behind the server's
    back, so no plugin revoked anything): every attempt-scoped operation of
    every plugin answers 404 to both tokens. Catches: a route that trusts
    the token's scope, or the claimant, instead of asking for membership
    (the marketplace's package routes did)."""
    owner = await make_principal("human")
    agent = await make_principal("agent")
    space = await make_space(owner)
    async with app.db.write() as tx:
        await put_member(tx, space.pk, agent.pk, "member", app.clock.now_ms())
    base = f"/v1/spaces/{space.id}"
    await client.post(f"{base}/projects", json={"name": "main"}, headers=owner.headers)
    task = await (
        await client.post(
            f"{base}/tasks", json={"project": "main", "title": "t"}, headers=owner.headers
        )
    ).get_json()
    claim = await (
        await client.post(f"{base}/tasks/{task['id']}/claim", json={}, headers=agent.headers)
    ).get_json()
    run = {"Authorization": f"Bearer {claim['token']}"}
    artifact = await (
        await client.post(
            f"{base}/artifacts",
            data=b"log",
            headers={**run, "Content-Type": "text/plain"},
            query_string={"name": "log.txt"},
        )
    ).get_json()
    values = {
        "space": space.id,
        "attempt": claim["attempt"]["id"],
        "task": task["id"],
        "ident": task["id"],
        "artifact": artifact["id"],
        "name": "notes",
        "finding": "fi_none",
        "lesson": "ls_none",
    }
    document = await (await client.get("/v1/openapi.json")).get_json()
    operations = _attempt_scoped(document)

    def url(path: str) -> str:
        return re.sub(r"\{(\w+)\}", lambda m: values[m.group(1)], path)

    # The positive control: these answer the run token while it is a member's.
    readable = {
        "/v1/spaces/{space}/tasks/{task}",
        "/v1/spaces/{space}/attempts/{attempt}",
        "/v1/spaces/{space}/artifacts/{artifact}",
        "/v1/spaces/{space}/artifacts/{artifact}/content",
        "/v1/attempts/{attempt}/packages",
    }
    assert {("GET", path) for path in readable} <= set(operations)
    for path in readable:
        assert (await client.get(url(path), headers=run)).status_code == 200, path

    async with app.db.write() as tx:
        await tx.execute(
            sa.delete(space_members).where(
                space_members.c.space_id == space.pk, space_members.c.principal_id == agent.pk
            )
        )
    wrong = {}
    for method, path in operations:
        for who, headers in (("main token", agent.headers), ("run token", run)):
            body = None if method == "GET" else BODIES.get(path, {"generation": 1})
            answer = await client.open(url(path), method=method, json=body, headers=headers)
            problem = await answer.get_json()
            if answer.status_code != 404 or problem["type"] != PROBLEM + "not-found":
                wrong[(method, path, who)] = (answer.status_code, problem)
    assert wrong == {}
