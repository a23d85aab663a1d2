"""A space's members and holds in the browser: each form is the API's
route as the signed-in person (its role checks, its audit event with the
person as actor); a viewer sees the lists without a control and is
refused server-side however the post is forged; every administration
page keeps the dashboard's page rules."""

from __future__ import annotations

import re
from typing import Any

from buildmax.spaces import put_member
from buildmax.testing import PrincipalHandle, call

from .conftest import Team, set_password, signed_in
from .test_admin_pages import post_page

HOSTILE = "<script>alert(1)</script>"


async def members(client: Any, team: Team) -> dict[str, str]:
    """The space's members' roles by principal id, as the API lists them."""
    page = await call(client, "GET", f"{team.base}/members", team.owner, expect=200)
    return {m["principal_id"]: m["role"] for m in page["items"]}


async def holds(client: Any, team: Team) -> list[Any]:
    """Every hold of the space, live or lifted, newest first."""
    page = await call(client, "GET", f"{team.base}/holds?all=true", team.owner, expect=200)
    items: list[Any] = page["items"]
    return items


async def space_audit(client: Any, team: Team, action: str, target: str) -> list[Any]:
    """The space's audit events of ``action`` about ``target`` (read by its owner)."""
    page = await call(
        client, "GET", f"{team.base}/audit?action={action}&target={target}", team.owner, expect=200
    )
    return [e for e in page["items"] if e["action"] == action]


async def assert_actor(
    client: Any, team: Team, action: str, target: str, actor: PrincipalHandle
) -> None:
    """One ``action`` event about ``target``, by ``actor`` from a page."""
    [event] = await space_audit(client, team, action, target)
    assert event["actor"] == {"id": actor.id, "kind": actor.kind}
    assert (event["request_id"] or "").startswith("ui/")


async def with_role(app: Any, team: Team, who: PrincipalHandle, role: str) -> PrincipalHandle:
    """``who`` made a member of the team's space with ``role``."""
    async with app.db.write() as tx:
        await put_member(tx, team.space.pk, who.pk, role, app.clock.now_ms())
    return who


def _at(team: Team, *rest: str) -> str:
    return "/".join([f"/ui/spaces/{team.space.id}", *rest])


# ----------------------------------------------------------------------------- members


async def test_an_owner_adds_a_member_changes_the_role_and_removes_it(
    app, client, team, browser, person
):
    carol = await person()
    b = await signed_in(browser, team.owner)
    page = await b.text(_at(team, "members"))
    assert 'aria-current="page">Members' in page and team.agent.name in page
    assert '<option value="owner"' in page

    added = await b.post(
        _at(team, "members"), {"csrf": b.csrf, "principal": carol.id, "role": "viewer"}
    )
    assert (added.status_code, added.headers["Location"]) == (
        303,
        _at(team, "members?done=saved"),
    )
    assert (await members(client, team))[carol.id] == "viewer"
    await assert_actor(client, team, "space.member.added", carol.id, team.owner)
    assert carol.name in await b.text(added.headers["Location"])

    changed = await b.post(
        _at(team, "members"), {"csrf": b.csrf, "principal": carol.id, "role": "admin"}
    )
    assert changed.status_code == 303
    assert (await members(client, team))[carol.id] == "admin"
    await assert_actor(client, team, "space.member.role_changed", carol.id, team.owner)

    removed = await b.post(_at(team, "members", "remove"), {"csrf": b.csrf, "principal": carol.id})
    assert removed.headers["Location"] == _at(team, "members?done=removed")
    assert carol.id not in await members(client, team)
    await assert_actor(client, team, "space.member.removed", carol.id, team.owner)
    assert "Member removed." in await b.text(removed.headers["Location"])


async def test_a_member_named_out_of_sight_or_not_at_all_is_refused_on_the_page(
    app, client, team, browser, person
):
    stranger = await person()
    b = await signed_in(browser, team.owner)
    before = await members(client, team)
    html = await post_page(
        b, _at(team, "members"), {"principal": stranger.name, "role": "member"}, 404
    )
    # The same 404 as a name nobody has; the form keeps what was typed.
    assert 'role="alert"' in html and f'value="{stranger.name}"' in html
    html = await post_page(b, _at(team, "members"), {"principal": " ", "role": "member"}, 422)
    assert "<code>principal</code>" in html
    html = await post_page(b, _at(team, "members"), {"principal": "../x", "role": "member"}, 404)
    assert await members(client, team) == before


async def test_the_last_owner_cannot_be_removed_and_the_page_says_why(app, client, team, browser):
    b = await signed_in(browser, team.owner)
    html = await post_page(b, _at(team, "members", "remove"), {"principal": team.owner.id}, 409)
    assert 'role="alert"' in html
    assert (await members(client, team))[team.owner.id] == "owner"


async def test_a_space_admin_is_not_offered_the_owner_role_and_is_refused_it(
    app, client, team, browser, person
):
    admin = await with_role(app, team, await person(), "admin")
    b = await signed_in(browser, admin)
    page = await b.text(_at(team, "members"))
    assert "Add a member" in page and '<option value="owner"' not in page
    assert "an owner changes an owner" in page  # the owner's row has no control
    before = await members(client, team)
    html = await post_page(
        b, _at(team, "members"), {"principal": team.agent.id, "role": "owner"}, 403
    )
    assert 'role="alert"' in html and "only an owner" in html
    await post_page(b, _at(team, "members", "remove"), {"principal": team.owner.id}, 403)
    assert await members(client, team) == before


async def test_a_viewer_sees_the_members_without_a_control_and_is_refused_every_change(
    app, client, team, browser
):
    b = await signed_in(browser, team.viewer)
    page = await b.text(_at(team, "members"))
    assert team.owner.name in page and team.agent.name in page
    assert "Add a member" not in page and "Remove <span" not in page
    assert 'name="role"' not in page
    # The one form: leaving, which names the viewer only.
    assert page.count('method="post" action="/ui/spaces') == 1
    assert f'name="principal" value="{team.viewer.id}"' in page
    before = await members(client, team)
    await post_page(b, _at(team, "members"), {"principal": team.agent.id, "role": "admin"}, 403)
    await post_page(b, _at(team, "members"), {"principal": team.viewer.id, "role": "owner"}, 403)
    await post_page(b, _at(team, "members", "remove"), {"principal": team.agent.id}, 403)
    assert await members(client, team) == before


# ----------------------------------------------------------------------------- holds


async def test_an_owner_places_a_space_and_a_project_hold_and_lifts_one(app, client, team, browser):
    b = await signed_in(browser, team.owner)
    page = await b.text(_at(team, "holds"))
    assert 'aria-current="page">Holds' in page and "Nothing is held." in page
    placed = await b.post(
        _at(team, "holds"),
        {"csrf": b.csrf, "target": "", "strength": "stopped", "reason": "release freeze"},
    )
    assert (placed.status_code, placed.headers["Location"]) == (303, _at(team, "holds?done=placed"))
    await b.post(
        _at(team, "holds"),
        {"csrf": b.csrf, "target": team.project, "strength": "suspended", "reason": "rework"},
    )
    project_hold, space_hold = await holds(client, team)
    assert (space_hold["scope"]["type"], space_hold["strength"]) == ("space", "stopped")
    assert (project_hold["scope"], project_hold["reason"]) == (
        {"type": "project", "id": team.project},
        "rework",
    )
    await assert_actor(client, team, "hold.created", space_hold["id"], team.owner)
    page = await b.text(placed.headers["Location"])
    assert "the whole space" in page and "release freeze" in page
    assert f'href="/ui/spaces/{team.space.id}/projects/{team.project}/">main</a>' in page

    lifted = await b.post(_at(team, "holds", space_hold["id"], "lift"), {"csrf": b.csrf})
    assert lifted.headers["Location"] == _at(team, "holds?done=lifted")
    live = await call(client, "GET", f"{team.base}/holds", team.owner, expect=200)
    assert [h["id"] for h in live["items"]] == [project_hold["id"]]
    await assert_actor(client, team, "hold.lifted", space_hold["id"], team.owner)
    page = await b.text(lifted.headers["Location"])
    assert "Hold lifted." in page and "Lifted lately" in page
    # Lifting it again: the API's 409, on the page.
    html = await post_page(b, _at(team, "holds", space_hold["id"], "lift"), {}, 409)
    assert 'role="alert"' in html


async def test_a_hold_the_api_refuses_shows_why_and_nothing_is_placed(app, client, team, browser):
    b = await signed_in(browser, team.owner)
    html = await post_page(
        b, _at(team, "holds"), {"target": "", "strength": "stopped", "reason": ""}, 422
    )
    assert "<code>reason</code>" in html
    await post_page(b, _at(team, "holds"), {"target": "", "strength": "frozen", "reason": "x"}, 422)
    await post_page(
        b, _at(team, "holds"), {"target": "pj_nope", "strength": "stopped", "reason": "x"}, 404
    )
    assert await holds(client, team) == []


async def test_a_viewer_sees_the_holds_without_a_control_and_is_refused_every_change(
    app, client, team, browser
):
    hold = await call(
        client,
        "POST",
        f"{team.base}/holds",
        team.owner,
        json={"scope": "space", "strength": "suspended", "reason": "quiet week"},
        expect=201,
    )
    b = await signed_in(browser, team.viewer)
    page = await b.text(_at(team, "holds"))
    assert "quiet week" in page and team.owner.name in page
    assert "Place a hold" not in page and "/lift" not in page
    await post_page(
        b, _at(team, "holds"), {"target": "", "strength": "stopped", "reason": "x"}, 403
    )
    await post_page(b, _at(team, "holds", hold["id"], "lift"), {}, 403)
    [after] = await holds(client, team)
    assert after == hold


# ----------------------------------------------------------------------------- all forms and pages


async def test_every_space_form_without_its_token_changes_nothing(app, client, team, browser):
    hold = await call(
        client,
        "POST",
        f"{team.base}/holds",
        team.owner,
        json={"scope": "space", "strength": "suspended", "reason": "r"},
        expect=201,
    )
    b = await signed_in(browser, team.owner)
    forms = [
        (_at(team, "members"), {"principal": team.agent.id, "role": "admin"}),
        (_at(team, "members", "remove"), {"principal": team.agent.id}),
        (_at(team, "holds"), {"target": "", "strength": "stopped", "reason": "x"}),
        (_at(team, "holds", hold["id"], "lift"), {}),
    ]
    before = (await members(client, team), await holds(client, team))
    for path, form in forms:
        for sent in (form, {"csrf": "0" * 64, **form}):
            assert (await b.post(path, sent)).status_code == 403, path
    assert (await members(client, team), await holds(client, team)) == before


async def test_a_stranger_gets_404_on_the_space_pages_and_their_forms(
    app, client, team, browser, person
):
    b = await signed_in(browser, await person())
    for path in (_at(team, "members"), _at(team, "holds")):
        assert (await b.get(path)).status_code == 404, path
        body = {"csrf": b.csrf, "principal": team.agent.id, "role": "admin", "reason": "x"}
        assert (await b.post(path, {**body, "strength": "stopped"})).status_code == 404
    assert (await members(client, team))[team.agent.id] == "member"
    assert await holds(client, team) == []


async def test_every_administration_page_escapes_and_keeps_the_page_rules(
    app, client, team, browser, make_principal
):
    admin = await make_principal("human", system_role="admin")
    await set_password(app, admin)
    bot = await call(
        client,
        "POST",
        "/v1/principals",
        admin,
        json={"kind": "agent", "name": "bot", "display_name": HOSTILE},
        expect=201,
    )
    await call(
        client,
        "POST",
        "/v1/tokens",
        admin,
        json={"principal_id": bot["id"], "name": HOSTILE},
        expect=201,
    )
    await call(
        client,
        "POST",
        f"{team.base}/holds",
        team.owner,
        json={"scope": "project", "target": team.project, "strength": "stopped", "reason": HOSTILE},
        expect=201,
    )
    b = await signed_in(browser, admin)
    issued = await b.post("/ui/tokens", {"csrf": b.csrf, "name": HOSTILE})
    pages = {"/ui/tokens (new token)": await issued.get_data(as_text=True)}
    for path in (
        "/ui/principals",
        f"/ui/principals/{bot['id']}",
        "/ui/tokens",
        _at(team, "members"),
        _at(team, "holds"),
    ):
        answer = await b.get(path)
        assert answer.status_code == 200, path
        policy = answer.headers["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy
        pages[path] = await answer.get_data(as_text=True)
    for path, html in pages.items():
        assert "<script>alert" not in html, path
        assert re.findall(r"<script(?![^>]*\bsrc=)", html) == [], path
        assert not re.search(r"\son[a-z]+\s*=", html), path
        assert not re.search(r"\sstyle\s*=", html), path
        title = re.search(r"<title>(.*?)</title>", html, re.S)
        assert title and "<" not in title.group(1), path
        assert html.count("<main") == 1 and html.count("<h1") == 1, path
        # Every field has a label: wrapped in one, named by one, or hidden.
        for field in re.findall(r"<(?:input|select|textarea)\b[^>]*>", html):
            if 'type="hidden"' in field:
                continue
            found = re.search(r'\bid="([^"]+)"', field)
            labelled = found and f'for="{found.group(1)}"' in html
            assert labelled or _wrapped(html, field), (path, field)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[_at(team, "holds")]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[f"/ui/principals/{bot['id']}"]


def _wrapped(html: str, field: str) -> bool:
    """Whether ``field`` sits inside a ``<label>`` of the page."""
    at = html.index(field)
    return html.rfind("<label", 0, at) > html.rfind("</label>", 0, at)


async def test_a_viewer_leaves_the_space_from_the_members_page(app, client, team, browser):
    b = await signed_in(browser, team.viewer)
    page = await b.text(f"/ui/spaces/{team.space.id}/members")
    assert "Your membership" in page and "Leave " in page
    left = await b.post(
        f"/ui/spaces/{team.space.id}/members/remove",
        {"csrf": b.csrf, "principal": team.viewer.id},
    )
    assert (left.status_code, left.headers["Location"]) == (303, "/ui/?done=left")
    assert "You left the space." in await b.text(left.headers["Location"])
    members = await call(client, "GET", f"{team.base}/members", team.owner, expect=200)
    assert team.viewer.id not in {m["principal_id"] for m in members["items"]}
    await b.text(f"/ui/spaces/{team.space.id}/members", status=404)
