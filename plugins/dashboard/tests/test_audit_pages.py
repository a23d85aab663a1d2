"""The audit viewer and the diagnostics page: what they show, that the
filters and pages are the audit plugin's, that targets link to their pages,
that user text stays text, that a chain's verification is shown as the
verify route reports it, and that each page refuses whom the API refuses."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_dashboard import audit_pages
from buildmax_hookspecs import Actor

from buildmax.auth import Caller
from buildmax.tables import principals
from buildmax.testing import PrincipalHandle, call

from .conftest import Team, ask, make_task, signed_in

HOSTILE = "<script>alert(1)</script>"


async def _with_role(app: Any, who: PrincipalHandle, role: str) -> PrincipalHandle:
    """Make ``who`` a system ``role`` (as ``buildmax principal`` would)."""
    async with app.db.write() as tx:
        await tx.execute(
            sa.update(principals).where(principals.c.id == who.pk).values(system_role=role)
        )
    return who


def _trail(team: Team, query: str = "") -> str:
    return f"/ui/spaces/{team.space.id}/audit" + (f"?{query}" if query else "")


def _rows(html: str) -> list[str]:
    """The event rows of an audit page, each as its HTML."""
    body = html.split("<tbody>", 1)[1].split("</tbody>", 1)[0] if "<tbody>" in html else ""
    return re.findall(r"<tr>(.*?)</tr>", body, re.S)


def _row(html: str, action: str) -> str:
    """The first row of an audit page whose action is ``action``."""
    return next(row for row in _rows(html) if f'data-label="Action"><code>{action}</code>' in row)


def _actions(html: str) -> list[str]:
    """The actions of an audit page's rows, in order."""
    return [re.findall(r'data-label="Action"><code>([^<]+)</code>', row)[0] for row in _rows(html)]


def _local(moment_ms: int) -> str:
    """A time as a ``datetime-local`` field sends it (read as UTC)."""
    return datetime.fromtimestamp(moment_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")


async def _cancel_in_the_browser(b: Any, team: Team, task: dict[str, Any], reason: str) -> None:
    answer = await b.post(
        f"/ui/spaces/{team.space.id}/tasks/{task['id']}/cancel", {"csrf": b.csrf, "reason": reason}
    )
    assert answer.status_code == 303


# ----------------------------------------------------------------------------- the trail


async def test_an_action_in_the_dashboard_shows_with_the_person_and_its_request(
    app, client, team, browser
):
    task = await make_task(client, team, "to cancel")
    b = await signed_in(browser, team.owner)
    await _cancel_in_the_browser(b, team, task, "not needed")

    everything = await b.text(_trail(team))
    assert {"task.canceled", "task.created", "project.created"} <= set(_actions(everything))
    made_over_the_api = _row(everything, "task.created")
    assert '<code class="id">rq_' in made_over_the_api and "dashboard" not in made_over_the_api
    filtered = await b.text(_trail(team, "action=task.canceled"))
    [row] = _rows(filtered)
    assert _actions(filtered) == ["task.canceled"]
    assert team.owner.name in row and "(human)" in row
    assert re.search(
        r"<code class=\"id\">ui/rq_[^<]+</code> <span class=\"label\">dashboard</span>", row
    )
    assert f'href="/ui/spaces/{team.space.id}/tasks/{task["id"]}"' in row
    assert "<dt>reason</dt><dd>not needed</dd>" in row
    # The API agrees: the same event, by the person, from the dashboard.
    shown = await call(
        client, "GET", f"{team.base}/audit?action=task.canceled", team.owner, expect=200
    )
    [event] = shown["items"]
    assert event["actor"]["id"] == team.owner.id and event["request_id"].startswith("ui/")
    # The filter's value stays in its field.
    assert 'name="action" list="audit-actions" value="task.canceled"' in filtered


async def test_each_filter_narrows_the_events_as_the_api_does(app, client, clock, team, browser):
    early = await make_task(client, team, "early")
    clock.advance(seconds=3600)
    middle = app.clock.now_ms()
    clock.advance(seconds=3600)
    late = await make_task(client, team, "late")
    await ask(client, team, late["id"], "Go?", ["yes"])
    b = await signed_in(browser, team.owner)

    by_agent = await b.text(_trail(team, f"actor={team.agent.id}"))
    assert _actions(by_agent) == ["decision.opened"]
    about_early = await b.text(_trail(team, f"target={early['id']}"))
    assert _actions(about_early) == ["task.created"]
    decisions = await b.text(_trail(team, "target_type=decision"))
    assert _actions(decisions) == ["decision.opened"]
    since = await b.text(_trail(team, f"since={_local(middle)}"))
    assert _actions(since) == ["decision.opened", "task.created"]
    assert late["id"] in since and early["id"] not in since
    before = await b.text(_trail(team, f"until={_local(middle)}&action=task."))
    assert _actions(before) == ["task.created"] and early["id"] in before
    assert f'value="{_local(middle)}"' in before
    nothing = await b.text(_trail(team, "action=hold."))
    assert _rows(nothing) == [] and "No event matches these filters." in nothing


async def test_a_filter_the_api_refuses_shows_its_422_with_the_form(app, client, team, browser):
    b = await signed_in(browser, team.owner)
    answer = await b.get(_trail(team, "since=yesterday"))
    html = await answer.get_data(as_text=True)
    assert answer.status_code == 422
    assert "RFC 3339" in html and 'name="since"' in html and _rows(html) == []


async def test_older_events_page_on_with_the_filters(app, client, team, browser, monkeypatch):
    monkeypatch.setattr(audit_pages, "PAGE_SIZE", 2)
    tasks = [await make_task(client, team, f"task {n}") for n in range(5)]
    b = await signed_in(browser, team.owner)
    seen: list[str] = []
    path = _trail(team, "action=task.created")
    for _ in range(4):  # three pages, then no "Older" link
        if not path:
            break
        html = await b.text(path)
        rows = _rows(html)
        assert 1 <= len(rows) <= 2 and _actions(html) == ["task.created"] * len(rows)
        seen += [t["id"] for r in rows for t in tasks if f'/tasks/{t["id"]}"' in r]
        older = re.search(r'href="(\?[^"]+)" rel="next">Older events', html)
        if older:
            assert "action=task.created" in older.group(1) and "cursor=" in older.group(1)
            assert "Newest events" in html or path.endswith("action=task.created")
        path = _trail(team).split("?")[0] + older.group(1).replace("&amp;", "&") if older else ""
    assert path == "" and seen == [t["id"] for t in reversed(tasks)]


async def test_targets_link_to_their_pages(app, client, team, browser, person):
    task = await make_task(client, team, "held")
    decision = await ask(client, team, task["id"], "Go?", ["yes"])
    hold = await call(
        client,
        "POST",
        f"{team.base}/holds",
        team.owner,
        json={"scope": "task", "target": task["id"], "strength": "suspended", "reason": "wait"},
        expect=201,
    )
    newcomer = await person()
    await call(
        client,
        "PUT",
        f"{team.base}/members/{newcomer.id}",
        team.owner,
        json={"role": "viewer"},
        expect=200,
    )
    space = f"/ui/spaces/{team.space.id}"
    b = await signed_in(browser, team.owner)
    html = await b.text(_trail(team))
    assert f'href="{space}/tasks/{task["id"]}"' in _row(html, "task.created")
    assert f'href="{space}/decisions"' in _row(html, "decision.opened")
    assert decision["id"] in _row(html, "decision.opened")
    assert f'href="{space}/holds"' in _row(html, "hold.created")
    assert hold["id"] in _row(html, "hold.created")
    assert f'href="{space}/projects/{team.project}/"' in _row(html, "project.created")
    # A member's principal: the members page for a space owner, the
    # principal's own page for a system admin (who may read it).
    added = _row(html, "space.member.added")
    assert f'href="{space}/members">{newcomer.name}</a>' in added
    assert "/ui/principals/" not in html
    admin = await _with_role(app, await person(), "admin")
    as_admin = await (await signed_in(browser, admin)).text(_trail(team))
    added = _row(as_admin, "space.member.added")
    assert f'href="/ui/principals/{newcomer.id}">{newcomer.name}</a>' in added


def _caller(principal_id: str, role: str | None = None) -> Caller:
    actor = Actor(principal_id, "human", "someone", system_role=role)  # type: ignore[arg-type]
    return Caller(actor, 1, 1)


def _event(kind: str, ident: str, action: str, space: str | None = "sp_1", **details: Any) -> Any:
    actor = {"id": "pr_actor", "kind": "human"}
    target = {"type": kind, "id": ident}
    return {"actor": actor, "target": target, "action": action, "space": space, "details": details}


_S = "/ui/spaces/sp_1"


@pytest.mark.engine_independent
@pytest.mark.parametrize(
    ("event", "role", "href"),
    [
        (_event("task", "ta_1", "task.done"), None, f"{_S}/tasks/ta_1"),
        (_event("attempt", "at_1", "attempt.failed", task_id="ta_1"), None, f"{_S}/tasks/ta_1"),
        (_event("attempt", "at_1", "attempt.renewed"), None, None),
        (_event("review", "rv_1", "review.recorded", task_id="ta_w"), None, f"{_S}/reviews/ta_w"),
        (
            _event("finding", "fi_1", "finding.resolved", subject_id="ta_s"),
            None,
            f"{_S}/tasks/ta_s",
        ),
        (_event("artifact", "ar_1", "artifact.uploaded", task_id="ta_1"), None, f"{_S}/tasks/ta_1"),
        (_event("catalog_plugin", "p/x", "activation.suspended"), None, f"{_S}/plugins"),
        (
            _event("catalog_plugin", "p/x", "catalog.release.published", None),
            None,
            "/ui/catalog/p%2Fx",
        ),
        (_event("space", "sp_1", "curation.changed"), None, f"{_S}/plugins"),
        (_event("space", "sp_1", "space.updated"), None, f"{_S}/"),
        (_event("token", "tk_1", "token.created", None, principal_id="pr_me"), None, "/ui/tokens"),
        (_event("token", "tk_1", "token.created", None, principal_id="pr_x"), None, None),
        (
            _event("token", "tk_1", "token.revoked", None, principal_id="pr_x"),
            "admin",
            "/ui/principals/pr_x",
        ),
        (_event("principal", "pr_x", "principal.created", None), None, None),
        (_event("principal", "pr_x", "principal.created", None), "admin", "/ui/principals/pr_x"),
        (_event("agent", "ag_1", "agent.created"), None, None),
        (_event("task", "ta_1", "task.done", None), None, None),
    ],
)
def test_a_target_links_to_its_page(event, role, href):
    assert audit_pages.target_href(event, _caller("pr_me", role)) == href


async def test_user_text_in_details_and_filters_is_escaped(app, client, team, browser):
    task = await make_task(client, team, HOSTILE)
    b = await signed_in(browser, team.owner)
    await _cancel_in_the_browser(b, team, task, HOSTILE)
    for query in ("", f"action={HOSTILE}", f"target={HOSTILE}&target_type={HOSTILE}"):
        html = await b.text(_trail(team, query))
        assert "<script>alert" not in html, query
        assert re.findall(r"<script(?![^>]*\bsrc=)", html) == []
        assert not re.search(r"\son[a-z]+\s*=", html) and not re.search(r"\sstyle\s*=", html)
        assert html.count("<main") == 1 and html.count("<h1") == 1
    html = await b.text(_trail(team, "action=task.canceled"))
    assert "<dt>reason</dt><dd>&lt;script&gt;alert(1)&lt;/script&gt;</dd>" in html


async def test_the_chains_verify_and_a_tampered_one_shows_where_it_broke(
    app, client, team, browser, person
):
    await make_task(client, team, "one")
    await make_task(client, team, "two")
    admin = await _with_role(app, await person(), "admin")
    b = await signed_in(browser, admin)
    html = await b.text(_trail(team))
    space_chain, server_chain = re.findall(r'<li class="chain-(\w+)">', html)
    assert (space_chain, server_chain) == ("verified", "verified")
    assert '<strong class="verdict">verified</strong>' in html

    async with app.db.write() as tx:  # behind the server's back
        await tx.execute(
            sa.text("UPDATE audit_events SET details = :d WHERE chain = :c AND seq = 2"),
            {"d": '{"evil":true}', "c": team.space.id},
        )
    html = await b.text(_trail(team))
    assert re.findall(r'<li class="chain-(\w+)">', html) == ["broken", "verified"]
    assert "broken at event 2</strong>" in html
    # The space's owner reads the trail but may not verify it.
    owner_html = await (await signed_in(browser, team.owner)).text(_trail(team))
    assert re.findall(r'<li class="chain-(\w+)">', owner_html) == ["refused"]
    assert "not permitted" in owner_html


async def test_a_viewer_gets_403_and_a_stranger_404(app, client, team, browser, person):
    await make_task(client, team, "private work")
    viewer = await signed_in(browser, team.viewer)
    answer = await viewer.get(_trail(team))
    body = await answer.get_data(as_text=True)
    assert answer.status_code == 403 and "private work" not in body
    assert "task.created" not in body and 'name="action"' not in body  # the error page
    assert "forbidden" in body
    await call(client, "GET", f"{team.base}/audit", team.viewer, expect=403)
    stranger = await signed_in(browser, await person())
    answer = await stranger.get(_trail(team))
    assert answer.status_code == 404
    assert "task.created" not in await answer.get_data(as_text=True)


async def test_the_server_trail_is_for_system_admins(app, client, team, browser, person):
    task = await make_task(client, team, "somewhere")
    owner = await signed_in(browser, team.owner)
    assert (await owner.get("/ui/audit")).status_code == 403
    operator = await signed_in(browser, await _with_role(app, await person(), "operator"))
    assert (await operator.get("/ui/audit")).status_code == 403
    admin = await _with_role(app, await person(), "admin")
    b = await signed_in(browser, admin)
    html = await b.text("/ui/audit")
    assert "session.created" in html and "task.created" in html  # every chain
    assert f'href="/ui/spaces/{team.space.id}/audit"' in html
    assert "The server&#39;s chain" in html and "chain-broken" not in html
    only_space = await b.text(f"/ui/audit?space={team.space.slug}&action=task.")
    assert _actions(only_space) == ["task.created"] and task["id"] in only_space
    assert re.findall(r'<li class="chain-(\w+)">', only_space) == ["verified"]
    system = await b.text("/ui/audit?space=system")
    assert "task.created" not in system and "session.created" in system
    # The admin's own sign-in links to their tokens.
    assert 'href="/ui/tokens">' in _row(system, "session.created")


# ----------------------------------------------------------------------------- diagnostics


async def test_diagnostics_show_the_server_facts_and_attention(app, client, team, browser, person):
    task = await make_task(client, team, "parked")
    await ask(client, team, task["id"], "Go?", ["yes"])
    admin = await _with_role(app, await person(), "admin")
    html = await (await signed_in(browser, admin)).text("/ui/diagnostics")
    reading = await call(client, "GET", "/v1/diagnostics", admin, expect=200)
    assert f"<code>{reading['server']['version']}</code>" in html
    assert f"<dd>{reading['server']['engine']}</dd>" in html
    for fact in reading["facts"]:
        assert f"<code>{fact['name']}</code>" in html
    assert "buildmax_disk_reserve_bytes" in html and " bytes" in html
    assert "backup.stale" in html  # server-wide
    assert f'<a href="/ui/spaces/{team.space.slug}/">{team.space.slug}</a>' in html
    assert "decision.pending" in html
    assert f'href="/ui/spaces/{team.space.slug}/decisions"' in html
    assert 'href="/ui/audit"' in html
    assert not re.search(r"\sstyle\s*=", html) and html.count("<h1") == 1


async def test_diagnostics_are_for_admins_and_operators(app, client, team, browser, person):
    operator = await signed_in(browser, await _with_role(app, await person(), "operator"))
    html = await operator.text("/ui/diagnostics")
    assert "Facts" in html and 'href="/ui/audit"' not in html  # not theirs to read
    plain = await signed_in(browser, team.owner)
    answer = await plain.get("/ui/diagnostics")
    assert answer.status_code == 403
    assert "buildmax_disk" not in await answer.get_data(as_text=True)
    await call(client, "GET", "/v1/diagnostics", team.owner, expect=403)


@pytest.mark.engine_independent
@pytest.mark.parametrize(
    ("name", "value", "shown"),
    [
        ("buildmax_plugin_load_errors", 0, "0"),
        ("buildmax_disk_free_bytes", 3 * 1024**3, "3,221,225,472 bytes (3.0 GiB)"),
        ("buildmax_disk_reserve_bytes", 512, "512 bytes"),
        (
            "buildmax_backup_last_success_timestamp_seconds",
            1700000000.5,
            "2023-11-14 22:13:20.500 UTC",
        ),
        ("some_ratio", 0.25, "0.250"),
    ],
)
def test_a_fact_reads_as_a_person_reads_it(name, value, shown):
    assert audit_pages.fact_value(name, value) == shown
