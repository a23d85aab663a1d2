"""Editing the board in the browser: a new task with its prerequisites, an
edit against its revision, prerequisites added and removed, moves and a
space admin's bulk actions. Each is the tasks plugin's route as the person
(its role check, its revision check, its audit); a refused form changes
nothing."""

from __future__ import annotations

import re
from typing import Any

from buildmax.spaces import put_member
from buildmax.testing import call

from .conftest import Team, make_task, signed_in


async def _shown(client: Any, team: Team, task_id: str) -> dict[str, Any]:
    shown: dict[str, Any] = await call(
        client, "GET", f"{team.base}/tasks/{task_id}", team.owner, expect=200
    )
    return shown


async def _tasks(client: Any, team: Team) -> list[dict[str, Any]]:
    page = await call(client, "GET", f"{team.base}/tasks", team.owner, expect=200)
    items: list[dict[str, Any]] = page["items"]
    return items


def _ui(team: Team, *rest: str) -> str:
    return "/".join([f"/ui/spaces/{team.space.id}", *rest])


def _edit_form(csrf: str, **fields: str) -> dict[str, str]:
    """An edit form at revision 1 as a browser posts it: every field, with
    ``fields`` as typed."""
    return {
        "csrf": csrf,
        "expected_revision": "1",
        "title": "t",
        "priority": "0",
        "max_attempts": "3",
        "labels": "",
        "agent": "",
        "body": "",
        "criteria": "",
        **fields,
    }


def _new_task_form(csrf: str, **fields: Any) -> list[tuple[str, str]]:
    base = {"csrf": csrf, "title": "write the guide", "kind": "code", "priority": "5"}
    return [*base.items(), *fields.get("extra", [])]


async def test_a_member_creates_a_task_with_a_prerequisite(app, client, team, browser, audit_log):
    first = await make_task(client, team, title="build the parser")
    b = await signed_in(browser, team.owner)
    page = await b.text(_ui(team, "projects", team.project, "tasks", "new"))
    assert "build the parser" in page and 'name="prerequisite"' in page
    form = _new_task_form(
        b.csrf,
        extra=[
            ("prerequisite", first["id"]),
            ("labels", "docs, guide docs"),
            ("body", "Explain <b>everything</b>"),
            ("criteria", "a reader can install it"),
        ],
    )
    answer = await b.post(_ui(team, "projects", team.project, "tasks", "new"), form)
    assert answer.status_code == 303, await answer.get_data(as_text=True)
    task_id = answer.headers["Location"].split("/tasks/")[1].split("?")[0]
    assert answer.headers["Location"].endswith("?done=created")
    shown = await _shown(client, team, task_id)
    assert (shown["title"], shown["priority"], shown["labels"]) == (
        "write the guide",
        5,
        ["docs", "guide"],
    )
    assert shown["criteria"] == "a reader can install it" and shown["state"] == "open"
    deps = await call(
        client, "GET", f"{team.base}/tasks/{task_id}/dependencies", team.owner, expect=200
    )
    assert [p["id"] for p in deps["prerequisites"]] == [first["id"]]
    [event] = audit_log.of("task.created", task_id)
    assert event.actor_id == team.owner.id and (event.request_id or "").startswith("ui/")
    assert "Explain &lt;b&gt;everything&lt;/b&gt;" in await b.text(answer.headers["Location"])


async def test_a_refused_new_task_is_shown_again_as_filled_and_creates_nothing(
    app, client, team, browser
):
    b = await signed_in(browser, team.owner)
    before = await _tasks(client, team)
    form = _new_task_form(b.csrf, extra=[("labels", "bad label!"), ("body", "keep me")])
    answer = await b.post(_ui(team, "projects", team.project, "tasks", "new"), form)
    page = await answer.get_data(as_text=True)
    assert answer.status_code == 422 and "labels" in page and "keep me" in page
    not_a_number = [f for f in _new_task_form(b.csrf) if f[0] != "priority"] + [
        ("priority", "high")
    ]
    refused = await b.post(_ui(team, "projects", team.project, "tasks", "new"), not_a_number)
    assert refused.status_code == 422
    assert "a whole number" in await refused.get_data(as_text=True)
    assert await _tasks(client, team) == before


async def test_an_edit_against_a_stale_revision_shows_the_conflict_and_changes_nothing(
    app, client, team, browser, audit_log
):
    task = await make_task(client, team, title="first title")
    b = await signed_in(browser, team.owner)
    edit = _ui(team, "tasks", task["id"], "edit")
    page = await b.text(edit)
    assert 'name="expected_revision" value="1"' in page
    # Somebody else revises it meanwhile.
    await call(
        client,
        "PATCH",
        f"{team.base}/tasks/{task['id']}",
        team.owner,
        json={"expected_revision": 1, "title": "their title"},
        expect=200,
    )
    form = _edit_form(b.csrf, title="my title")
    answer = await b.post(edit, form)
    shown_page = await answer.get_data(as_text=True)
    assert answer.status_code == 409
    assert "This task changed since you opened it" in shown_page
    assert "Attempts allowed" in shown_page
    assert "their title" in shown_page and 'value="my title"' in shown_page
    assert 'name="expected_revision" value="2"' in shown_page
    after = await _shown(client, team, task["id"])
    assert (after["title"], after["revision"]) == ("their title", 2)
    assert len(audit_log.of("task.revised", task["id"])) == 1

    # Saving again replaces the current version, as the page said.
    saved = await b.post(edit, {**form, "expected_revision": "2"})
    assert saved.status_code == 303 and saved.headers["Location"].endswith("?done=saved")
    assert (await _shown(client, team, task["id"]))["title"] == "my title"


async def test_an_edit_sends_only_what_changed_and_an_unchanged_one_nothing(
    app, client, team, browser, audit_log
):
    task = await make_task(client, team, title="t", labels=["a"], priority=3)
    b = await signed_in(browser, team.owner)
    edit = _ui(team, "tasks", task["id"], "edit")
    form = _edit_form(b.csrf, priority="3", labels="a")
    unchanged = await b.post(edit, form)
    assert unchanged.headers["Location"].endswith("?done=unchanged")
    assert (await _shown(client, team, task["id"]))["revision"] == 1
    assert audit_log.of("task.revised", task["id"]) == []
    changed = await b.post(edit, {**form, "priority": "7"})
    assert changed.status_code == 303
    [event] = audit_log.of("task.revised", task["id"])
    assert event.details["fields"] == ["priority"]
    assert "Saved: the task is at revision 2." in await b.text(changed.headers["Location"])


async def test_prerequisites_are_added_and_removed_and_a_cycle_is_refused(
    app, client, team, browser
):
    a = await make_task(client, team, title="a")
    later = await make_task(client, team, title="b", prerequisites=[a["id"]])
    b = await signed_in(browser, team.owner)
    on_a = _ui(team, "tasks", a["id"], "prerequisites")
    cycle = await b.post(on_a, {"csrf": b.csrf, "prerequisite": later["id"]})
    assert cycle.status_code == 409
    deps = await call(
        client, "GET", f"{team.base}/tasks/{a['id']}/dependencies", team.owner, expect=200
    )
    assert deps["prerequisites"] == []
    c = await make_task(client, team, title="c")
    added = await b.post(on_a, {"csrf": b.csrf, "prerequisite": c["id"]})
    assert added.status_code == 303 and added.headers["Location"].endswith(
        "?done=prerequisite-added"
    )
    assert (await _shown(client, team, a["id"]))["state"] == "open"
    removed = await b.post(
        _ui(team, "tasks", a["id"], "prerequisites", c["id"], "remove"), {"csrf": b.csrf}
    )
    assert removed.status_code == 303
    assert (await _shown(client, team, a["id"]))["state"] == "ready"


async def test_a_board_move_cancels_and_retries_and_returns_to_the_board(
    app, client, team, browser
):
    task = await make_task(client, team)
    b = await signed_in(browser, team.owner)
    board = _ui(team, "projects", team.project) + "/"
    page = await b.text(board)
    assert 'data-to="canceled"' in page and "New task" in page and 'id="bulk"' in page
    moved = await b.post(
        _ui(team, "tasks", task["id"], "cancel"),
        {"csrf": b.csrf, "reason": "not now", "next": board},
    )
    assert moved.status_code == 303 and moved.headers["Location"] == board + "?done=cancel"
    assert (await _shown(client, team, task["id"]))["state"] == "canceled"
    assert 'data-to="ready"' in await b.text(board)
    elsewhere = await b.post(
        _ui(team, "tasks", task["id"], "retry"), {"csrf": b.csrf, "next": "https://evil.test/"}
    )
    assert elsewhere.headers["Location"].startswith(_ui(team, "tasks", task["id"]))


async def test_a_space_admin_holds_releases_and_cancels_in_bulk(
    app, client, team, browser, audit_log
):
    one, two = (
        await make_task(client, team, title="one"),
        await make_task(client, team, title="two"),
    )
    b = await signed_in(browser, team.owner)
    bulk = _ui(team, "projects", team.project, "bulk")
    picked = [("task", one["id"]), ("task", two["id"])]
    held = await b.post(
        bulk,
        (
            [
                ("csrf", b.csrf),
                ("action", "hold"),
                ("strength", "suspended"),
                ("reason", "freeze"),
                *picked,
            ]
        ),
    )
    page = await held.get_data(as_text=True)
    assert held.status_code == 200 and "2 of 2 tasks done" in page
    for task in (one, two):
        [hold] = (await _shown(client, team, task["id"]))["held_by"]
        assert hold["reason"] == "freeze"
    assert len(audit_log.of("hold.created")) == 2
    released = await b.post(
        bulk, ([("csrf", b.csrf), ("action", "release"), ("reason", ""), *picked])
    )
    assert released.status_code == 200
    for task in (one, two):
        assert (await _shown(client, team, task["id"]))["held_by"] == []
    canceled = await b.post(
        bulk, ([("csrf", b.csrf), ("action", "cancel"), ("reason", "dropped"), *picked])
    )
    assert canceled.status_code == 200
    assert {(await _shown(client, team, t["id"]))["state"] for t in (one, two)} == {"canceled"}
    nothing = await b.post(bulk, ([("csrf", b.csrf), ("action", "hold")]))
    assert nothing.status_code == 422 and "select at least one task" in await nothing.get_data(
        as_text=True
    )


async def test_a_viewer_gets_no_editing_control_and_forged_posts_change_nothing(
    app, client, team, browser, audit_log
):
    task = await make_task(client, team, title="kept")
    other = await make_task(client, team, title="other")
    b = await signed_in(browser, team.viewer)
    board = await b.text(_ui(team, "projects", team.project) + "/")
    for control in ("New task", 'id="bulk"', "data-to=", 'name="task"'):
        assert control not in board
    assert "Edit the task" not in await b.text(_ui(team, "tasks", task["id"]))
    before = (await _tasks(client, team), len(audit_log.events))
    forged = [
        (_ui(team, "projects", team.project, "tasks", "new"), {"title": "sneaky"}),
        (
            _ui(team, "tasks", task["id"], "edit"),
            {"expected_revision": "1", "title": "changed", "priority": "0", "max_attempts": "3"},
        ),
        (_ui(team, "tasks", task["id"], "prerequisites"), {"prerequisite": other["id"]}),
        (_ui(team, "tasks", task["id"], "cancel"), {"reason": "x", "next": "/ui/"}),
        (_ui(team, "tasks", task["id"], "retry"), {"next": "/ui/"}),
    ]
    for path, form in forged:
        answer = await b.post(path, {"csrf": b.csrf, **form})
        assert answer.status_code == 403, (path, answer.status_code)
    bulk = await b.post(
        _ui(team, "projects", team.project, "bulk"),
        ([("csrf", b.csrf), ("action", "cancel"), ("reason", "x"), ("task", task["id"])]),
    )
    assert bulk.status_code == 403
    assert (await _tasks(client, team), len(audit_log.events)) == before


async def test_every_editing_form_refuses_a_missing_or_wrong_csrf_token(
    app, client, team, browser, audit_log
):
    task = await make_task(client, team, title="kept")
    other = await make_task(client, team, title="other")
    b = await signed_in(browser, team.owner)
    before = (await _tasks(client, team), len(audit_log.events))
    forms = [
        (_ui(team, "projects", team.project, "tasks", "new"), {"title": "sneaky"}),
        (_ui(team, "tasks", task["id"], "edit"), {"expected_revision": "1", "title": "x"}),
        (_ui(team, "tasks", task["id"], "prerequisites"), {"prerequisite": other["id"]}),
        (_ui(team, "tasks", task["id"], "prerequisites", other["id"], "remove"), {}),
        (_ui(team, "projects", team.project, "bulk"), {"action": "cancel", "task": task["id"]}),
    ]
    for path, form in forms:
        for token in ({}, {"csrf": "0" * 64}):
            answer = await b.post(path, {**form, **token})
            assert answer.status_code == 403, (path, token)
    assert (await _tasks(client, team), len(audit_log.events)) == before


async def test_an_untouched_edit_of_multi_line_text_changes_nothing(
    app, client, team, browser, audit_log
):
    task = await make_task(
        client, team, body="line one\nline two", criteria="\nstarts with a line break"
    )
    b = await signed_in(browser, team.owner)
    edit = _ui(team, "tasks", task["id"], "edit")
    page = await b.text(edit)
    # A textarea drops one line break right after its tag: the page adds it.
    assert ">\n\nstarts with a line break</textarea>" in page
    # What a browser sends for the untouched fields: CR LF line breaks.
    form = _edit_form(
        b.csrf,
        title=task["title"],
        body="line one\r\nline two",
        criteria="\r\nstarts with a line break",
    )
    answer = await b.post(edit, form)
    assert answer.headers["Location"].endswith("?done=unchanged")
    assert audit_log.of("task.revised", task["id"]) == []


async def test_a_claimed_task_is_canceled_from_its_card_by_an_admin_only(
    app, client, team, browser, person
):
    task = await make_task(client, team, title="busy")
    await call(
        client, "POST", f"{team.base}/tasks/{task['id']}/claim", team.agent, json={}, expect=201
    )
    member = await person()
    async with app.db.write() as tx:
        await put_member(tx, team.space.pk, member.pk, "member", app.clock.now_ms())
    board = _ui(team, "projects", team.project) + "/"
    m = await signed_in(browser, member)
    assert 'data-to="canceled"' not in await m.text(board)
    b = await signed_in(browser, team.owner)
    page = await b.text(board)
    assert 'data-to="canceled"' in page and 'name="override" value="1"' in page
    moved = await b.post(
        _ui(team, "tasks", task["id"], "cancel"),
        {"csrf": b.csrf, "reason": "stop it", "override": "1", "next": board},
    )
    assert moved.status_code == 303 and moved.headers["Location"] == board + "?done=cancel"
    assert (await _shown(client, team, task["id"]))["state"] == "canceled"


async def test_an_admin_edits_a_claimed_task_with_an_override_reason(
    app, client, team, browser, audit_log
):
    task = await make_task(client, team, title="busy")
    await call(
        client, "POST", f"{team.base}/tasks/{task['id']}/claim", team.agent, json={}, expect=201
    )
    b = await signed_in(browser, team.owner)
    edit = _ui(team, "tasks", task["id"], "edit")
    assert 'name="override_reason"' in await b.text(edit)
    form = _edit_form(b.csrf, title="busy, renamed")
    refused = await b.post(edit, form)
    assert refused.status_code == 422 and "override_reason" in await refused.get_data(as_text=True)
    saved = await b.post(edit, {**form, "override_reason": "the agent is stuck"})
    assert saved.status_code == 303
    [event] = audit_log.of("task.revised", task["id"])
    assert event.admin_override and event.details["override_reason"] == "the agent is stuck"


async def test_a_bulk_action_touches_tasks_of_its_project_only(app, client, team, browser):
    other = await call(
        client, "POST", f"{team.base}/projects", team.owner, json={"name": "other"}, expect=201
    )
    mine = await make_task(client, team, title="mine")
    theirs = await call(
        client,
        "POST",
        f"{team.base}/tasks",
        team.owner,
        json={"project": other["id"], "title": "theirs"},
        expect=201,
    )
    b = await signed_in(browser, team.owner)
    form = [("csrf", b.csrf), ("action", "cancel"), ("reason", "x")]
    nowhere = await b.post(
        _ui(team, "projects", "pj_nothing", "bulk"), [*form, ("task", mine["id"])]
    )
    assert nowhere.status_code == 404
    answer = await b.post(
        _ui(team, "projects", team.project, "bulk"), [*form, ("task", theirs["id"])]
    )
    assert answer.status_code == 404
    assert "no such task in this project" in await answer.get_data(as_text=True)
    for task in (mine, theirs):
        assert (await _shown(client, team, task["id"]))["state"] == "ready"
    too_many = await b.post(
        _ui(team, "projects", team.project, "bulk"),
        [*form, *(("task", f"ta_{n}") for n in range(101))],
    )
    assert too_many.status_code == 422


async def test_a_form_without_a_revision_or_with_numbers_that_are_not_is_refused(
    app, client, team, browser
):
    task = await make_task(client, team, title="kept")
    b = await signed_in(browser, team.owner)
    edit = _ui(team, "tasks", task["id"], "edit")
    for revision in ("", "two", "1.5"):
        answer = await b.post(edit, {"csrf": b.csrf, "expected_revision": revision, "title": "x"})
        assert answer.status_code == 422, revision
    assert (await _shown(client, team, task["id"]))["title"] == "kept"


async def test_moving_twice_keeps_one_done_in_the_board_address(app, client, team, browser):
    one, two = (
        await make_task(client, team, title="one"),
        await make_task(client, team, title="two"),
    )
    b = await signed_in(browser, team.owner)
    board = _ui(team, "projects", team.project) + "/?kind=code"
    first = await b.post(
        _ui(team, "tasks", one["id"], "cancel"), {"csrf": b.csrf, "reason": "x", "next": board}
    )
    second = await b.post(
        _ui(team, "tasks", two["id"], "cancel"),
        {"csrf": b.csrf, "reason": "x", "next": first.headers["Location"]},
    )
    assert second.headers["Location"] == board + "&done=cancel"


async def test_a_bulk_answer_posted_again_acts_once(app, client, team, browser, audit_log):
    task = await make_task(client, team, title="held once")
    b = await signed_in(browser, team.owner)
    board = await b.text(_ui(team, "projects", team.project) + "/")
    key = re.search(r'name="request_key" value="([^"]+)"', board)
    assert key, "the bulk form carries no key of its own"
    form = [
        ("csrf", b.csrf),
        ("request_key", key[1]),
        ("action", "hold"),
        ("strength", "suspended"),
        ("reason", "freeze"),
        ("task", task["id"]),
    ]
    for _ in range(2):  # the answer reloaded
        answer = await b.post(_ui(team, "projects", team.project, "bulk"), form)
        assert answer.status_code == 200
    assert len((await _shown(client, team, task["id"]))["held_by"]) == 1
    assert len(audit_log.of("hold.created")) == 1
