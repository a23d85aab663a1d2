"""Reading the trail: a space's owners and admins read its events and no
other space's; system admins read everything; filters, paging and links."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from buildmax.clock import to_rfc3339
from buildmax.spaces import put_member
from buildmax.tables import spaces

PROBLEM = "urn:buildmax:problem:"


async def get(client: Any, path: str, who: Any, status: int = 200, **params: Any) -> Any:
    response = await client.get(path, headers=who.headers, query_string=params)
    body = await response.get_json()
    assert response.status_code == status, body
    return body


@pytest.fixture
async def two_spaces(app, client, admin, make_principal):
    """Spaces A and B made over HTTP for their owners, who renamed them twice."""
    owner_a = await make_principal("human", name="owner-a")
    owner_b = await make_principal("human", name="owner-b")
    made = {}
    for owner, slug in ((owner_a, "space-a"), (owner_b, "space-b")):
        response = await client.post(
            "/v1/spaces", headers=admin.headers, json={"slug": slug, "owner_id": owner.id}
        )
        made[slug] = (await response.get_json())["id"]
        for name in ("one", "two"):
            renamed = await client.patch(
                f"/v1/spaces/{slug}", headers=owner.headers, json={"name": name}
            )
            assert renamed.status_code == 200
    return owner_a, owner_b, made


async def test_space_admins_read_their_space_only(app, client, make_principal, two_spaces):
    owner_a, _, ids = two_spaces
    body = await get(client, "/v1/spaces/space-a/audit", owner_a)
    assert [e["action"] for e in body["items"]] == [
        "space.updated",
        "space.updated",
        "space.created",
    ]
    assert {e["chain"] for e in body["items"]} == {ids["space-a"]}
    assert [e["seq"] for e in body["items"]] == [3, 2, 1]
    newest = body["items"][0]
    assert newest["actor"] == {"id": owner_a.id, "kind": "human"}
    assert newest["space"] == ids["space-a"]
    assert newest["target"] == {
        "type": "space",
        "id": ids["space-a"],
        "url": f"/v1/spaces/{ids['space-a']}",
    }
    assert newest["details"] == {"name": "two"}
    assert newest["time"].endswith("Z") and len(newest["hash"]) == 64

    # The owner of A is not a member of B: B does not exist for them.
    refused = await get(client, "/v1/spaces/space-b/audit", owner_a, 404)
    assert refused["type"] == PROBLEM + "not-found"

    # An admin member of A reads A; a plain member or viewer does not.
    space_admin = await make_principal("human")
    member = await make_principal("agent")
    async with app.db.write() as tx:
        space_pk = await tx.fetch_val(sa.select(spaces.c.id).where(spaces.c.slug == "space-a"))
        now = app.clock.now_ms()
        await put_member(tx, space_pk, space_admin.pk, "admin", now=now)
        await put_member(tx, space_pk, member.pk, "member", now=now)
    assert len((await get(client, "/v1/spaces/space-a/audit", space_admin))["items"]) == 3
    forbidden = await get(client, "/v1/spaces/space-a/audit", member, 403)
    assert forbidden["type"] == PROBLEM + "forbidden"
    await get(client, "/v1/spaces/space-b/audit", space_admin, 404)

    # Nobody but a system admin reads the whole trail or verifies it.
    for who in (owner_a, space_admin, member):
        await get(client, "/v1/audit", who, 403)
        await get(client, "/v1/audit/verify", who, 403)


async def test_system_admins_read_every_chain_with_filters(client, admin, two_spaces):
    _, owner_b, ids = two_spaces
    everything = await get(client, "/v1/audit", admin, limit=100)
    assert {e["chain"] for e in everything["items"]} >= {ids["space-a"], ids["space-b"]}

    only_b = await get(client, "/v1/audit", admin, space="space-b")
    assert {e["chain"] for e in only_b["items"]} == {ids["space-b"]}
    created = await get(client, "/v1/audit", admin, action="space.cr")
    assert sorted(e["target"]["id"] for e in created["items"]) == sorted(ids.values())
    by_actor = await get(client, "/v1/audit", admin, actor=owner_b.id)
    assert {e["actor"]["id"] for e in by_actor["items"]} == {owner_b.id}
    assert [e["details"]["name"] for e in by_actor["items"]] == ["two", "one"]
    by_target = await get(client, "/v1/audit", admin, target=ids["space-a"], target_type="space")
    assert len(by_target["items"]) == 3
    # The prefix is literal and case-sensitive on every engine.
    assert (await get(client, "/v1/audit", admin, action="space%"))["items"] == []
    assert (await get(client, "/v1/audit", admin, action="SPACE."))["items"] == []
    # No space can take the name of the system chain.
    taken = await client.post("/v1/spaces", headers=admin.headers, json={"slug": "system"})
    assert taken.status_code == 422

    await get(client, "/v1/audit", admin, 404, space="nowhere")
    bad = await get(client, "/v1/audit", admin, 422, since="last tuesday")
    assert bad["type"] == PROBLEM + "validation-error"
    await get(client, "/v1/audit", admin, 422, actor="x" * 201)


async def test_a_time_window_and_pages(app, client, clock, admin, two_spaces):
    owner_a, _, ids = two_spaces

    clock.advance(seconds=60)
    start = clock.now_ms()
    for index in range(5):
        response = await client.patch(
            "/v1/spaces/space-a", headers=owner_a.headers, json={"name": f"late-{index}"}
        )
        assert response.status_code == 200
        clock.advance(seconds=1)
    window = await get(
        client,
        "/v1/spaces/space-a/audit",
        owner_a,
        since=to_rfc3339(start),
        until=to_rfc3339(start + 3000),
    )
    assert [e["details"]["name"] for e in window["items"]] == ["late-2", "late-1", "late-0"]

    seen: list[int] = []
    cursor = None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = await get(client, "/v1/spaces/space-a/audit", owner_a, **params)
        seen += [e["seq"] for e in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
        assert cursor.isascii() and ids["space-a"] not in cursor
    assert seen == list(range(8, 0, -1))
    bad = await get(client, "/v1/spaces/space-a/audit", owner_a, 400, cursor="bm90LW91cnM")
    assert bad["type"] == PROBLEM + "bad-cursor"
