"""Space isolation, token scopes and revocation.

A member of space A gets 404 for every space-B route, exactly as if B did
not exist, whether B is named by public id or by slug.
"""

from __future__ import annotations

import pytest

from buildmax.tokens import issue_token

#: Every space route the kernel and the test plugin serve (method, path, body).
SPACE_ROUTES = [
    ("GET", "/v1/spaces/{s}", None),
    ("PATCH", "/v1/spaces/{s}", {"name": "taken over"}),
    ("GET", "/v1/spaces/{s}/members", None),
    ("PUT", "/v1/spaces/{s}/members/{p}", {"role": "owner"}),
    ("DELETE", "/v1/spaces/{s}/members/{p}", None),
    ("GET", "/v1/spaces/{s}/events", None),
    ("GET", "/v1/spaces/{s}/attention", None),
    ("POST", "/v1/spaces/{s}/testplugin/increment", None),
    ("POST", "/v1/spaces/{s}/testplugin/slow-increment", None),
]


def test_the_route_list_covers_every_space_route(app):
    """A new space route of the kernel or the test plugin must be added to
    SPACE_ROUTES (and so to the test). Other installed plugins test their own."""
    served = {
        rule.rule.replace("<space>", "{s}").replace("<principal>", "{p}")
        for rule in app.url_map.iter_rules()
        if rule.rule.startswith("/v1/spaces/<space>")
        and rule.endpoint.startswith(("buildmax_", "testplugin."))
    }
    assert served == {path for _, path, _ in SPACE_ROUTES}


@pytest.fixture
async def two_spaces(make_principal, make_space):
    alice = await make_principal("human")
    bob = await make_principal("human")
    space_a = await make_space(alice)
    space_b = await make_space(bob)
    return alice, bob, space_a, space_b


@pytest.mark.parametrize(("method", "path", "body"), SPACE_ROUTES)
@pytest.mark.parametrize("by", ["id", "slug"])
async def test_a_member_of_a_gets_404_for_every_route_of_b(
    app, client, two_spaces, audit_log, method, path, body, by
):
    alice, bob, _space_a, space_b = two_spaces
    ref = space_b.id if by == "id" else space_b.slug
    url = path.format(s=ref, p=bob.id)
    response = await client.open(url, method=method, json=body, headers=alice.headers)
    assert response.status_code == 404
    problem = await response.get_json()
    assert problem["type"] == "urn:buildmax:problem:not-found"
    assert response.content_type == "application/problem+json"
    # Nothing changed in B and nothing was audited.
    shown = await client.get(f"/v1/spaces/{space_b.id}", headers=bob.headers)
    assert (await shown.get_json())["name"] == space_b.slug
    members = await (
        await client.get(f"/v1/spaces/{space_b.id}/members", headers=bob.headers)
    ).get_json()
    assert [(m["principal_id"], m["role"]) for m in members["items"]] == [(bob.id, "owner")]
    assert audit_log.events == []


async def test_listing_spaces_shows_only_your_own(client, two_spaces):
    alice, _bob, space_a, _space_b = two_spaces
    listed = await (await client.get("/v1/spaces", headers=alice.headers)).get_json()
    assert [s["id"] for s in listed["items"]] == [space_a.id]


async def test_a_viewer_is_refused_writes_with_403_not_404(client, make_principal, make_space):
    owner = await make_principal("human")
    viewer = await make_principal("agent")
    space = await make_space(owner)
    added = await client.put(
        f"/v1/spaces/{space.id}/members/{viewer.id}", json={"role": "viewer"}, headers=owner.headers
    )
    assert added.status_code == 200
    refused = await client.patch(
        f"/v1/spaces/{space.id}", json={"name": "x"}, headers=viewer.headers
    )
    assert refused.status_code == 403
    assert (await refused.get_json())["type"] == "urn:buildmax:problem:forbidden"


async def test_a_scoped_token_is_refused_on_routes_that_do_not_accept_its_scope(
    app, client, make_principal, make_space
):
    agent = await make_principal("agent")
    space = await make_space(agent)
    async with app.db.write() as tx:
        scoped = await issue_token(
            tx, principal_pk=agent.pk, now=app.clock.now_ms(), scope_type="testscope", scope_id="x1"
        )
        other = await issue_token(
            tx, principal_pk=agent.pk, now=app.clock.now_ms(), scope_type="attempt", scope_id="a1"
        )
    headers = {"Authorization": f"Bearer {scoped.secret}"}
    others = [
        ("GET", "/v1/spaces", None),
        ("GET", "/v1/principals/me", None),
        ("POST", "/v1/tokens", {"name": "escalate"}),
    ]
    for method, path, body in [*SPACE_ROUTES, *others]:
        url = path.format(s=space.id, p=agent.id)
        response = await client.open(url, method=method, json=body, headers=headers)
        assert response.status_code == 403, (method, url)
        assert (await response.get_json())["type"] == "urn:buildmax:problem:token-scope-refused"
    accepted = await client.get("/v1/testplugin/scoped", headers=headers)
    assert accepted.status_code == 200
    assert await accepted.get_json() == {"principal_id": agent.id, "scope": "x1"}
    wrong_scope = await client.get(
        "/v1/testplugin/scoped", headers={"Authorization": f"Bearer {other.secret}"}
    )
    assert wrong_scope.status_code == 403
    tokens = await (await client.get("/v1/tokens", headers=agent.headers)).get_json()
    assert len(tokens["items"]) == 3  # the refused POST created nothing


async def test_revocation_takes_effect_on_the_next_request(client, make_principal):
    agent = await make_principal("agent")
    created = await client.post("/v1/tokens", json={"name": "ci"}, headers=agent.headers)
    token = await created.get_json()
    headers = {"Authorization": f"Bearer {token['token']}"}
    assert (await client.get("/v1/principals/me", headers=headers)).status_code == 200
    revoked = await client.delete(f"/v1/tokens/{token['id']}", headers=agent.headers)
    assert revoked.status_code == 204
    after = await client.get("/v1/principals/me", headers=headers)
    assert after.status_code == 401
    assert "revoked" in (await after.get_json())["detail"]


async def test_expired_tokens_and_disabled_principals_are_refused(
    app, client, clock, admin, make_principal
):
    agent = await make_principal("agent")
    created = await client.post(
        "/v1/tokens", json={"expires_in_seconds": 60}, headers=agent.headers
    )
    secret = (await created.get_json())["token"]
    headers = {"Authorization": f"Bearer {secret}"}
    assert (await client.get("/v1/principals/me", headers=headers)).status_code == 200
    clock.advance(seconds=61)
    assert (await client.get("/v1/principals/me", headers=headers)).status_code == 401
    disabled = await client.patch(
        f"/v1/principals/{agent.id}", json={"disabled": True}, headers=admin.headers
    )
    assert disabled.status_code == 200
    assert (await client.get("/v1/principals/me", headers=agent.headers)).status_code == 401


async def test_an_admin_acts_in_any_space_and_is_audited_as_an_override(
    client, admin, make_principal, make_space, audit_log
):
    owner = await make_principal("human")
    space = await make_space(owner)
    renamed = await client.patch(
        f"/v1/spaces/{space.id}", json={"name": "by admin"}, headers=admin.headers
    )
    assert renamed.status_code == 200
    [event] = audit_log.events
    assert (event.action, event.admin_override, event.actor_id) == ("space.updated", True, admin.id)


async def test_an_admin_or_operator_asking_for_a_space_that_does_not_exist_gets_404(
    client, admin, make_principal
):
    """Catches: the space read with the token (one statement) taken for a
    space when no space matched, which an admin's override would then let in."""
    operator = await make_principal("human", system_role="operator")
    for who in (admin, operator):
        for path in ("/v1/spaces/sp_doesnotexist", "/v1/spaces/no-such-slug/tasks"):
            answer = await client.get(path, headers=who.headers)
            assert answer.status_code == 404, (path, answer.status_code)
            assert (await answer.get_json())["type"].endswith(":not-found")


async def test_an_operator_reads_any_space_but_cannot_write(client, make_principal, make_space):
    owner = await make_principal("human")
    operator = await make_principal("human", system_role="operator")
    space = await make_space(owner)
    assert (await client.get(f"/v1/spaces/{space.id}", headers=operator.headers)).status_code == 200
    refused = await client.patch(
        f"/v1/spaces/{space.id}", json={"name": "x"}, headers=operator.headers
    )
    assert refused.status_code == 403


async def test_an_admin_changing_members_of_a_space_it_is_not_in_is_an_audited_override(
    client, admin, make_principal, make_space, audit_log
):
    owner, agent = await make_principal("human"), await make_principal("agent")
    space = await make_space(owner)
    added = await client.put(
        f"/v1/spaces/{space.id}/members/{agent.id}", json={"role": "member"}, headers=admin.headers
    )
    removed = await client.delete(
        f"/v1/spaces/{space.id}/members/{agent.id}", headers=admin.headers
    )
    assert (added.status_code, removed.status_code) == (200, 204)
    assert [(e.action, e.admin_override) for e in audit_log.events] == [
        ("space.member.added", True),
        ("space.member.removed", True),
    ]


async def test_a_principal_sees_only_itself_unless_admin_or_operator(client, make_principal):
    alice, bob = await make_principal("agent"), await make_principal("agent")
    operator = await make_principal("human", system_role="operator")
    assert (await client.get(f"/v1/principals/{bob.id}", headers=alice.headers)).status_code == 404
    assert (
        await client.get(f"/v1/principals/{bob.name}", headers=alice.headers)
    ).status_code == 404
    assert (
        await client.get(f"/v1/principals/{alice.id}", headers=alice.headers)
    ).status_code == 200
    seen = await client.get(f"/v1/principals/{bob.id}", headers=operator.headers)
    assert (await seen.get_json())["name"] == bob.name
