"""Signing in and out of the dashboard: the session cookie's flags, its
place (``/ui/`` only), the CSRF token every form carries, and what a
refused form leaves unchanged."""

from __future__ import annotations

import re
from typing import Any

import sqlalchemy as sa

from buildmax.tables import tokens
from buildmax.testing import call

from .conftest import PASSWORD, csrf_of


async def _session_tokens(app: Any, principal_pk: int) -> list[dict[str, Any]]:
    async with app.db.read() as conn:
        rows = await conn.fetch_all(
            sa.select(tokens.c.public_id, tokens.c.revoked_at, tokens.c.expires_at).where(
                tokens.c.principal_id == principal_pk, tokens.c.origin == "session"
            )
        )
    return [dict(r) for r in rows]


async def test_root_sends_a_browser_to_the_dashboard_and_an_api_client_a_json_404(client):
    page = await client.get("/", headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
    assert page.status_code == 302
    assert page.headers["Location"] == "/ui/"
    api = await client.get("/", headers={"Accept": "application/json"})
    assert api.status_code == 404
    assert api.headers["Content-Type"].startswith("application/problem+json")
    bare = await client.get("/")
    assert bare.status_code == 404


async def test_a_page_without_a_session_sends_to_sign_in_and_back(app, browser, person):
    who = await person()
    b = browser()
    answer = await b.get("/ui/")
    assert answer.status_code == 303
    assert answer.headers["Location"] == "/ui/sign-in?next=%2Fui%2F"
    signed = await b.sign_in(who.name, next="/ui/")
    assert signed.status_code == 303
    assert signed.headers["Location"] == "/ui/"
    assert "Spaces" in await b.text("/ui/")


async def test_sign_in_sets_a_strict_http_only_cookie_for_ui_only(app, audit_log, browser, person):
    who = await person()
    b = browser()
    answer = await b.sign_in(who.name)
    assert answer.status_code == 303
    set_cookie = [v for v in answer.headers.getlist("Set-Cookie") if "buildmax_session=" in v]
    assert len(set_cookie) == 1
    flags = [part.strip().lower() for part in set_cookie[0].split(";")]
    assert "httponly" in flags
    assert "samesite=strict" in flags
    assert "path=/ui/" in flags
    assert f"max-age={app.settings.session_ttl_seconds}" in flags
    assert "secure" not in flags  # plain HTTP here; see the TLS test
    stored = await _session_tokens(app, who.pk)
    assert len(stored) == 1 and stored[0]["expires_at"] is not None
    [created] = audit_log.of("session.created", stored[0]["public_id"])
    assert created.actor_id == who.id


async def test_the_cookie_is_secure_behind_tls(app, browser, person):
    who = await person()
    b = browser()
    page = await b.text("/ui/sign-in")
    answer = await b.post(
        "/ui/sign-in",
        {"csrf": csrf_of(page), "name": who.name, "password": PASSWORD, "next": "/ui/"},
        headers={"X-Forwarded-Proto": "https"},
    )
    assert answer.status_code == 303
    cookie = next(v for v in answer.headers.getlist("Set-Cookie") if "buildmax_session=" in v)
    assert "secure" in [part.strip().lower() for part in cookie.split(";")]


async def test_the_session_cookie_opens_no_api_route(app, browser, person):
    who = await person()
    b = browser()
    await b.sign_in(who.name)
    secret = b.cookie("buildmax_session").value
    # The browser would not even send it outside /ui/; sent anyway, it is ignored.
    answer = await b.client.get(
        "/v1/principals/me", headers={"Cookie": f"buildmax_session={secret}"}
    )
    assert answer.status_code == 401


async def test_a_wrong_password_signs_nobody_in(app, browser, person):
    who = await person()
    b = browser()
    answer = await b.sign_in(who.name, password="not the password")
    assert answer.status_code == 401
    assert "Wrong name or password." in await answer.get_data(as_text=True)
    assert b.cookie("buildmax_session") is None
    assert await _session_tokens(app, who.pk) == []


async def test_the_sign_in_limits_apply_to_the_form(app, browser, person):
    who = await person()
    b = browser()
    for _ in range(app.settings.sign_in_max_failures_per_name):
        assert (await b.sign_in(who.name, password="wrong")).status_code == 401
    refused = await b.sign_in(who.name)  # the right password, too late
    assert refused.status_code == 429
    assert int(refused.headers["Retry-After"]) > 0
    assert await _session_tokens(app, who.pk) == []


async def test_a_sign_in_form_without_its_token_is_refused(app, browser, person):
    who = await person()
    b = browser()
    await b.text("/ui/sign-in")  # the form's cookie, but the post forges its token
    answer = await b.post(
        "/ui/sign-in", {"csrf": "forged", "name": who.name, "password": PASSWORD, "next": "/ui/"}
    )
    assert answer.status_code == 403
    fresh = browser()  # no form cookie at all (a post from another site)
    answer = await fresh.post(
        "/ui/sign-in", {"csrf": "", "name": who.name, "password": PASSWORD, "next": "/ui/"}
    )
    assert answer.status_code == 403
    assert await _session_tokens(app, who.pk) == []


async def test_sign_in_goes_back_to_dashboard_pages_only(app, browser, person):
    who = await person()
    for target in ("https://evil.example/", "//evil.example/ui/", "/v1/principals/me"):
        b = browser()
        page = await b.text("/ui/sign-in")
        answer = await b.post(
            "/ui/sign-in",
            {"csrf": csrf_of(page), "name": who.name, "password": PASSWORD, "next": target},
        )
        assert answer.status_code == 303
        assert answer.headers["Location"] == "/ui/", target


async def test_sign_out_needs_the_token_and_revokes_the_session(app, browser, person):
    who = await person()
    b = browser()
    await b.sign_in(who.name)
    secret = b.cookie("buildmax_session").value
    refused = await b.post("/ui/sign-out", {"csrf": "nope"})
    assert refused.status_code == 403
    assert (await b.get("/ui/")).status_code == 200  # still signed in
    answer = await b.post("/ui/sign-out", {"csrf": b.csrf})
    assert answer.status_code == 303
    assert answer.headers["Location"] == "/ui/sign-in"
    [stored] = await _session_tokens(app, who.pk)
    assert stored["revoked_at"] is not None
    assert (await b.get("/ui/")).status_code == 303
    # The same secret, replayed after sign-out, opens nothing.
    replay = await b.client.get(
        "/ui/", headers={"Accept": "text/html", "Cookie": f"buildmax_session={secret}"}
    )
    assert replay.status_code == 303
    await call(b.client, "GET", "/v1/principals/me", secret, expect=401)


async def test_an_expired_session_sends_to_sign_in(app, clock, browser, person):
    who = await person()
    b = browser()
    await b.sign_in(who.name)
    clock.advance(ms=app.settings.session_ttl_seconds * 1000 + 1)
    answer = await b.get("/ui/")
    assert answer.status_code == 303
    assert answer.headers["Location"].startswith("/ui/sign-in")


async def test_a_post_from_another_site_is_refused_even_with_the_token(app, browser, person):
    who = await person()
    b = browser()
    await b.sign_in(who.name)
    answer = await b.post(
        "/ui/sign-out", {"csrf": b.csrf}, headers={"Origin": "https://evil.example"}
    )
    assert answer.status_code == 403
    [stored] = await _session_tokens(app, who.pk)
    assert stored["revoked_at"] is None


async def test_every_dashboard_form_refuses_a_post_without_its_token(app, browser, person):
    """A walk of the route table: every state-changing route under /ui/ is
    refused (403) for a signed-in session that sends no CSRF token."""
    who = await person()
    b = browser()
    await b.sign_in(who.name)
    posts = [
        rule.rule
        for rule in app.url_map.iter_rules()
        if rule.rule.startswith("/ui/")
        and rule.rule != "/ui/sign-in"
        and (rule.methods or set()) & {"POST", "PUT", "PATCH", "DELETE"}
    ]
    assert len(posts) >= 3, posts
    for rule in posts:
        path = re.sub(r"<[^>]+>", "x", rule)
        answer = await b.post(path, {})
        assert answer.status_code == 403, (rule, answer.status_code)


async def test_the_origin_check_follows_the_host_a_proxy_passes(app, browser, person):
    """Behind a proxy that passes only the host name (nginx's ``$host``) the
    port is not compared; one that passes the port has it compared; another
    host, or a port that is no number, is refused."""
    who = await person()
    cases = [
        ("localhost", "http://localhost:8080", 303),  # the port dropped by the proxy
        ("localhost:8080", "http://localhost:8080", 303),
        ("localhost:8443", "https://localhost:8443", 303),
        ("localhost:443", "https://localhost", 303),  # the default port, implied
        ("localhost:8080", "http://localhost:9090", 403),
        ("localhost", "http://evil.example", 403),
        ("localhost:8080", "http://localhost:bad", 403),
    ]
    for host, origin, status in cases:
        b = browser()
        page = await b.text("/ui/sign-in")
        answer = await b.post(
            "/ui/sign-in",
            {"csrf": csrf_of(page), "name": who.name, "password": PASSWORD, "next": "/ui/"},
            headers={"Host": host, "Origin": origin},
        )
        assert answer.status_code == status, (host, origin, answer.status_code)


async def test_a_next_no_location_can_carry_signs_in_to_the_overview_once(app, browser, person):
    who = await person()
    for target in ("/ui/\r\nSet-Cookie: x=1", "/ui/\x00", "/ui/\u2028x", "/ui/..\\evil"):
        b = browser()
        page = await b.text("/ui/sign-in")
        answer = await b.post(
            "/ui/sign-in",
            {"csrf": csrf_of(page), "name": who.name, "password": PASSWORD, "next": target},
        )
        assert answer.status_code == 303, repr(target)
        assert answer.headers["Location"] == "/ui/"
    assert len(await _session_tokens(app, who.pk)) == 4  # one per sign-in, none lost to a 500


async def test_the_redirect_to_sign_in_forgets_a_stale_cookie(app, browser, person):
    who = await person()
    b = browser()
    await b.sign_in(who.name)
    await b.post("/ui/sign-out", {"csrf": b.csrf})
    stale = await b.client.get(
        "/ui/", headers={"Accept": "text/html", "Cookie": "buildmax_session=bmx_stale"}
    )
    assert stale.status_code == 303
    cleared = [v for v in stale.headers.getlist("Set-Cookie") if v.startswith("buildmax_session=")]
    assert cleared and "max-age=0" in cleared[0].lower()
