"""The dashboard's pages: what they show, what they escape, who may see
them, and the decision form doing what the API does, as the person."""

from __future__ import annotations

import re

from buildmax.testing import call

from .conftest import Team, ask, make_task, pending_states, signed_in

HOSTILE = "<script>alert(1)</script>"


def _pages(team: Team, task_id: str) -> list[str]:
    space = f"/ui/spaces/{team.space.id}"
    return [
        "/ui/",
        f"{space}/",
        f"{space}/projects/{team.project}/",
        f"{space}/projects/{team.project}/?state=ready",
        f"{space}/tasks/{task_id}",
        f"{space}/decisions",
    ]


async def test_the_board_shows_each_task_in_its_state_column(app, client, team, browser):
    ready = await make_task(client, team, "write the parser")
    claimed = await make_task(client, team, "fix the build")
    await call(
        client, "POST", f"{team.base}/tasks/{claimed['id']}/claim", team.agent, json={}, expect=201
    )
    b = await signed_in(browser, team.owner)
    html = await b.text(f"/ui/spaces/{team.space.id}/projects/{team.project}/")
    columns = dict(
        re.findall(
            r'<section class="column" aria-labelledby="col-(\w+)"[^>]*>(.*?)</section>', html, re.S
        )
    )
    assert "write the parser" in columns["ready"]
    assert "fix the build" in columns["claimed"]
    assert "fix the build" not in columns["ready"]
    only_ready = await b.text(f"/ui/spaces/{team.space.id}/projects/{team.project}/?state=ready")
    assert "write the parser" in only_ready and "fix the build" not in only_ready
    assert ready["id"] in only_ready


async def test_the_task_page_shows_the_attempt_with_its_lease(app, client, team, browser):
    task = await make_task(client, team, "a task", criteria="- it parses\n- it prints")
    claim = await call(
        client, "POST", f"{team.base}/tasks/{task['id']}/claim", team.agent, json={}, expect=201
    )
    await call(
        client,
        "POST",
        f"{team.base}/attempts/{claim['attempt']['id']}/checkpoint",
        team.agent,
        json={"generation": claim["attempt"]["generation"], "data": {"note": "<b>half</b>"}},
        expect=201,
    )
    b = await signed_in(browser, team.owner)
    html = await b.text(f"/ui/spaces/{team.space.id}/tasks/{task['id']}")
    assert claim["attempt"]["id"] in html
    assert "<strong>#1</strong>" in html and "\\u003cb\\u003ehalf" in html  # escaped JSON
    assert f'datetime="{claim["attempt"]["lease_expires_at"]}" data-lease' in html
    assert "- it parses\n- it prints" in html
    assert team.agent.name in html  # the owner by name, not by id


async def test_user_text_is_escaped_on_every_page(app, client, team, browser):
    task = await make_task(client, team, HOSTILE, criteria=HOSTILE, labels=["x"])
    await ask(client, team, task["id"], HOSTILE, [HOSTILE, "b"])
    b = await signed_in(browser, team.owner)
    for path in _pages(team, task["id"]):
        html = await b.text(path)
        assert "<script>alert" not in html, path
        # Every script is the dashboard's own file: none inline, no handlers.
        assert re.findall(r"<script(?![^>]*\bsrc=)", html) == [], path
        assert not re.search(r"\son[a-z]+\s*=", html), path
        assert not re.search(r"\sstyle\s*=", html), path
        # One page: one title (text only), one main, one first-level heading.
        title = re.search(r"<title>(.*?)</title>", html, re.S)
        assert title and "<" not in title.group(1), path
        assert html.count("<main") == 1 and html.count("<h1") == 1, path
    task_html = await b.text(f"/ui/spaces/{team.space.id}/tasks/{task['id']}")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in task_html


async def test_every_page_sends_the_content_security_policy(app, client, team, browser):
    task = await make_task(client, team, "t")
    b = await signed_in(browser, team.owner)
    for path in [*_pages(team, task["id"]), "/ui/sign-in", "/ui/static/dashboard.css"]:
        answer = await b.get(path)
        assert answer.status_code == 200, path
        policy = answer.headers["Content-Security-Policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy, path
        assert "frame-ancestors 'none'" in policy
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
        assert answer.headers["X-Frame-Options"] == "DENY"
        assert answer.headers["Referrer-Policy"] == "same-origin"
        if not path.startswith("/ui/static/"):
            assert answer.headers["Cache-Control"] == "no-store", path


async def test_a_stranger_gets_404_on_every_page_of_the_space(app, client, team, browser, person):
    task = await make_task(client, team, "private work")
    decision = await ask(client, team, task["id"], "ship it?", ["yes", "no"])
    stranger = await person()
    b = await signed_in(browser, stranger)
    for path in _pages(team, task["id"])[1:]:
        answer = await b.get(path)
        body = await answer.get_data(as_text=True)
        assert answer.status_code == 404, path
        assert "private work" not in body and "ship it?" not in body
    answer = await b.post(
        f"/ui/spaces/{team.space.id}/decisions/{decision['id']}/answer",
        {"csrf": b.csrf, "answer": "yes"},
    )
    assert answer.status_code == 404
    assert await pending_states(client, team) == ["pending"]
    # The overview lists only the stranger's own spaces.
    assert team.space.slug not in await b.text("/ui/")


async def test_answering_a_decision_in_the_browser_is_the_api_answer(
    app, client, team, browser, audit_log
):
    task = await make_task(client, team, "parked work")
    decision = await ask(client, team, task["id"], "Which database?", ["sqlite", "postgres"])
    b = await signed_in(browser, team.owner)
    page = await b.text(f"/ui/spaces/{team.space.id}/decisions")
    assert "Which database?" in page
    answer = await b.post(
        f"/ui/spaces/{team.space.id}/decisions/{decision['id']}/answer",
        {"csrf": b.csrf, "answer": "postgres", "comment": "scale out"},
    )
    assert answer.status_code == 303
    assert answer.headers["Location"].endswith(f"/decisions?answered={decision['id']}")
    shown = await call(client, "GET", f"{team.base}/decisions?state=all", team.owner, expect=200)
    [after] = shown["items"]
    assert (after["state"], after["answer"], after["comment"]) == (
        "answered",
        "postgres",
        "scale out",
    )
    assert after["answered_by"] == team.owner.id
    [event] = audit_log.of("decision.answered", decision["id"])
    assert event.actor_id == team.owner.id
    assert (event.request_id or "").startswith("ui/rq_")
    moved = await call(client, "GET", f"{team.base}/tasks/{task['id']}", team.owner, expect=200)
    assert moved["parked"] is False


async def test_a_decision_form_with_a_wrong_token_changes_nothing(app, client, team, browser):
    task = await make_task(client, team, "parked work")
    decision = await ask(client, team, task["id"], "Go?", ["yes"])
    b = await signed_in(browser, team.owner)
    path = f"/ui/spaces/{team.space.id}/decisions/{decision['id']}/answer"
    for form in ({"answer": "yes"}, {"csrf": "0" * 64, "answer": "yes"}):
        answer = await b.post(path, form)
        assert answer.status_code == 403
    assert await pending_states(client, team) == ["pending"]


async def test_a_viewer_cannot_answer_even_by_forging_the_post(app, client, team, browser):
    task = await make_task(client, team, "parked work")
    decision = await ask(client, team, task["id"], "Go?", ["yes"])
    b = await signed_in(browser, team.viewer)
    answer = await b.post(
        f"/ui/spaces/{team.space.id}/decisions/{decision['id']}/answer",
        {"csrf": b.csrf, "answer": "yes"},
    )
    assert answer.status_code == 403
    assert await pending_states(client, team) == ["pending"]


async def test_a_filter_the_api_refuses_is_its_422_as_a_page(app, client, team, browser):
    b = await signed_in(browser, team.owner)
    answer = await b.get(f"/ui/spaces/{team.space.id}/projects/{team.project}/?state=nonsense")
    assert answer.status_code == 422
    body = await answer.get_data(as_text=True)
    assert answer.headers["Content-Type"].startswith("text/html")
    assert "validation-error" in body


async def test_the_attention_list_shows_a_pending_decision(app, client, team, browser):
    task = await make_task(client, team, "parked work")
    await ask(client, team, task["id"], "Go?", ["yes"])
    b = await signed_in(browser, team.owner)
    for path in ("/ui/", f"/ui/spaces/{team.space.id}/"):
        html = await b.text(path)
        assert "decision.pending" in html, path


async def test_columns_count_every_task_of_their_state_and_show_the_newest(
    app, client, team, browser
):
    for n in range(30):
        await make_task(client, team, f"task {n:02d}")
    b = await signed_in(browser, team.owner)
    html = await b.text(f"/ui/spaces/{team.space.id}/projects/{team.project}/")
    ready = re.search(r'aria-labelledby="col-ready"[^>]*>(.*?)</section>', html, re.S)
    assert ready is not None
    assert '<span class="count">30</span>' in ready.group(1)
    assert ready.group(1).count('class="card"') == 25
    assert "task 29" in ready.group(1) and "task 00" not in ready.group(1)  # the newest
    assert "All ready tasks" in ready.group(1)
    overview = await b.text("/ui/")
    assert re.search(r"state-ready\">ready</span> <strong>30</strong>", overview)


async def test_the_board_filters_by_priority(app, client, team, browser):
    await make_task(client, team, "urgent fix", priority=100)
    await make_task(client, team, "someday", priority=-100)
    b = await signed_in(browser, team.owner)
    html = await b.text(f"/ui/spaces/{team.space.id}/projects/{team.project}/?min_priority=10")
    assert "urgent fix" in html and "someday" not in html
    assert 'name="min_priority" type="number"' in html and 'value="10"' in html


async def test_the_board_filters_by_kind_label_agent_and_search(app, client, team, browser):
    await make_task(client, team, "parser work", labels=["backend"])
    await make_task(client, team, "docs work", kind="general", labels=["docs"])
    b = await signed_in(browser, team.owner)
    board = f"/ui/spaces/{team.space.id}/projects/{team.project}/"
    for query, shown, hidden in (
        ("kind=general", "docs work", "parser work"),
        ("label=backend", "parser work", "docs work"),
        ("q=parsers", "parser work", "docs work"),
    ):
        html = await b.text(f"{board}?{query}")
        assert shown in html and hidden not in html, query
    # A search with no word is the API's 422 naming q, shown as a page.
    refused = await b.text(f"{board}?q=%22%2A%22", status=422)
    assert "validation-error" in refused and "at least one word" in refused
    # An agent the space has no profile for is the API's 422, shown as a page.
    assert "validation-error" in await b.text(f"{board}?agent=nobody", status=422)


async def test_a_lapsed_lease_joins_the_attention_list(app, client, clock, team, browser):
    task = await make_task(client, team, "slow work")
    await call(
        client, "POST", f"{team.base}/tasks/{task['id']}/claim", team.agent, json={}, expect=201
    )
    clock.advance(seconds=app.settings.plugins.get("tasks", {}).get("lease_seconds", 600) + 1)
    b = await signed_in(browser, team.owner)
    html = await b.text(f"/ui/spaces/{team.space.id}/")
    assert "lease.lapsed" in html


async def test_a_system_admin_outside_the_space_is_offered_the_actions(
    app, client, team, browser, person
):
    import sqlalchemy as sa

    from buildmax.tables import principals

    admin = await person()
    async with app.db.write() as tx:
        await tx.execute(
            sa.update(principals).where(principals.c.id == admin.pk).values(system_role="admin")
        )
    task = await make_task(client, team, "overridable")
    b = await signed_in(browser, admin)
    html = await b.text(f"/ui/spaces/{team.space.id}/tasks/{task['id']}")
    assert "Place the hold" in html and "Cancel the task" in html
