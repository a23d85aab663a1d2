"""J13 (cancel and retry) and J14 (holds, claim-next skips, resource
reservations, decisions that park a task)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from buildmax_hookspecs import SYSTEM_ACTOR, TaskQueue, Verdict, hookimpl
from buildmax_tasks.reaper import reap
from buildmax_tasks.tables import decisions, holds, submissions

from buildmax.app import create_app


class ClaimCheck:
    """A claim check that vetoes (task id, principal id) pairs."""

    def __init__(self) -> None:
        self.vetoes: dict[tuple[str, str], str] = {}

    @hookimpl
    def buildmax_claim_check(self, tx: Any, task: Any, principal: Any) -> Verdict | None:
        reason = self.vetoes.get((task.id, principal.principal_id))
        return Verdict("deny", reason) if reason else None


@pytest.fixture
def claim_check() -> ClaimCheck:
    return ClaimCheck()


@pytest.fixture
async def app(buildmax_settings, clock, claim_check):
    application = create_app(
        buildmax_settings,
        clock=clock,
        extra_plugins=[("holdtest", claim_check)],
        auto_migrate=True,
    )
    async with application.test_app():
        yield application


# -- helpers ------------------------------------------------------------------

REPO = "repo:https://git.test/app.git@main"


async def hold(work: Any, scope: str, strength: str, target: str | None = None) -> Any:
    return await work.call(
        "POST",
        "/holds",
        json={"scope": scope, "target": target, "strength": strength, "reason": "incident 42"},
        expect=201,
    )


# -- J13: cancel and retry -----------------------------------------------------------


async def test_cancel_an_attempt_then_the_task_then_retry_it(work, audit_log):
    """Cancelling an attempt ends it for good (its submit is refused) and
    readies the task; cancelling the task ends it; a space admin's retry
    readies it with a fresh budget, the next claim is generation n+1, and
    every earlier attempt row is exactly as it was."""
    task = await work.task("cancel me", max_attempts=2)
    first = await work.claim(task["id"])
    canceled = await work.report(first, "cancel", work.agent, reason="wrong approach")
    assert (canceled["state"], canceled["end_reason"]) == ("canceled", "wrong approach")
    assert (await work.call("GET", f"/tasks/{task['id']}", expect=200))["state"] == "ready"
    assert task["id"] in await work.ready_ids()
    late = await work.report(first, "submit", work.agent, expect=409, summary="too late")
    assert late["type"].endswith(":attempt-ended") and late["state"] == "canceled"
    revoked = await work.report(first, "submit", expect=401, summary="too late")
    assert revoked["type"].endswith(":unauthenticated")
    assert await work.rows(submissions) == []
    (event,) = audit_log.of("attempt.canceled", first["attempt"]["id"])
    assert event.details == {"task_id": task["id"], "generation": 1, "reason": "wrong approach"}

    # Cancel the task while agent2 holds it: the owner overrides with a reason.
    second = await work.claim(task["id"], work.agent2)
    assert second["attempt"]["generation"] == 2
    refused = await work.call(
        "POST",
        f"/tasks/{task['id']}/cancel",
        work.agent,
        json={"reason": "not needed"},
        expect=403,
    )
    assert refused["type"].endswith(":forbidden")
    ended = await work.call(
        "POST",
        f"/tasks/{task['id']}/cancel",
        json={"reason": "not needed", "override_reason": "planning changed"},
        expect=200,
    )
    assert (ended["state"], ended["outcome_reason"]) == ("canceled", "not needed")
    row = await work.task_row(task["id"])
    assert (row["state"], row["generation"]) == ("canceled", 2)
    assert [(a["generation"], a["state"]) for a in await work.attempts_of(task["id"])] == [
        (1, "canceled"),
        (2, "canceled"),
    ]
    (event,) = audit_log.of("task.canceled", task["id"])
    assert event.details == {"reason": "not needed", "override_reason": "planning changed"}
    assert event.admin_override is True
    assert task["id"] not in await work.ready_ids()
    again = await work.call(
        "POST", f"/tasks/{task['id']}/claim", json={}, expect=409, problem="task-not-claimable"
    )
    assert again["state"] == "canceled"
    await work.report(second, "renew", work.agent2, expect=409)

    # Retry: space admins only; earlier attempts untouched; next generation 3.
    before = await work.attempts_of(task["id"])
    not_admin = await work.call("POST", f"/tasks/{task['id']}/retry", work.agent, expect=403)
    assert not_admin["type"].endswith(":forbidden")
    assert (await work.task_row(task["id"]))["state"] == "canceled"
    retried = await work.call("POST", f"/tasks/{task['id']}/retry", expect=200)
    assert (retried["state"], retried["attempts_used"], retried["outcome_reason"]) == (
        "ready",
        0,
        None,
    )
    (event,) = audit_log.of("task.retried", task["id"])
    assert event.details == {"previous_state": "canceled", "state": "ready"}
    third = await work.claim(task["id"])
    assert third["attempt"]["generation"] == 3
    after = await work.attempts_of(task["id"])
    assert after[:2] == before
    assert [(a["generation"], a["state"]) for a in after] == [
        (1, "canceled"),
        (2, "canceled"),
        (3, "active"),
    ]
    # Retrying a task that is not failed or canceled is refused.
    await work.call("POST", f"/tasks/{task['id']}/retry", expect=409, problem="invalid-state")


# -- J14: holds ------------------------------------------------------------------


async def test_a_stopped_space_refuses_claims_and_renewals_but_accepts_submit(
    work, clock, audit_log
):
    """A stopped space hold: claims and renewals answer 403 task-held naming
    the hold; submit is still accepted; the lapse that follows a refused
    renewal is not charged; lifting the hold makes the work claimable."""
    running = await work.task("running")
    lapsing = await work.task("lapsing", max_attempts=1)
    waiting = await work.task("waiting")
    finishing = await work.claim(running["id"])
    stalled = await work.claim(lapsing["id"], work.agent2, lease_seconds=60)
    untouched = await work.task_row(waiting["id"])

    placed = await hold(work, "space", "stopped")
    named = {
        "id": placed["id"],
        "scope": {"type": "space", "id": None},
        "strength": "stopped",
        "reason": "incident 42",
    }
    (event,) = audit_log.of("hold.created", placed["id"])
    assert event.details["strength"] == "stopped" and event.details["scope_type"] == "space"
    # Placing a hold rewrites no task row.
    assert await work.task_row(waiting["id"]) == untouched

    refused = await work.call(
        "POST", f"/tasks/{waiting['id']}/claim", json={}, expect=403, problem="task-held"
    )
    assert refused["hold"] == named
    nothing = await work.call("POST", "/claims", json={}, expect=200)
    assert nothing["task"] is None
    assert await work.ready_ids() == []
    shown = await work.call("GET", f"/tasks/{waiting['id']}", expect=200)
    assert shown["parked"] is True and shown["held_by"] == [named]

    lease_before = (await work.attempts_of(running["id"]))[0]["lease_expires_at"]
    renewal = await work.report(finishing, "renew", expect=403)
    assert renewal["type"].endswith(":task-held") and renewal["hold"] == named
    (attempt,) = await work.attempts_of(running["id"])
    assert attempt["lease_expires_at"] == lease_before and attempt["renewed_at"] is None
    assert audit_log.of("attempt.renewed") == []

    submitted = await work.report(finishing, "submit", expect=201, summary="finished")
    assert submitted["task"]["state"] == "done"

    # The other attempt's renewal is refused too; its lease then lapses.
    await work.report(stalled, "renew", expect=403)
    clock.advance(seconds=61)
    await work.call("POST", f"/holds/{placed['id']}/lift", expect=200)
    (event,) = audit_log.of("hold.lifted", placed["id"])
    assert event.target_id == placed["id"]
    (lifted,) = await work.rows(holds, holds.c.public_id == placed["id"])
    assert lifted["lifted_at"] is not None and lifted["lifted_by"] == work.owner.pk

    assert sorted(await work.ready_ids()) == sorted([waiting["id"]])
    recovered = await work.claim(lapsing["id"], work.agent)
    assert recovered["attempt"]["generation"] == 2
    old, new = await work.attempts_of(lapsing["id"])
    assert (new["generation"], new["state"]) == (2, "active")
    assert (old["state"], old["charged"]) == ("expired", 0) and old["hold_refused_at"] is not None
    assert (await work.task_row(lapsing["id"]))["attempts_used"] == 0
    assert (await work.claim(waiting["id"], work.agent2))["attempt"]["generation"] == 1


async def test_a_suspended_task_is_not_claimable_until_the_hold_is_lifted(work, audit_log):
    """A suspended task hold keeps the task out of /ready and refuses its
    claim (403 naming the hold) while other tasks stay claimable and an
    active attempt under a suspended hold may still renew."""
    task = await work.task("suspended")
    other = await work.task("free")
    busy = await work.task("busy")
    running = await work.claim(busy["id"], work.agent2)
    placed = await hold(work, "task", "suspended", task["id"])
    await hold(work, "task", "suspended", busy["id"])

    assert await work.ready_ids() == [other["id"]]
    refused = await work.call(
        "POST", f"/tasks/{task['id']}/claim", json={}, expect=403, problem="task-held"
    )
    assert refused["hold"] == {
        "id": placed["id"],
        "scope": {"type": "task", "id": task["id"]},
        "strength": "suspended",
        "reason": "incident 42",
    }
    assert (await work.call("GET", f"/tasks/{task['id']}", expect=200))["parked"] is True
    assert await work.attempts_of(task["id"]) == []
    # Suspended lets the active attempt finish.
    renewed = await work.report(running, "renew", expect=200)
    assert renewed["state"] == "active"
    taken = await work.call("POST", "/claims", json={}, expect=201)
    assert taken["task"]["id"] == other["id"] and taken["skipped"] == 0

    await work.call("POST", f"/holds/{placed['id']}/lift", expect=200)
    again = await work.call(
        "POST", f"/holds/{placed['id']}/lift", expect=409, problem="invalid-state"
    )
    assert "already lifted" in again["detail"]
    assert await work.ready_ids() == [task["id"]]
    shown = await work.call("GET", f"/tasks/{task['id']}", expect=200)
    assert (shown["state"], shown["parked"], shown["held_by"]) == ("ready", False, [])
    claim = await work.claim(task["id"])
    assert claim["attempt"]["generation"] == 1
    assert len(audit_log.of("hold.lifted")) == 1


# -- J14: claim-next skips, reservations -----------------------------------------------


async def test_claim_next_skips_a_vetoed_and_a_reserved_candidate(work, claim_check, audit_log):
    """Claim-next passes over the best candidate (vetoed for this claimant)
    and the next (its resource is reserved) and claims the third, counting
    two skips; the skipped tasks are left exactly as they were.

    Mutation caught: dropping the UniqueConstraint ``task_reservation_resource``
    in tables.py lets claim-next take the reserved candidate."""
    holder = await work.task("holder", priority=0, resources=[REPO])
    vetoed = await work.task("vetoed", priority=30)
    reserved = await work.task("reserved", priority=20, resources=[REPO])
    third = await work.task("third", priority=10, resources=["path:app/docs/"])
    claim_check.vetoes[(vetoed["id"], work.agent.id)] = "you reviewed it"
    holding = await work.claim(holder["id"], work.agent2)
    skipped_before = {t: await work.task_row(t) for t in (vetoed["id"], reserved["id"])}

    taken = await work.call("POST", "/claims", json={}, who=work.agent, expect=201)
    assert taken["task"]["id"] == third["id"] and taken["skipped"] == 2
    (event,) = audit_log.of("task.claimed", third["id"])
    assert event.details["skipped"] == 2
    for task_id, row in skipped_before.items():
        assert await work.task_row(task_id) == row
        assert await work.attempts_of(task_id) == []
    assert await work.reservations() == sorted(
        [(REPO, holding["attempt"]["id"]), ("path:app/docs/", taken["attempt"]["id"])]
    )


async def test_two_tasks_naming_one_resource_cannot_be_claimed_at_once(work, clock, audit_log):
    """Two tasks naming one resource are claimed at the same moment: one
    claim wins, the other is 409 resource-reserved naming the holder and
    writes nothing. The reservation ends with its attempt: on submit, on
    release and on expiry.

    Mutation caught: dropping the UniqueConstraint ``task_reservation_resource``
    in tables.py lets both claims reserve the resource."""
    one = await work.task("one", resources=[REPO, "path:app/src/"])
    two = await work.task("two", resources=[REPO])
    barrier = asyncio.Barrier(2)

    async def claim(task: dict[str, Any], who: Any) -> tuple[Any, Any]:
        await barrier.wait()
        body = await work.call("POST", f"/tasks/{task['id']}/claim", who, json={})
        return task, body

    results = await asyncio.gather(claim(one, work.agent), claim(two, work.agent2))
    won = [(task, body) for task, body in results if "attempt" in body]
    lost = [(task, body) for task, body in results if "attempt" not in body]
    assert len(won) == 1 and len(lost) == 1, results
    (winner, first), (loser, refused) = won[0], lost[0]
    assert refused["type"].endswith(":resource-reserved"), refused
    assert refused["status"] == 409 and refused["resource"] == REPO
    assert refused["holder"] == {
        "attempt_id": first["attempt"]["id"],
        "task_id": winner["id"],
        "principal_id": first["attempt"]["claimant_id"],
        "lease_expires_at": first["attempt"]["lease_expires_at"],
    }
    assert await work.attempts_of(loser["id"]) == []
    assert (await work.task_row(loser["id"]))["generation"] == 0
    assert await work.reservations() == sorted(
        (r, first["attempt"]["id"]) for r in winner["resources"]
    )
    assert [e.target_id for e in audit_log.of("task.claimed")] == [winner["id"]]
    # A named claim of the loser now is refused the same way.
    again = await work.call(
        "POST",
        f"/tasks/{loser['id']}/claim",
        work.agent2,
        json={},
        expect=409,
        problem="resource-reserved",
    )
    assert again["holder"]["attempt_id"] == first["attempt"]["id"]
    if winner is two:
        # Run the rest of the journey with task one holding the resource.
        await work.report(first, "release", expect=200)
        first = await work.claim(one["id"], work.agent)
        assert await work.reservations() == sorted(
            [(REPO, first["attempt"]["id"]), ("path:app/src/", first["attempt"]["id"])]
        )

    # Submit ends the reservation.
    await work.report(first, "submit", expect=201, summary="done")
    assert await work.reservations() == []
    second = await work.claim(two["id"], work.agent2)
    assert await work.reservations() == [(REPO, second["attempt"]["id"])]

    # Release ends it.
    await work.report(second, "release", expect=200)
    assert await work.reservations() == []
    assert (await work.task_row(two["id"]))["state"] == "ready"

    # Expiry ends it (the reaper retires the lapsed attempt).
    third = await work.claim(two["id"], work.agent, lease_seconds=30)
    assert await work.reservations() == [(REPO, third["attempt"]["id"])]
    clock.advance(seconds=31)
    assert await reap(work.app) == 1
    assert await work.reservations() == []
    assert [a["state"] for a in await work.attempts_of(two["id"])][-2:] == [
        "released",
        "expired",
    ]
    other = await work.task("three", resources=[REPO])
    assert (await work.claim(other["id"], work.agent2))["attempt"]["generation"] == 1


# -- J14: decisions ------------------------------------------------------------------


async def test_a_pending_decision_parks_its_task_until_a_human_answers(work, audit_log):
    """A pending decision keeps its task out of /ready and refuses its claim
    (409 task-parked); an agent cannot answer a human decision, an answer
    must be one of the options, and the answer (audited) releases the task."""
    task = await work.task("ask first")
    asked = await work.call(
        "POST",
        f"/tasks/{task['id']}/decisions",
        work.agent,
        json={"question": "ship on Friday?", "options": ["ship", "wait"]},
        expect=201,
    )
    assert (asked["state"], asked["answerable_by"], asked["opened_by"]) == (
        "pending",
        "human",
        work.agent.id,
    )
    (event,) = audit_log.of("decision.opened", asked["id"])
    assert event.details == {
        "task_id": task["id"],
        "answerable_by": "human",
        "option_count": 2,
    }

    assert task["id"] not in await work.ready_ids()
    shown = await work.call("GET", f"/tasks/{task['id']}", expect=200)
    assert (shown["state"], shown["parked"], shown["pending_decisions"]) == (
        "ready",
        True,
        [asked["id"]],
    )
    parked = await work.call(
        "POST", f"/tasks/{task['id']}/claim", json={}, expect=409, problem="task-parked"
    )
    assert parked["decisions"] == [asked["id"]]
    assert (await work.call("POST", "/claims", json={}, expect=200))["task"] is None
    assert await work.attempts_of(task["id"]) == []

    agent_answer = await work.call(
        "POST",
        f"/decisions/{asked['id']}/answer",
        work.agent,
        json={"answer": "ship"},
        expect=403,
    )
    assert agent_answer["type"].endswith(":forbidden")
    not_an_option = await work.call(
        "POST",
        f"/decisions/{asked['id']}/answer",
        json={"answer": "maybe"},
        expect=422,
        problem="validation-error",
    )
    assert "answer" in not_an_option["errors"]
    (row,) = await work.rows(decisions, decisions.c.public_id == asked["id"])
    assert (row["state"], row["answer"], row["answered_by"]) == ("pending", None, None)
    assert audit_log.of("decision.answered") == []

    answered = await work.call(
        "POST",
        f"/decisions/{asked['id']}/answer",
        json={"answer": "ship", "comment": "go"},
        expect=200,
    )
    assert (answered["state"], answered["answer"], answered["answered_by"]) == (
        "answered",
        "ship",
        work.owner.id,
    )
    (event,) = audit_log.of("decision.answered", asked["id"])
    assert event.details == {"task_id": task["id"], "answer": "ship"}
    assert event.actor_id == work.owner.id
    (row,) = await work.rows(decisions, decisions.c.public_id == asked["id"])
    assert (row["state"], row["answer"], row["answered_by"]) == ("answered", "ship", work.owner.pk)
    twice = await work.call(
        "POST",
        f"/decisions/{asked['id']}/answer",
        json={"answer": "wait"},
        expect=409,
        problem="invalid-state",
    )
    assert "answered" in twice["detail"]

    assert await work.ready_ids() == [task["id"]]
    shown = await work.call("GET", f"/tasks/{task['id']}", expect=200)
    assert (shown["parked"], shown["pending_decisions"]) == (False, [])
    assert (await work.claim(task["id"]))["attempt"]["generation"] == 1


async def test_an_expired_decision_stops_parking_its_task(work, clock, audit_log):
    """A decision opened through TaskQueue by a plugin (any member may
    answer) parks the task until it expires; after expiry the task is
    claimable and the decision can no longer be answered."""
    task = await work.task("time boxed")
    queue = work.app.services.get(TaskQueue)
    async with work.app.db.write() as tx:
        decision_id = await queue.open_decision(
            tx,
            task["id"],
            question="keep waiting?",
            options=["yes", "no"],
            actor=SYSTEM_ACTOR,
            answerable_by="member",
            expires_at=clock.now_ms() + 60_000,
        )
    (event,) = audit_log.of("decision.opened", decision_id)
    assert event.actor_kind == "system" and event.details["answerable_by"] == "member"
    assert task["id"] not in await work.ready_ids()
    await work.call(
        "POST", f"/tasks/{task['id']}/claim", json={}, expect=409, problem="task-parked"
    )

    clock.advance(seconds=61)
    assert await work.ready_ids() == [task["id"]]
    shown = await work.call("GET", f"/tasks/{task['id']}", expect=200)
    assert (shown["parked"], shown["pending_decisions"]) == (False, [])
    late = await work.call(
        "POST",
        f"/decisions/{decision_id}/answer",
        work.agent,
        json={"answer": "yes"},
        expect=409,
        problem="invalid-state",
    )
    assert "expired" in late["detail"]
    listed = await work.call("GET", "/decisions?state=all", expect=200)
    assert [(d["id"], d["state"]) for d in listed["items"]] == [(decision_id, "expired")]
    assert (await work.call("GET", "/decisions", expect=200))["items"] == []
    assert audit_log.of("decision.answered") == []
    (row,) = await work.rows(decisions, decisions.c.public_id == decision_id)
    assert (row["state"], row["answer"]) == ("pending", None)
    assert (await work.claim(task["id"]))["attempt"]["generation"] == 1
