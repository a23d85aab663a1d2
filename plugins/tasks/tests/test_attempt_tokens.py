"""Acceptance 7: the token in a claim's answer is scoped to its attempt.

It reports on its own attempt (renew, checkpoint, submit) and reads that
attempt and its task; it cannot act on another attempt (even one of the
same principal), read or claim in the space, mint tokens, or do anything
once its attempt has ended.
"""

from __future__ import annotations

import dataclasses

import pytest
from buildmax_tasks.reaper import reap
from buildmax_tasks.tables import attempts, checkpoints, submissions, tasks

from buildmax.tables import tokens

LEASE = 60


@pytest.fixture
def buildmax_settings(buildmax_settings):
    """The reaper's own loop stays out of the way: the tests call ``reap``."""
    return dataclasses.replace(
        buildmax_settings, plugins={"tasks": {"reap_interval_seconds": 3600}}
    )


async def test_an_attempt_token_reports_on_its_own_attempt(app, work, audit_log):
    task = await work.task("scoped work")
    claim = await work.claim(task["id"])
    token, attempt_id = claim["token"], claim["attempt"]["id"]
    [issued] = await work.rows(tokens, tokens.c.public_id == claim["token_id"])
    assert (issued["principal_id"], issued["scope_type"], issued["scope_id"]) == (
        work.agent.pk,
        "attempt",
        attempt_id,
    )

    await work.call(
        "POST",
        f"/attempts/{attempt_id}/renew",
        token,
        json={"generation": 1, "progress": "half"},
        expect=200,
    )
    await work.call(
        "POST",
        f"/attempts/{attempt_id}/checkpoint",
        token,
        json={"generation": 1, "data": {"files": 2}},
        expect=201,
    )
    shown = await work.call("GET", f"/attempts/{attempt_id}", token, expect=200)
    assert (shown["id"], shown["progress"]) == (attempt_id, "half")
    own_task = await work.call("GET", f"/tasks/{task['id']}", token, expect=200)
    assert own_task["current_attempt_id"] == attempt_id
    done = await work.call(
        "POST",
        f"/attempts/{attempt_id}/submit",
        token,
        json={"generation": 1, "summary": "done", "candidate": {"commit": "abc123"}},
        expect=201,
    )
    assert done["task"]["state"] == "done"

    row = await work.one(attempts, attempts.c.public_id == attempt_id)
    assert (row["state"], row["progress"]) == ("submitted", '"half"')
    [checkpoint] = await work.rows(checkpoints)
    assert checkpoint["attempt_id"] == row["id"]
    [submission] = await work.rows(submissions)
    assert (submission["attempt_id"], submission["submitted_by"]) == (row["id"], work.agent.pk)
    # Audited as the principal, through the scoped token.
    mine = [e for e in audit_log.events if e.target_id == attempt_id]
    assert [e.action for e in mine] == [
        "attempt.renewed",
        "attempt.checkpointed",
        "attempt.submitted",
    ]
    assert {e.actor_id for e in mine} == {work.agent.id}


async def test_an_attempt_token_cannot_act_on_another_attempt(app, work, audit_log):
    """The other attempt belongs to the same principal, so only the token's
    scope refuses it.

    Mutation check: the scope comparison removed from ``fenced`` in
    ``attempts.py``: red (the token renews and submits the other attempt)."""
    own_task = await work.task("own")
    other_task = await work.task("other, same agent")
    foreign_task = await work.task("other agent's")
    own = await work.claim(own_task["id"])
    other = await work.claim(other_task["id"])
    foreign = await work.claim(foreign_task["id"], work.agent2)
    token = own["token"]
    before = await work.snapshot()
    audited = len(audit_log.events)

    for target in (other, foreign):
        attempt_id = target["attempt"]["id"]
        for action, body in {
            "renew": {"generation": 1},
            "checkpoint": {"generation": 1, "data": 1},
            "submit": {"generation": 1, "summary": "not mine"},
            "release": {"generation": 1},
            "fail": {"generation": 1, "reason": "not mine"},
            "cancel": {"generation": 1, "reason": "not mine"},
        }.items():
            await work.call(
                "POST",
                f"/attempts/{attempt_id}/{action}",
                token,
                json=body,
                expect=403,
                problem="not-attempt-owner",
            )
        await work.call(
            "GET", f"/attempts/{attempt_id}", token, expect=403, problem="not-attempt-owner"
        )
        await work.call("GET", f"/tasks/{target['task']['id']}", token, expect=403)

    assert await work.snapshot() == before
    assert len(audit_log.events) == audited
    # The principal's own token still reaches its other attempt.
    await work.call(
        "POST",
        f"/attempts/{other['attempt']['id']}/renew",
        work.agent,
        json={"generation": 1},
        expect=200,
    )


async def test_an_attempt_token_cannot_read_the_space_claim_or_mint_tokens(app, work, audit_log):
    task = await work.task("claimed")
    spare = await work.task("spare")
    claim = await work.claim(task["id"])
    token = claim["token"]
    before = await work.snapshot()
    audited = len(audit_log.events)
    refused = [
        ("GET", "/tasks", None),
        ("GET", "/ready", None),
        ("GET", f"/tasks/{task['id']}/attempts", None),
        # Another task of the space, and one that does not exist, alike.
        ("GET", f"/tasks/{spare['id']}", None),
        ("GET", "/tasks/ta_nowhere", None),
        ("GET", f"/v1/spaces/{work.space.id}", None),
        ("GET", "/v1/spaces", None),
        ("GET", f"/v1/spaces/{work.space.id}/members", None),
        ("POST", f"/tasks/{spare['id']}/claim", {}),
        ("POST", "/claims", {}),
        ("POST", "/tasks", {"project": work.project, "title": "sneaky"}),
        ("POST", "/v1/tokens", {"name": "escalate"}),
    ]
    for method, path, body in refused:
        answer = await work.call(
            method, path, token, json=body, expect=403, problem="token-scope-refused"
        )
        assert claim["attempt"]["id"] in answer["detail"], (method, path)
    assert await work.snapshot() == before
    assert len(audit_log.events) == audited
    [spare_row] = await work.rows(tasks, tasks.c.public_id == spare["id"])
    assert spare_row["state"] == "ready"


ENDINGS = ["submit", "release", "fail", "cancel", "cancel-task", "reaper", "recovered"]


@pytest.mark.parametrize("ending", ENDINGS)
async def test_an_attempt_token_dies_with_its_attempt(app, work, clock, audit_log, ending):
    task = await work.task(f"ends by {ending}")
    claim = await work.claim(task["id"], lease_seconds=LEASE)
    token, attempt_id = claim["token"], claim["attempt"]["id"]
    path = f"/attempts/{attempt_id}"
    if ending == "submit":
        await work.call(
            "POST", f"{path}/submit", token, json={"generation": 1, "summary": "s"}, expect=201
        )
    elif ending in ("release", "fail"):
        await work.call(
            "POST", f"{path}/{ending}", token, json={"generation": 1, "reason": "r"}, expect=200
        )
    elif ending == "cancel":
        await work.call(
            "POST", f"{path}/cancel", work.agent, json={"generation": 1, "reason": "r"}, expect=200
        )
    elif ending == "cancel-task":
        await work.call(
            "POST", f"/tasks/{task['id']}/cancel", work.agent, json={"reason": "r"}, expect=200
        )
    else:
        clock.advance(seconds=LEASE + 1)
        if ending == "reaper":
            assert await reap(app) == 1
        else:
            recovered = await work.claim(task["id"], work.agent2)
            assert recovered["attempt"]["generation"] == 2
    row = await work.one(attempts, attempts.c.public_id == attempt_id)
    assert row["state"] != "active"
    assert (await work.one(tokens, tokens.c.public_id == claim["token_id"]))["revoked_at"]

    before = await work.snapshot()
    audited = len(audit_log.events)
    for method, sub, body in [
        ("POST", "/renew", {"generation": 1}),
        ("POST", "/checkpoint", {"generation": 1, "data": "late"}),
        ("POST", "/submit", {"generation": 1, "summary": "late"}),
        ("POST", "/release", {"generation": 1}),
        ("GET", "", None),
    ]:
        answer = await work.call(method, path + sub, token, json=body, expect=401)
        assert answer["detail"] == "the token was revoked"
    await work.call("GET", f"/tasks/{task['id']}", token, expect=401)
    assert await work.snapshot() == before
    assert len(audit_log.events) == audited


async def test_an_attempt_token_cancels_its_own_attempt_and_the_api_says_so(
    app, work, client, audit_log
):
    """Every route that takes an attempt token declares the ``attempt`` scope
    in the OpenAPI document, and no other tasks route does."""
    task = await work.task("cancel by token")
    claim = await work.claim(task["id"])
    canceled = await work.call(
        "POST",
        f"/attempts/{claim['attempt']['id']}/cancel",
        claim["token"],
        json={"generation": 1, "reason": "wrong task"},
        expect=200,
    )
    assert canceled["state"] == "canceled"
    [event] = [e for e in audit_log.events if e.action == "attempt.canceled"]
    assert (event.actor_id, event.admin_override) == (work.agent.id, False)

    document = await (await client.get("/v1/openapi.json")).get_json()
    scoped = {
        (method.upper(), path)
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
        if operation.get("x-token-scopes") == ["attempt"]
    }
    prefix = "/v1/spaces/{space}"
    assert {
        ("POST", f"{prefix}/attempts/{{attempt}}/{action}")
        for action in ("renew", "checkpoint", "release", "fail", "cancel", "submit")
    } | {
        ("GET", f"{prefix}/attempts/{{attempt}}"),
        ("GET", f"{prefix}/attempts/{{attempt}}/checkpoints"),
        ("GET", f"{prefix}/tasks/{{task}}"),
    } == {
        (method, path)
        for method, path in scoped
        if path.startswith(prefix)
        and not path.startswith((f"{prefix}/artifacts", f"{prefix}/lessons"))
    }
