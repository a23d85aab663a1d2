"""Acceptance review of the tasks plugin: each test states an expected
behaviour that the change does not deliver (it fails now, for the reason in
its docstring)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_hookspecs import StageSpec, Verdict, hookimpl
from buildmax_tasks.reaper import reap
from buildmax_tasks.tables import attempts, decisions, dependencies, holds, reservations, tasks

from buildmax.app import create_app
from buildmax.tables import events

LEASE = 60
REPO = "repo:https://git.test/review.git@main"


class ReviewStage:
    """A one-slot ``check`` stage: linked work handed in with
    ``candidate["decision"] == "approve"`` passes the stage."""

    @hookimpl
    def buildmax_workflow_stages(self) -> list[StageSpec]:
        return [StageSpec("check", order=10, work_kind="review", slots=1, description="check")]

    @hookimpl
    def buildmax_attempt_submitted(
        self, tx: Any, task: Any, attempt: Any, submission: Any
    ) -> Verdict | None:
        if task.subject_task_id is None or task.stage != "check":
            return None
        decision = submission.candidate.get("decision")
        return Verdict("pass" if decision == "approve" else "changes", "not yet")


@pytest.fixture
def buildmax_settings(buildmax_settings):
    """The reaper's own loop stays out of the way: tests call ``reap``."""
    return dataclasses.replace(
        buildmax_settings,
        plugins={"tasks": {"reap_interval_seconds": 3600, "lease_seconds": LEASE}},
    )


@pytest.fixture
def with_stage() -> bool:
    return False


@pytest.fixture
async def app(buildmax_settings, clock, with_stage):
    extra = [("reviewstage", ReviewStage())] if with_stage else []
    application = create_app(buildmax_settings, clock=clock, extra_plugins=extra, auto_migrate=True)
    async with application.test_app():
        yield application


# -- helpers ------------------------------------------------------------------


async def event_count(app: Any) -> int:
    async with app.db.read() as conn:
        return int(await conn.fetch_val(sa.select(sa.func.count()).select_from(events)))


# -- reservations ----------------------------------------------------------------


async def test_a_reservation_ends_with_its_attempt_even_after_the_task_dropped_the_resource(
    work,
):
    """The claimant may PATCH its own claimed task (``require_editable`` lets
    the holder edit). Dropping every resource while the attempt holds them
    makes ``end_attempt`` skip ``UNRESERVE`` (it trusts the task's *current*
    ``resources == "[]"``), so the reservation outlives its attempt: the
    resource stays reserved by an ended attempt for ever and no other task
    naming it can ever be claimed (409 resource-reserved, no lapse to retire)."""
    first = await work.task("holds the repo", resources=[REPO])
    claim = await work.claim(first["id"])
    await work.call(
        "PATCH",
        f"/tasks/{first['id']}",
        work.agent,
        json={"expected_revision": 1, "resources": []},
        expect=200,
    )
    await work.report(claim, "submit", expect=201, summary="done")
    assert (await work.task_row(first["id"]))["state"] == "done"

    # The attempt ended: its reservation must be gone with it.
    second = await work.task("needs the repo", resources=[REPO])
    # Fails now: 409 resource-reserved, held by the submitted attempt.
    await work.claim(second["id"], work.agent2)
    assert [r["attempt_public_id"] for r in await work.rows(reservations)] == [
        (await work.rows(attempts, attempts.c.state == "active"))[0]["public_id"]
    ]


# -- stage work: cancel and retry ------------------------------------------------


@pytest.mark.parametrize("with_stage", [True])
async def test_retrying_canceled_stage_work_keeps_its_stage_so_its_verdict_applies(
    work, with_stage
):
    """Linked stage work keeps its stage for good ("part of the work item's
    identity", lifecycle._leave_stage), but the retry route reopens every task
    with ``stage=None``. A canceled review item that an admin retries has no
    stage any more: the stage plugin no longer recognises it, its approval is
    never applied, and the subject stays ``waiting`` for ever."""
    subject = await work.task("the subject")
    claim = await work.claim(subject["id"])
    handed = await work.report(claim, "submit", expect=201, summary="ready for review")
    [item_id] = handed["work_ids"]
    # Stage work is the stage's: a member may not drop it, an admin may.
    await work.call(
        "POST",
        f"/tasks/{item_id}/cancel",
        work.agent2,
        json={"reason": "oops"},
        expect=403,
        problem="forbidden",
    )
    await work.call(
        "POST", f"/tasks/{item_id}/cancel", work.owner, json={"reason": "oops"}, expect=200
    )
    await work.call("POST", f"/tasks/{item_id}/retry", work.owner, json={}, expect=200)
    assert (await work.task_row(item_id))["stage"] == "check"

    review = await work.claim(item_id, work.agent2)
    await work.report(
        review, "submit", expect=201, summary="fine", candidate={"decision": "approve"}
    )
    assert (await work.task_row(subject["id"]))["state"] == "done"


# -- validation at the edge: 422, never 500 -------------------------------------------


async def test_a_decision_expiry_beyond_what_the_database_stores_is_refused_with_422(work):
    """``expires_in_seconds`` has no upper bound: 2**62 passes the schema and
    the kernel's 64-bit edge check, then ``now + seconds * 1000`` overflows a
    64-bit column and the request fails with 500 instead of a 422 problem."""
    task = await work.task("ask far ahead")
    before = await event_count(work.app)
    body = await work.call(
        "POST",
        f"/tasks/{task['id']}/decisions",
        work.owner,
        json={"question": "later?", "options": ["yes", "no"], "expires_in_seconds": 2**62},
    )
    assert body["status"] == 422, body
    assert await work.rows(decisions) == []
    assert await event_count(work.app) == before


@pytest.mark.parametrize(
    "route",
    ["hold", "fail", "decision"],
)
async def test_reasons_and_options_within_the_schema_limits_are_accepted(work, route):
    """The schemas accept a 2,000-character reason and 20 options of 200
    characters, but those go into audit details verbatim, and the kernel
    refuses audit details over 8 KiB *as JSON-escaped ASCII*: 2,000 emoji are
    24 KB escaped. A valid request fails with 500 (AuditError) instead of
    succeeding (or being refused with 422 at the edge)."""
    long_text = "\U0001f600" * 2000
    task = await work.task("long words")
    if route == "hold":
        response = await work.call(
            "POST",
            "/holds",
            work.owner,
            json={
                "scope": "task",
                "target": task["id"],
                "strength": "suspended",
                "reason": long_text,
            },
        )
    elif route == "fail":
        claim = await work.claim(task["id"])
        response = await work.report(claim, "fail", expect=None, reason=long_text)
    else:
        response = await work.call(
            "POST",
            f"/tasks/{task['id']}/decisions",
            work.owner,
            json={
                "question": "which?",
                "options": [chr(97 + i) + "\u00e9" * 199 for i in range(20)],
            },
        )
    assert response.get("status", 200) in (200, 201, 422), response


# -- idempotency -------------------------------------------------------------------


async def test_removing_a_dependency_twice_with_one_idempotency_key_replays_the_answer(work):
    """Every mutation honours ``Idempotency-Key`` (issue: "Every mutation: ...
    Idempotency-Key honoured"; docs: "mutations accept Idempotency-Key").
    ``DELETE /tasks/{t}/dependencies/{p}`` runs outside
    ``app.idempotency.run``: a retried delete (the first answer lost) answers
    404 instead of replaying the 204."""
    prereq = await work.task("first")
    task = await work.task("second", prerequisites=[prereq["id"]])
    path = f"/tasks/{task['id']}/dependencies/{prereq['id']}"
    first = await work.client.delete(
        work.base + path, headers={**work.owner.headers, "Idempotency-Key": "del-1"}
    )
    assert first.status_code == 204
    again = await work.client.delete(
        work.base + path, headers={**work.owner.headers, "Idempotency-Key": "del-1"}
    )
    assert again.status_code == 204, await again.get_json()
    assert await work.rows(dependencies) == []


# -- leases and holds ------------------------------------------------------------------


async def test_a_lapse_long_after_a_lifted_stop_and_a_successful_renewal_is_charged(work, clock):
    """Only "a lease that lapses because a hold refused its renewal" is free.
    ``hold_refused_at`` is set when a stopped hold refuses a renewal and is
    never cleared: after the hold is lifted and the agent renews successfully,
    a later, ordinary lapse (the agent died) is still not charged, so a task
    can be retried for ever without spending ``max_attempts``."""
    task = await work.task("flaky agent", max_attempts=1)
    claim = await work.claim(task["id"])
    hold = await work.call(
        "POST",
        "/holds",
        work.owner,
        json={"scope": "space", "strength": "stopped", "reason": "incident"},
        expect=201,
    )
    await work.report(claim, "renew", expect=403)
    await work.call("POST", f"/holds/{hold['id']}/lift", work.owner, json={}, expect=200)
    renewed = await work.report(claim, "renew", expect=200)
    assert renewed["state"] == "active"

    # The agent dies; its lease lapses with no hold anywhere.
    clock.advance(seconds=LEASE + 1)
    assert await reap(work.app) == 1
    [row] = await work.rows(attempts, attempts.c.public_id == claim["attempt"]["id"])
    assert (row["state"], row["charged"]) == ("expired", 1)
    assert (await work.task_row(task["id"]))["state"] == "failed"


# -- overrides -------------------------------------------------------------------------


async def test_an_admin_override_records_its_reason_in_the_audit_trail(work, audit_log):
    """The issue: "only the current attempt's owner mutates an active attempt,
    except an admin/owner override with a reason (audited)". The route demands
    ``override_reason`` but drops it: it is in no audit event's details (nor
    declared as a detail key of any attempt action), nor in any row, so the
    trail cannot say why an admin took over someone's attempt."""
    task = await work.task("stuck")
    claim = await work.claim(task["id"])
    why = "the agent stopped answering at 03:00"
    await work.report(claim, "renew", work.owner, expect=200, override_reason=why)
    [event] = [e for e in audit_log.events if e.action == "attempt.renewed"]
    assert event.admin_override is True
    assert why in json.dumps(event.details), event.details


# -- recovery by the claim that needs the task --------------------------------------------


async def test_a_claim_refused_because_the_lapse_spent_the_budget_leaves_the_task_failed(
    work, clock
):
    """A named claim of a task whose only attempt lapsed retires the attempt
    in its own transaction; with ``max_attempts`` spent, the task fails and the
    claim answers 409 task-not-claimable "the task is failed". But the problem
    rolls the claim's transaction back, retirement included: the task is still
    ``claimed`` with an ``active`` attempt, contradicting the answer, until the
    reaper happens by ("correctness never depends on the reaper")."""
    task = await work.task("one shot", max_attempts=1)
    claim = await work.claim(task["id"])
    clock.advance(seconds=LEASE + 1)
    refused = await work.call(
        "POST",
        f"/tasks/{task['id']}/claim",
        work.agent2,
        json={},
        expect=409,
        problem="task-not-claimable",
    )
    assert refused["state"] == "failed"
    shown = await work.call("GET", f"/tasks/{task['id']}", work.viewer, expect=200)
    assert shown["state"] == "failed", shown["state"]
    [row] = await work.rows(attempts, attempts.c.public_id == claim["attempt"]["id"])
    assert row["state"] == "expired"


async def test_an_admin_retries_a_task_stranded_in_an_unloaded_stage(work):
    """docs/tasks.md: a task waiting in a stage whose plugin is gone "shows
    stage_missing: true until an admin cancels or retries it". Retry refuses
    every state but failed/canceled, so the admin's retry of the stranded
    task is 409 invalid-state (only cancel-then-retry works, and any member
    may cancel it)."""
    task = await work.task("stranded")
    claim = await work.claim(task["id"])
    await work.report(claim, "submit", expect=201, summary="done")
    # The stage that held it is no longer loaded (arranged in the database:
    # no public route puts a task in a stage without its plugin).
    async with work.app.db.write() as tx:
        await tx.execute(
            sa.update(tasks)
            .where(tasks.c.public_id == task["id"])
            .values(state="waiting", stage="gone")
        )
    shown = await work.call("GET", f"/tasks/{task['id']}", work.owner, expect=200)
    assert shown["stage_missing"] is True
    retried = await work.call("POST", f"/tasks/{task['id']}/retry", work.owner, json={})
    assert retried.get("state") == "ready", retried


# -- races (PostgreSQL) ---------------------------------------------------------------


class PauseOn:
    """Holds a transaction open at its audit event of ``action``."""

    def __init__(self, action: str) -> None:
        import asyncio

        self.action = action
        self.reached = asyncio.Event()
        self.go = asyncio.Event()

    @hookimpl
    async def buildmax_audit_record(self, tx: Any, event: Any) -> None:
        import asyncio

        if event.action == self.action and not self.reached.is_set():
            self.reached.set()
            await asyncio.wait_for(self.go.wait(), 10)


async def test_the_reaper_never_expires_an_attempt_whose_renewal_committed_first(work, clock):
    """The reaper picks lapsed attempts with a plain read, then locks each
    task and ends the attempt with ``WHERE state = 'active'`` only. On
    PostgreSQL a renewal that committed while the reaper waited for the task
    lock is overwritten: the agent got 200 with a fresh lease, and the
    attempt is then expired (and charged). The end must re-check the lease
    under the lock (``lease_expires_at <= now``).

    Sequence: renewal at lease-1 s holds the task lock (paused at its audit);
    the clock passes the old lease; the reaper reads the attempt as lapsed and
    waits for the lock; the renewal commits; the reaper proceeds."""
    import asyncio

    task = await work.task("renewed just in time")
    claim = await work.claim(task["id"])
    pause = PauseOn("attempt.renewed")
    work.app.plugins.pm.register(pause, name="review-pause")
    try:
        clock.advance(seconds=LEASE - 1)
        renewing = asyncio.create_task(work.report(claim, "renew", expect=200, lease_seconds=LEASE))
        await asyncio.wait_for(pause.reached.wait(), 10)
        clock.advance(seconds=2)
        reaping = asyncio.create_task(reap(work.app))
        await asyncio.sleep(0.5)  # the reaper has read the attempt and waits for the lock
        pause.go.set()
        renewed = await renewing
        await reaping
    finally:
        work.app.plugins.pm.unregister(pause)
    assert renewed["state"] == "active"
    [row] = await work.rows(attempts, attempts.c.public_id == claim["attempt"]["id"])
    assert row["lease_expires_at"] > clock.now_ms()
    assert (row["state"], row["charged"]) == ("active", 0)
    assert (await work.task_row(task["id"]))["state"] == "claimed"


# -- attempt tokens ------------------------------------------------------------------


async def test_an_attempt_token_gets_no_replay_of_another_attempts_report(work):
    """An attempt-scoped token is accepted by its own attempt's routes only.
    The scope check lives in ``fenced``, inside the idempotent work, and a
    replay skips the work: the token of attempt A, sent to attempt B's renew
    route with the key the principal's own token used there, gets B's stored
    200 answer (a read of another attempt through a route that must refuse
    it with 403 not-attempt-owner)."""
    mine = await work.task("mine")
    other = await work.task("other, same agent")
    a = await work.claim(mine["id"])
    b = await work.claim(other["id"])
    path = f"/attempts/{b['attempt']['id']}/renew"
    body = {"generation": 1, "progress": {"secret-ish": "b's progress"}}
    await work.call("POST", path, work.agent, json=body, key="renew-b", expect=200)
    await work.call(
        "POST", path, a["token"], json=body, key="renew-b", expect=403, problem="not-attempt-owner"
    )


# -- paging ----------------------------------------------------------------------------


def _cursor_key(cursor: str) -> list[Any]:
    import base64

    return json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))


@pytest.mark.parametrize("route", ["/tasks", "/ready", "/holds", "/decisions?state=all"])
async def test_a_list_cursor_carries_no_numeric_database_key(work, route):
    """ARCHITECTURE.md: "Public ids are opaque random strings; numeric keys
    never leave the server"; buildmax/pagination.py: a cursor encodes the sort
    key "(never a numeric database key)". The plugin's lists page by the
    internal integer primary key (``task_tasks.id``, ``task_holds.id``,
    ``task_decisions.id``), and the cursor is base64 JSON: decoding it gives
    the row's numeric id (and with it row counts and creation rates)."""
    made = [await work.task(f"t{i}") for i in range(3)]
    for task in made:
        await work.call(
            "POST",
            "/holds",
            work.owner,
            json={"scope": "task", "target": task["id"], "strength": "suspended", "reason": "r"},
            expect=201,
        )
        await work.call(
            "POST",
            f"/tasks/{task['id']}/decisions",
            work.owner,
            json={"question": "q?", "options": ["a", "b"]},
            expect=201,
        )
    if route == "/ready":
        for hold in (await work.call("GET", "/holds", expect=200))["items"]:
            await work.call("POST", f"/holds/{hold['id']}/lift", work.owner, json={}, expect=200)
        for d in (await work.call("GET", "/decisions", expect=200))["items"]:
            await work.call(
                "POST",
                f"/decisions/{d['id']}/answer",
                work.owner,
                json={"answer": "a"},
                expect=200,
            )
    sep = "&" if "?" in route else "?"
    page = await work.call("GET", f"{route}{sep}limit=1", work.viewer, expect=200)
    assert page["next_cursor"], page
    key = _cursor_key(page["next_cursor"])
    table = {"/tasks": tasks, "/ready": tasks, "/holds": holds}.get(route, decisions)
    pks = {r["id"] for r in await work.rows(table)}
    leaked = [part for part in key if isinstance(part, int) and part in pks]
    assert leaked == [], f"cursor {key} carries the numeric key(s) {leaked}"


async def test_adding_and_removing_prerequisites_concurrently_never_deadlocks(work):
    """Lock order differs between the two dependency routes: ``POST
    .../dependencies`` takes the space's graph lock, then the task's row;
    ``DELETE .../dependencies/{p}`` takes the task's row (``task_or_404(...,
    for_update=True)``), then the graph lock (in ``remove_dependency``). On
    PostgreSQL an add and a remove on the same task deadlock; PostgreSQL
    aborts one and the client gets a 500."""
    import asyncio

    pairs = []
    for i in range(12):
        a = await work.task(f"a{i}")
        x = await work.task(f"x{i}")
        y = await work.task(f"y{i}")
        await work.call(
            "POST", f"/tasks/{a['id']}/dependencies", json={"prerequisite": y["id"]}, expect=201
        )
        pairs.append((a, x, y))

    async def add(a, x):
        r = await work.client.post(
            f"{work.base}/tasks/{a['id']}/dependencies",
            headers=work.agent.headers,
            json={"prerequisite": x["id"]},
        )
        return r.status_code

    async def remove(a, y):
        r = await work.client.delete(
            f"{work.base}/tasks/{a['id']}/dependencies/{y['id']}", headers=work.agent2.headers
        )
        return r.status_code

    statuses = await asyncio.gather(*(f for a, x, y in pairs for f in (remove(a, y), add(a, x))))
    assert sorted(set(statuses)) == [201, 204], statuses


# -- audit -------------------------------------------------------------------------------


@pytest.mark.parametrize("with_stage", [True])
async def test_canceling_a_subject_audits_its_canceled_stage_work_and_attempts(
    work, with_stage, audit_log
):
    """ "Every mutation: one audit event per audited action and target." A
    task canceled directly is audited ``task.canceled`` and its attempt
    ``attempt.canceled``; but when the subject is canceled, its linked stage
    work is canceled by ``cancel_linked_work``, which ends the reviewer's
    active attempt and cancels the work item with no audit event for either
    (only outbox events). The same holds for a ``changes``/``reject`` verdict
    canceling sibling slots."""
    subject = await work.task("the subject")
    claim = await work.claim(subject["id"])
    handed = await work.report(claim, "submit", expect=201, summary="review me")
    [item_id] = handed["work_ids"]
    review = await work.claim(item_id, work.agent2)
    await work.call(
        "POST",
        f"/tasks/{subject['id']}/cancel",
        work.owner,
        json={"reason": "no longer needed"},
        expect=200,
    )
    [row] = await work.rows(attempts, attempts.c.public_id == review["attempt"]["id"])
    assert row["state"] == "canceled"
    assert (await work.task_row(item_id))["state"] == "canceled"
    audited = {(e.action, e.target_id) for e in audit_log.events}
    assert ("task.canceled", subject["id"]) in audited
    assert ("task.canceled", item_id) in audited, sorted(audited)
    assert ("attempt.canceled", review["attempt"]["id"]) in audited, sorted(audited)


async def test_prerequisites_of_a_finished_task_cannot_be_removed(work):
    """docs/tasks.md: "Prerequisites change only while a task is open or
    ready." ``add_dependency`` refuses other states (409 invalid-state), but
    ``remove_dependency`` has no state check: the prerequisite edges of a
    claimed, waiting or done task are deleted (history rewritten, audited as
    a change)."""
    prereq = await work.task("first")
    task = await work.task("second", prerequisites=[prereq["id"]])
    claim = await work.claim(prereq["id"])
    await work.report(claim, "submit", expect=201, summary="done")
    second = await work.claim(task["id"])
    await work.report(second, "submit", expect=201, summary="done")
    assert (await work.task_row(task["id"]))["state"] == "done"
    await work.call(
        "DELETE",
        f"/tasks/{task['id']}/dependencies/{prereq['id']}",
        work.agent,
        expect=409,
        problem="invalid-state",
    )
    assert len(await work.rows(dependencies)) == 1
