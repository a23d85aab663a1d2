"""Actions on a task from its page: each is the tasks plugin's route as
the person (its role check, its audit), offered only to those who may
take it, and refused server-side for anyone else however it is posted."""

from __future__ import annotations

from typing import Any

from buildmax.spaces import put_member
from buildmax.testing import call

from .conftest import Team, make_task, signed_in


async def _shown(client: Any, team: Team, task: dict[str, Any]) -> dict[str, Any]:
    shown: dict[str, Any] = await call(
        client, "GET", f"{team.base}/tasks/{task['id']}", team.owner, expect=200
    )
    return shown


def _at(team: Team, task: dict[str, Any], action: str) -> str:
    return f"/ui/spaces/{team.space.id}/tasks/{task['id']}/{action}"


async def test_an_owner_cancels_a_task_with_a_reason(app, client, team, browser, audit_log):
    task = await make_task(client, team)
    b = await signed_in(browser, team.owner)
    answer = await b.post(_at(team, task, "cancel"), {"csrf": b.csrf, "reason": "not needed"})
    assert answer.status_code == 303
    assert answer.headers["Location"].endswith(f"/tasks/{task['id']}?done=cancel")
    after = await _shown(client, team, task)
    assert after["state"] == "canceled"
    [event] = audit_log.of("task.canceled", task["id"])
    assert event.actor_id == team.owner.id and (event.request_id or "").startswith("ui/")
    assert "Done: cancel." in await b.text(answer.headers["Location"])


async def test_an_owner_holds_lifts_retries_and_cancels_an_attempt(app, client, team, browser):
    task = await make_task(client, team)
    b = await signed_in(browser, team.owner)
    form = {"csrf": b.csrf, "strength": "suspended", "reason": "wait for the release"}
    assert (await b.post(_at(team, task, "hold"), form)).status_code == 303
    [hold] = (await _shown(client, team, task))["held_by"]
    assert hold["reason"] == "wait for the release"
    assert "Lift this hold" in await b.text(f"/ui/spaces/{team.space.id}/tasks/{task['id']}")
    lifted = await b.post(_at(team, task, "lift"), {"csrf": b.csrf, "hold": hold["id"]})
    assert lifted.status_code == 303
    assert (await _shown(client, team, task))["held_by"] == []

    claim = await call(
        client, "POST", f"{team.base}/tasks/{task['id']}/claim", team.agent, json={}, expect=201
    )
    attempt = claim["attempt"]
    canceled = await b.post(
        _at(team, task, "cancel-attempt"),
        {
            "csrf": b.csrf,
            "attempt": attempt["id"],
            "generation": str(attempt["generation"]),
            "reason": "stuck",
        },
    )
    assert canceled.status_code == 303
    shown = await call(
        client, "GET", f"{team.base}/attempts/{attempt['id']}", team.owner, expect=200
    )
    assert shown["state"] == "canceled"
    assert (await _shown(client, team, task))["state"] == "ready"

    assert (
        await b.post(_at(team, task, "cancel"), {"csrf": b.csrf, "reason": "x"})
    ).status_code == 303
    assert (await b.post(_at(team, task, "retry"), {"csrf": b.csrf})).status_code == 303
    assert (await _shown(client, team, task))["state"] == "ready"


async def test_a_refused_action_shows_on_the_task_page(app, client, team, browser):
    task = await make_task(client, team)
    b = await signed_in(browser, team.owner)
    answer = await b.post(_at(team, task, "retry"), {"csrf": b.csrf})  # it is not failed
    body = await answer.get_data(as_text=True)
    assert answer.status_code == 409, body[:300]
    assert 'role="alert"' in body and "some work" in body
    assert (await _shown(client, team, task))["state"] == "ready"
    unknown = await b.post(_at(team, task, "explode"), {"csrf": b.csrf})
    assert unknown.status_code == 404


async def test_a_viewer_sees_no_action_and_every_forged_one_is_refused(app, client, team, browser):
    task = await make_task(client, team)
    claim = await call(
        client, "POST", f"{team.base}/tasks/{task['id']}/claim", team.agent, json={}, expect=201
    )
    b = await signed_in(browser, team.viewer)
    html = await b.text(f"/ui/spaces/{team.space.id}/tasks/{task['id']}")
    assert 'id="actions"' not in html and "/cancel" not in html
    forged = {
        "cancel": {"reason": "x", "override": "1"},
        "retry": {},
        "hold": {"strength": "stopped", "reason": "x"},
        "cancel-attempt": {
            "attempt": claim["attempt"]["id"],
            "generation": str(claim["attempt"]["generation"]),
            "reason": "x",
        },
    }
    for action, form in forged.items():
        answer = await b.post(_at(team, task, action), {"csrf": b.csrf, **form})
        assert answer.status_code == 403, action
    after = await _shown(client, team, task)
    assert (after["state"], after["held_by"]) == ("claimed", [])


async def test_a_member_may_cancel_but_is_offered_and_allowed_no_admin_action(
    app, client, team, browser, person
):
    member = await person()
    async with app.db.write() as tx:
        await put_member(tx, team.space.pk, member.pk, "member", app.clock.now_ms())
    task = await make_task(client, team)
    b = await signed_in(browser, member)
    html = await b.text(f"/ui/spaces/{team.space.id}/tasks/{task['id']}")
    assert "Cancel the task" in html and "Place the hold" not in html
    refused = await b.post(
        _at(team, task, "hold"), {"csrf": b.csrf, "strength": "stopped", "reason": "x"}
    )
    assert refused.status_code == 403
    assert (await _shown(client, team, task))["held_by"] == []
    done = await b.post(_at(team, task, "cancel"), {"csrf": b.csrf, "reason": "dup"})
    assert done.status_code == 303
    assert (await _shown(client, team, task))["state"] == "canceled"
