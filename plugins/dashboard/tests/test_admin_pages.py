"""Principals and tokens in the browser: each form is the API's route as
the signed-in person (its checks, its audit event with the person as
actor), a new token's secret is shown once, in the answer to the post,
and never again, and nobody is offered, or allowed by a forged post, what
the API would refuse them."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from buildmax.testing import PrincipalHandle, call

from .conftest import Browser, set_password, signed_in

_SECRET = re.compile(r'id="new-secret" readonly value="([^"]+)"')


@pytest.fixture
async def sysadmin(app: Any, make_principal: Callable[..., Awaitable[PrincipalHandle]]) -> Any:
    """A system admin with a password."""
    who = await make_principal("human", system_role="admin")
    await set_password(app, who)
    return who


def secret_in(html: str) -> str:
    """The new secret a page shows (it must show one)."""
    found = _SECRET.search(html)
    assert found, "the page shows no new secret"
    return found.group(1)


async def audited(
    client: Any, admin: PrincipalHandle, action: str, target: str | None = None
) -> list[Any]:
    """The audit events of ``action`` (about ``target``), read as a system
    admin through the audit API."""
    query = f"action={action}" + (f"&target={target}" if target else "")
    page = await call(client, "GET", f"/v1/audit?{query}", admin, expect=200)
    return [e for e in page["items"] if e["action"] == action]


async def assert_actor(
    client: Any, admin: PrincipalHandle, action: str, target: str, actor: PrincipalHandle
) -> None:
    """One ``action`` event about ``target``, by ``actor`` from a page."""
    [event] = await audited(client, admin, action, target)
    assert event["actor"] == {"id": actor.id, "kind": actor.kind}
    assert (event["request_id"] or "").startswith("ui/")


async def me(client: Any, secret: str, expect: int = 200) -> Any:
    """``GET /v1/principals/me`` with a bearer ``secret``."""
    return await call(client, "GET", "/v1/principals/me", secret, expect=expect)


async def tokens_of(client: Any, admin: PrincipalHandle, who: PrincipalHandle) -> list[Any]:
    """Every token of ``who``, as the API lists them to a system admin."""
    page = await call(client, "GET", f"/v1/tokens?principal={who.id}", admin, expect=200)
    items: list[Any] = page["items"]
    return items


async def post_page(b: Browser, path: str, form: dict[str, str], status: int) -> str:
    """Post a form (with the page's token) that answers a page of ``status``."""
    answer = await b.post(path, {"csrf": b.csrf, **form})
    body = str(await answer.get_data(as_text=True))
    assert answer.status_code == status, (path, answer.status_code, body[:2000])
    return body


# ----------------------------------------------------------------------------- principals


async def test_an_admin_creates_an_agent_and_a_token_shown_once_that_works(
    app, client, browser, sysadmin
):
    b = await signed_in(browser, sysadmin)
    listing = await b.text("/ui/principals")
    assert "Create a principal" in listing and sysadmin.name in listing
    created = await b.post(
        "/ui/principals",
        {"csrf": b.csrf, "kind": "agent", "name": "build-bot", "display_name": "Build bot"},
    )
    assert created.status_code == 303
    bot = await call(client, "GET", "/v1/principals/build-bot", sysadmin, expect=200)
    assert (bot["kind"], bot["display_name"], bot["system_role"]) == ("agent", "Build bot", None)
    assert created.headers["Location"] == f"/ui/principals/{bot['id']}?done=created"
    await assert_actor(client, sysadmin, "principal.created", bot["id"], sysadmin)
    assert "Principal created." in await b.text(created.headers["Location"])

    answer = await b.post(
        f"/ui/principals/{bot['id']}/tokens",
        {"csrf": b.csrf, "name": "ci runner", "expires_in_seconds": "86400"},
    )
    html = await answer.get_data(as_text=True)
    assert answer.status_code == 201
    assert answer.headers["Cache-Control"] == "no-store"
    assert "it will not be shown again" in html
    secret = secret_in(html)
    assert (await me(client, secret))["name"] == "build-bot"
    [token] = (await call(client, "GET", f"/v1/tokens?principal={bot['id']}", sysadmin))["items"]
    assert (token["name"], token["principal_id"]) == ("ci runner", bot["id"])
    await assert_actor(client, sysadmin, "token.created", token["id"], sysadmin)

    again = await b.text(f"/ui/principals/{bot['id']}")
    assert secret not in again and "new-secret" not in again and "ci runner" in again

    revoked = await b.post(
        f"/ui/principals/{bot['id']}/tokens/{token['id']}/revoke", {"csrf": b.csrf}
    )
    assert revoked.status_code == 303
    assert revoked.headers["Location"] == f"/ui/principals/{bot['id']}?done=revoked"
    await me(client, secret, expect=401)
    await assert_actor(client, sysadmin, "token.revoked", token["id"], sysadmin)
    assert secret not in await b.text(revoked.headers["Location"])


async def test_a_human_made_in_the_browser_signs_in_with_the_password_given(
    app, client, browser, sysadmin
):
    b = await signed_in(browser, sysadmin)
    password = "a long enough password for alice"
    form = {"kind": "human", "name": "alice", "system_role": "operator", "password": password}
    assert (await b.post("/ui/principals", {"csrf": b.csrf, **form})).status_code == 303
    alice = await call(client, "GET", "/v1/principals/alice", sysadmin, expect=200)
    assert (alice["kind"], alice["system_role"]) == ("human", "operator")
    assert (await browser().sign_in("alice", password)).status_code == 303

    # The same name again: the API's 409 on the form, filled but for the password.
    html = await post_page(b, "/ui/principals", form, 409)
    assert 'role="alert"' in html and 'value="alice"' in html and password not in html


async def test_a_principal_the_api_refuses_shows_why_and_nothing_is_made(
    app, client, browser, sysadmin
):
    b = await signed_in(browser, sysadmin)
    html = await post_page(b, "/ui/principals", {"kind": "agent", "name": "Not A Name"}, 422)
    assert "<code>name</code>" in html and 'value="Not A Name"' in html
    html = await post_page(
        b, "/ui/principals", {"kind": "agent", "name": "bot", "password": "x" * 20}, 422
    )
    assert "only human principals sign in with a password" in html
    listed = await call(client, "GET", "/v1/principals", sysadmin, expect=200)
    assert [p["name"] for p in listed["items"]] == [sysadmin.name]


async def test_an_admin_disables_from_the_list_and_enables_from_the_page(
    app, client, browser, sysadmin, make_principal
):
    bot = await make_principal("agent")
    b = await signed_in(browser, sysadmin)
    listing = await b.text("/ui/principals")
    assert f'action="/ui/principals/{bot.id}/disabled"' in listing
    # No control to disable oneself.
    assert f'action="/ui/principals/{sysadmin.id}/disabled"' not in listing
    answer = await b.post(
        f"/ui/principals/{bot.id}/disabled", {"csrf": b.csrf, "disabled": "true", "back": "list"}
    )
    assert (answer.status_code, answer.headers["Location"]) == (
        303,
        "/ui/principals?done=disabled",
    )
    await me(client, bot.token, expect=401)
    await assert_actor(client, sysadmin, "principal.disabled", bot.id, sysadmin)
    page = await b.text(f"/ui/principals/{bot.id}")
    assert "disabled</span> since" in page and f"Enable {bot.name}" in page
    answer = await b.post(
        f"/ui/principals/{bot.id}/disabled", {"csrf": b.csrf, "disabled": "false"}
    )
    assert answer.headers["Location"] == f"/ui/principals/{bot.id}?done=enabled"
    assert (await me(client, bot.token))["id"] == bot.id
    await assert_actor(client, sysadmin, "principal.enabled", bot.id, sysadmin)


async def test_disabling_the_last_admin_is_the_apis_409_on_the_page(app, client, browser, sysadmin):
    b = await signed_in(browser, sysadmin)
    html = await post_page(
        b, f"/ui/principals/{sysadmin.id}/disabled", {"disabled": "true", "back": "list"}, 409
    )
    assert 'role="alert"' in html and "no enabled system admin" in html
    shown = await call(client, "GET", f"/v1/principals/{sysadmin.id}", sysadmin, expect=200)
    assert shown["disabled_at"] is None


async def test_an_admin_rotates_an_agents_token_and_the_old_one_stops(
    app, client, browser, sysadmin, make_principal
):
    bot = await make_principal("agent")
    [token] = await tokens_of(client, sysadmin, bot)
    b = await signed_in(browser, sysadmin)
    html = await post_page(b, f"/ui/principals/{bot.id}/tokens/{token['id']}/rotate", {}, 201)
    secret = secret_in(html)
    await me(client, bot.token, expect=401)
    assert (await me(client, secret))["id"] == bot.id
    assert secret not in await b.text(f"/ui/principals/{bot.id}")
    [event] = await audited(client, sysadmin, "token.rotated")
    assert event["actor"]["id"] == sysadmin.id and event["details"]["replaces"] == token["id"]


# ----------------------------------------------------------------------------- my tokens


async def test_my_tokens_mark_this_session_and_a_new_secret_is_shown_once(
    app, client, browser, person, sysadmin
):
    alice = await person()
    b = await signed_in(browser, alice)
    html = await b.text("/ui/tokens")
    assert "this session" in html and "sign-in session" in html
    [session] = [t for t in await tokens_of(client, sysadmin, alice) if t["origin"] == "session"]
    # This session is ended by signing out, not from the list.
    assert f"/ui/tokens/{session['id']}/" not in html

    answer = await b.post(
        "/ui/tokens", {"csrf": b.csrf, "name": "laptop", "expires_in_seconds": "3600"}
    )
    html = await answer.get_data(as_text=True)
    assert answer.status_code == 201
    assert answer.headers["Cache-Control"] == "no-store"
    assert "Location" not in answer.headers
    assert "Copy it now: it will not be shown again." in html
    secret = secret_in(html)
    assert (await me(client, secret))["id"] == alice.id
    laptop = next(t for t in await tokens_of(client, sysadmin, alice) if t["name"] == "laptop")
    await assert_actor(client, sysadmin, "token.created", laptop["id"], alice)

    listing = await b.text("/ui/tokens")
    assert secret not in listing and "new-secret" not in listing and "laptop" in listing
    revoked = await b.post(f"/ui/tokens/{laptop['id']}/revoke", {"csrf": b.csrf})
    assert (revoked.status_code, revoked.headers["Location"]) == (303, "/ui/tokens?done=revoked")
    await me(client, secret, expect=401)
    await assert_actor(client, sysadmin, "token.revoked", laptop["id"], alice)
    after = await b.text(revoked.headers["Location"])
    assert "Token revoked" in after and "state-revoked" in after and secret not in after


async def test_rotating_my_token_shows_the_new_secret_once(app, client, browser, person, sysadmin):
    alice = await person()
    b = await signed_in(browser, alice)
    first = secret_in(await post_page(b, "/ui/tokens", {"name": "ci"}, 201))
    ci = next(t for t in await tokens_of(client, sysadmin, alice) if t["name"] == "ci")
    second = secret_in(await post_page(b, f"/ui/tokens/{ci['id']}/rotate", {}, 201))
    assert second != first
    await me(client, first, expect=401)
    assert (await me(client, second))["id"] == alice.id
    listing = await b.text("/ui/tokens")
    assert first not in listing and second not in listing


async def test_an_expired_token_is_marked_and_offers_no_action(app, client, clock, browser, person):
    alice = await person()
    old = await call(
        client,
        "POST",
        "/v1/tokens",
        alice,
        json={"name": "short", "expires_in_seconds": 60},
        expect=201,
    )
    clock.advance(seconds=120)
    b = await signed_in(browser, alice)
    html = await b.text("/ui/tokens")
    assert "state-expired" in html
    assert f"/ui/tokens/{old['id']}/revoke" not in html


async def test_another_sign_in_session_may_be_ended_from_the_list(app, client, browser, person):
    alice = await person()
    elsewhere = await signed_in(browser, alice)
    b = await signed_in(browser, alice)
    mine = await call(client, "GET", "/v1/tokens", alice, expect=200)
    sessions = [t for t in mine["items"] if t["origin"] == "session"]
    assert len(sessions) == 2
    html = await b.text("/ui/tokens")
    [other] = [t for t in sessions if f"/ui/tokens/{t['id']}/revoke" in html]
    assert f"/ui/tokens/{other['id']}/rotate" not in html  # a session is not rotated
    assert (await b.post(f"/ui/tokens/{other['id']}/revoke", {"csrf": b.csrf})).status_code == 303
    assert (await elsewhere.get("/ui/tokens")).status_code == 303  # signed out there
    assert (await b.get("/ui/tokens")).status_code == 200


# ----------------------------------------------------------------------------- refusals


async def _state(client: Any, admin: PrincipalHandle, *people: PrincipalHandle) -> Any:
    """Every principal and the tokens of ``people`` as the API shows them
    (when a token was last used aside)."""
    listed = await call(client, "GET", "/v1/principals?limit=200", admin, expect=200)
    tokens = {
        who.id: [
            {k: v for k, v in t.items() if k != "last_used_at"}
            for t in await tokens_of(client, admin, who)
        ]
        for who in people
    }
    return listed["items"], tokens


def _forms(
    bot: PrincipalHandle, bot_token: str, own_token: str
) -> list[tuple[str, dict[str, str]]]:
    """Every principal and token form, filled in."""
    at = f"/ui/principals/{bot.id}"
    return [
        ("/ui/principals", {"kind": "agent", "name": "forged"}),
        (f"{at}/disabled", {"disabled": "true"}),
        (f"{at}/tokens", {"name": "forged"}),
        (f"{at}/tokens/{bot_token}/revoke", {}),
        (f"{at}/tokens/{bot_token}/rotate", {}),
        ("/ui/tokens", {"name": "forged"}),
        (f"/ui/tokens/{own_token}/revoke", {}),
        (f"/ui/tokens/{own_token}/rotate", {}),
    ]


async def test_every_form_without_its_token_or_from_another_site_changes_nothing(
    app, client, browser, sysadmin, make_principal
):
    bot = await make_principal("agent")
    [bot_token] = await tokens_of(client, sysadmin, bot)
    [own_token] = await tokens_of(client, sysadmin, sysadmin)
    b = await signed_in(browser, sysadmin)
    before = await _state(client, sysadmin, bot, sysadmin)
    for path, form in _forms(bot, bot_token["id"], own_token["id"]):
        for sent, headers in (
            (form, {}),
            ({"csrf": "0" * 64, **form}, {}),
            ({"csrf": b.csrf, **form}, {"Origin": "https://evil.example"}),
        ):
            answer = await b.post(path, sent, headers=headers)
            assert answer.status_code == 403, (path, sent.keys(), headers)
    assert await _state(client, sysadmin, bot, sysadmin) == before
    await me(client, bot.token)


async def test_a_person_without_a_system_role_is_offered_nothing_and_refused_everything(
    app, client, browser, sysadmin, person, make_principal
):
    bot = await make_principal("agent")
    [bot_token] = await tokens_of(client, sysadmin, bot)
    mallory = await person()
    [own_token] = await tokens_of(client, sysadmin, mallory)
    b = await signed_in(browser, mallory)
    assert 'href="/ui/principals"' not in await b.text("/ui/tokens")
    refused = await b.get("/ui/principals")
    html = await refused.get_data(as_text=True)
    assert refused.status_code == 403
    assert "Create a principal" not in html and "/disabled" not in html
    assert (await b.get(f"/ui/principals/{bot.id}")).status_code == 404
    own = await b.text(f"/ui/principals/{mallory.id}")
    assert "/disabled" not in own  # nobody disables themselves here

    before = await _state(client, sysadmin, bot, mallory)
    # Creating, revoking and rotating one's own tokens is anyone's: the first five.
    forms = _forms(bot, bot_token["id"], own_token["id"])[:5]
    for (path, form), status in zip(forms, [403, 404, 404, 404, 404], strict=True):
        answer = await b.post(path, {"csrf": b.csrf, **form})
        assert answer.status_code == status, path
    for action in ("revoke", "rotate"):  # another's token, from one's own list
        html = await post_page(b, f"/ui/tokens/{bot_token['id']}/{action}", {}, 404)
        assert 'role="alert"' in html and "My tokens" in html
    assert await _state(client, sysadmin, bot, mallory) == before
    await me(client, bot.token)


async def test_an_operator_reads_principals_but_is_offered_and_allowed_no_change(
    app, client, browser, sysadmin, make_principal
):
    operator = await make_principal("human", system_role="operator")
    await set_password(app, operator)
    bot = await make_principal("agent")
    b = await signed_in(browser, operator)
    listing = await b.text("/ui/principals")
    assert bot.name in listing
    assert "Create a principal" not in listing and "/disabled" not in listing
    page = await b.text(f"/ui/principals/{bot.id}")
    assert "Only a system admin sees another principal's tokens." in page
    assert "Create a token" not in page and "/disabled" not in page

    before = await _state(client, sysadmin, bot)
    for path, form, status in (
        ("/ui/principals", {"kind": "agent", "name": "forged"}, 403),
        (f"/ui/principals/{bot.id}/disabled", {"disabled": "true"}, 404),
        (f"/ui/principals/{bot.id}/tokens", {"name": "forged"}, 403),
    ):
        answer = await b.post(path, {"csrf": b.csrf, **form})
        assert answer.status_code == status, path
    assert await _state(client, sysadmin, bot) == before


_KEY = re.compile(r'name="request_key" value="([^"]+)"')


async def test_a_token_form_posted_twice_leaves_one_live_token(
    app, client, browser, person, sysadmin
):
    alice = await person()
    b = await signed_in(browser, alice)
    key = _KEY.search(await b.text("/ui/tokens"))
    assert key, "the token form carries no key of its own"
    form = {"csrf": b.csrf, "name": "laptop", "expires_in_seconds": "3600", "request_key": key[1]}
    first = secret_in(await post_page(b, "/ui/tokens", form, 201))
    again = secret_in(await post_page(b, "/ui/tokens", form, 201))  # a reload of the answer
    assert again != first
    laptops = [t for t in await tokens_of(client, sysadmin, alice) if t["name"] == "laptop"]
    assert len([t for t in laptops if t["revoked_at"] is None]) == 1
    await me(client, first, expect=401)
    assert (await me(client, again))["id"] == alice.id


async def test_rotating_this_very_session_is_refused_and_changes_nothing(
    app, client, browser, person, sysadmin
):
    alice = await person()
    b = await signed_in(browser, alice)
    [session] = [t for t in await tokens_of(client, sysadmin, alice) if t["origin"] == "session"]
    html = await post_page(b, f"/ui/tokens/{session['id']}/rotate", {}, 409)
    assert "sign out to end it" in html
    assert await audited(client, sysadmin, "token.rotated") == []
    assert "this session" in await b.text("/ui/tokens")


async def test_a_principal_page_acts_on_that_principals_tokens_only(
    app, client, browser, sysadmin, make_principal
):
    alice = await make_principal("agent")
    bot = await make_principal("agent")
    token = await call(
        client, "POST", "/v1/tokens", sysadmin, json={"principal_id": bot.id}, expect=201
    )
    b = await signed_in(browser, sysadmin)
    for action in ("revoke", "rotate"):
        answer = await b.post(
            f"/ui/principals/{alice.id}/tokens/{token['id']}/{action}", {"csrf": b.csrf}
        )
        assert answer.status_code == 404, action
    assert (await me(client, token["token"]))["id"] == bot.id


async def test_the_error_page_signs_out(app, client, browser, person):
    alice = await person()
    b = await signed_in(browser, alice)
    page = await b.text("/ui/diagnostics", status=403)
    assert f'name="csrf" value="{b.csrf}"' in page
    out = await b.post("/ui/sign-out", {"csrf": b.csrf})
    assert out.status_code == 303
