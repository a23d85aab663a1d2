"""J04: leases, recovery and fencing by generation.

A lapsed attempt is recovered by the next claim with the next generation;
every report of the old attempt is refused and changes nothing. Leases
expire only when the injected clock says so; the reaper is called directly.
"""

from __future__ import annotations

import dataclasses

import pytest
from buildmax_tasks.reaper import reap
from buildmax_tasks.tables import attempts, checkpoints, reservations, submissions, tasks

PROBLEM = "urn:buildmax:problem:"
LEASE = 60


@pytest.fixture
def buildmax_settings(buildmax_settings):
    """The reaper's own loop stays out of the way: the tests call ``reap``."""
    return dataclasses.replace(
        buildmax_settings, plugins={"tasks": {"reap_interval_seconds": 3600}}
    )


def reports(generation: int) -> dict[str, dict]:
    """A body for every report an attempt's owner makes, at ``generation``."""
    return {
        "renew": {"generation": generation, "progress": {"step": "late"}},
        "checkpoint": {"generation": generation, "data": {"step": "late"}},
        "submit": {"generation": generation, "summary": "late work"},
        "release": {"generation": generation, "reason": "late"},
        "fail": {"generation": generation, "reason": "late"},
    }


async def test_j04_a_lapsed_attempt_is_recovered_with_generation_2_and_the_first_is_fenced(
    app, work, clock, audit_log
):
    task = await work.task("recover me", resources=["repo:https://example.test/r.git@main"])
    first = await work.claim(task["id"], work.agent, lease_seconds=LEASE)
    first_id = first["attempt"]["id"]
    await work.call(
        "POST",
        f"/attempts/{first_id}/checkpoint",
        first["token"],
        json={"generation": 1, "data": {"step": 1}},
        expect=201,
    )
    clock.advance(seconds=LEASE + 1)

    second = await work.claim(task["id"], work.agent2)
    second_id = second["attempt"]["id"]
    assert second["attempt"]["generation"] == 2
    assert second["attempt"]["claimant_id"] == work.agent2.id
    assert second["task"]["current_attempt_id"] == second_id
    assert second["task"]["attempts_used"] == 1

    # Durable: the first attempt expired (charged), the second holds the
    # task and its resource.
    old = await work.one(attempts, attempts.c.public_id == first_id)
    assert (old["state"], old["charged"], old["end_reason"]) == ("expired", 1, "the lease lapsed")
    new = await work.one(attempts, attempts.c.public_id == second_id)
    assert (new["state"], new["generation"], new["claimant_id"]) == ("active", 2, work.agent2.pk)
    row = await work.one(tasks, tasks.c.public_id == task["id"])
    assert (row["state"], row["generation"], row["current_attempt_id"], row["attempts_used"]) == (
        "claimed",
        2,
        new["id"],
        1,
    )
    assert [r["attempt_public_id"] for r in await work.rows(reservations)] == [second_id]
    # Audit: the recovery retired the first attempt, then claimed.
    trail = [(e.action, e.target_id, e.actor_id) for e in audit_log.events]
    assert trail[-2:] == [
        ("attempt.expired", first_id, work.agent2.id),
        ("task.claimed", task["id"], work.agent2.id),
    ]
    assert audit_log.events[-2].details == {
        "task_id": task["id"],
        "generation": 1,
        "charged": True,
    }

    # The first owner's late reports, each with generation 1: refused, nothing changes.
    before = await work.snapshot()
    audited = len(audit_log.events)
    for action, body in reports(1).items():
        refused = await work.call(
            "POST",
            f"/attempts/{first_id}/{action}",
            work.agent,
            json=body,
            expect=409,
            problem="attempt-ended",
        )
        assert refused["state"] == "expired", action
        # Its scoped token ended with the attempt.
        await work.call(
            "POST", f"/attempts/{first_id}/{action}", first["token"], json=body, expect=401
        )
        # Aimed at the new attempt, generation 1 is someone else's attempt.
        await work.call(
            "POST",
            f"/attempts/{second_id}/{action}",
            work.agent,
            json=body,
            expect=403,
            problem="not-attempt-owner",
        )
    assert await work.snapshot() == before
    assert len(audit_log.events) == audited
    assert await work.rows(checkpoints, checkpoints.c.attempt_id == new["id"]) == []
    assert await work.rows(submissions) == []

    # The new owner is unaffected.
    renewed = await work.call(
        "POST", f"/attempts/{second_id}/renew", second["token"], json={"generation": 2}, expect=200
    )
    assert renewed["state"] == "active"


async def test_a_stale_generation_is_refused_and_changes_nothing(app, work, audit_log):
    task = await work.task("fenced")
    claim = await work.claim(task["id"])
    attempt_id = claim["attempt"]["id"]
    before = await work.snapshot()
    audited = len(audit_log.events)
    for wrong in (0, 2, 7):
        for action, body in reports(wrong).items():
            for who in (claim["token"], work.agent):
                refused = await work.call(
                    "POST",
                    f"/attempts/{attempt_id}/{action}",
                    who,
                    json=body,
                    expect=409,
                    problem="stale-generation",
                )
                assert refused["generation"] == 1
    assert await work.snapshot() == before
    assert len(audit_log.events) == audited
    row = await work.one(attempts, attempts.c.public_id == attempt_id)
    assert (row["state"], row["progress"], row["renewed_at"]) == ("active", None, None)


@pytest.mark.parametrize("ending", ["release", "submit"])
async def test_after_release_or_submit_every_report_is_attempt_ended(app, work, audit_log, ending):
    task = await work.task(f"ended by {ending}")
    claim = await work.claim(task["id"])
    attempt_id = claim["attempt"]["id"]
    await work.call(
        "POST",
        f"/attempts/{attempt_id}/{ending}",
        claim["token"],
        json=reports(1)[ending],
        expect=201 if ending == "submit" else 200,
    )
    state = "submitted" if ending == "submit" else "released"
    task_state = "done" if ending == "submit" else "ready"
    assert (await work.one(attempts, attempts.c.public_id == attempt_id))["state"] == state
    assert (await work.one(tasks, tasks.c.public_id == task["id"]))["state"] == task_state
    before = await work.snapshot()
    audited = len(audit_log.events)
    for action, body in [*reports(1).items(), ("cancel", {"generation": 1, "reason": "late"})]:
        refused = await work.call(
            "POST",
            f"/attempts/{attempt_id}/{action}",
            work.agent,
            json=body,
            expect=409,
            problem="attempt-ended",
        )
        assert refused["state"] == state
    assert await work.snapshot() == before
    assert len(audit_log.events) == audited
    assert len(await work.rows(submissions)) == (1 if ending == "submit" else 0)


async def test_a_lapsed_lease_not_yet_recovered_refuses_reports(app, work, clock, audit_log):
    task = await work.task("lapsed", max_attempts=1)
    claim = await work.claim(task["id"], lease_seconds=LEASE)
    attempt_id = claim["attempt"]["id"]
    clock.advance(seconds=LEASE)  # the lease ends at this instant
    before = await work.snapshot()
    audited = len(audit_log.events)
    for action, body in reports(1).items():
        for who in (claim["token"], work.agent):
            refused = await work.call(
                "POST",
                f"/attempts/{attempt_id}/{action}",
                who,
                json=body,
                expect=409,
                problem="lease-lapsed",
            )
            assert refused["lease_expires_at"] == claim["attempt"]["lease_expires_at"]
    assert await work.snapshot() == before
    assert len(audit_log.events) == audited
    # Nobody retired it: the attempt is still active, the task still claimed.
    row = await work.one(attempts, attempts.c.public_id == attempt_id)
    assert row["state"] == "active"
    # Cancelling a lapsed attempt is allowed, and is not charged (the task
    # has one attempt: a charge would fail it).
    canceled = await work.call(
        "POST",
        f"/attempts/{attempt_id}/cancel",
        work.agent,
        json={"generation": 1, "reason": "gave up"},
        expect=200,
    )
    assert canceled["state"] == "canceled"
    task_row = await work.one(tasks, tasks.c.public_id == task["id"])
    assert (task_row["state"], task_row["attempts_used"]) == ("ready", 0)


async def test_renew_extends_the_lease_from_now_and_keeps_progress(app, work, clock, audit_log):
    task = await work.task("long job")
    claim = await work.claim(task["id"], lease_seconds=LEASE)
    attempt_id = claim["attempt"]["id"]
    clock.advance(seconds=50)
    renewed_at = clock.now_ms()
    renewed = await work.call(
        "POST",
        f"/attempts/{attempt_id}/renew",
        claim["token"],
        json={"generation": 1, "lease_seconds": 120, "progress": {"done": 3, "of": 10}},
        expect=200,
    )
    assert renewed["progress"] == {"done": 3, "of": 10}
    row = await work.one(attempts, attempts.c.public_id == attempt_id)
    assert row["lease_expires_at"] == renewed_at + 120_000
    assert row["renewed_at"] == renewed_at
    assert audit_log.events[-1].action == "attempt.renewed"
    assert audit_log.events[-1].target_id == attempt_id
    # Past the first lease, inside the renewed one: reports are accepted.
    clock.advance(seconds=100)
    await work.call(
        "POST",
        f"/attempts/{attempt_id}/checkpoint",
        claim["token"],
        json={"generation": 1, "data": "still here"},
        expect=201,
    )
    # And the reaper leaves it alone.
    assert await reap(app) == 0
    assert (await work.one(attempts, attempts.c.public_id == attempt_id))["state"] == "active"


async def test_a_lease_beyond_the_configured_maximum_is_refused(app, work, audit_log):
    task = await work.task("bounded")
    for lease in (3601, 0, -5):
        await work.call(
            "POST",
            f"/tasks/{task['id']}/claim",
            work.agent,
            json={"lease_seconds": lease},
            expect=422,
        )
        await work.call("POST", "/claims", work.agent, json={"lease_seconds": lease}, expect=422)
    assert await work.rows(attempts) == []
    assert (await work.one(tasks, tasks.c.public_id == task["id"]))["state"] == "ready"
    claim = await work.claim(task["id"], lease_seconds=3600)
    before = await work.snapshot()
    await work.call(
        "POST",
        f"/attempts/{claim['attempt']['id']}/renew",
        claim["token"],
        json={"generation": 1, "lease_seconds": 3601},
        expect=422,
    )
    assert await work.snapshot() == before
    assert [e.action for e in audit_log.events if e.action.startswith(("task.c", "attempt."))] == [
        "task.created",
        "task.claimed",
    ]


async def test_the_reaper_expires_lapsed_attempts_and_charges_them(app, work, clock, audit_log):
    short = await work.task("short lease", resources=["path:repo/short/"])
    long = await work.task("long lease")
    lapsing = await work.claim(short["id"], lease_seconds=LEASE)
    lasting = await work.claim(long["id"], work.agent2, lease_seconds=600)
    clock.advance(seconds=LEASE + 1)
    lasting_before = await work.one(attempts, attempts.c.public_id == lasting["attempt"]["id"])

    assert await reap(app) == 1

    expired = await work.one(attempts, attempts.c.public_id == lapsing["attempt"]["id"])
    assert (expired["state"], expired["charged"], expired["ended_at"]) == (
        "expired",
        1,
        clock.now_ms(),
    )
    short_row = await work.one(tasks, tasks.c.public_id == short["id"])
    assert (short_row["state"], short_row["attempts_used"]) == ("ready", 1)
    assert await work.rows(reservations) == []
    # The attempt's token ended with it.
    await work.call(
        "POST",
        f"/attempts/{lapsing['attempt']['id']}/renew",
        lapsing["token"],
        json={"generation": 1},
        expect=401,
    )
    # Forbidden: the live attempt is untouched.
    assert (
        await work.one(attempts, attempts.c.public_id == lasting["attempt"]["id"])
    ) == lasting_before
    expirations = [e for e in audit_log.events if e.action == "attempt.expired"]
    assert [(e.target_id, e.actor_kind, e.details["charged"]) for e in expirations] == [
        (lapsing["attempt"]["id"], "system", True)
    ]
    # Reaping again finds nothing; the task is claimable with generation 2.
    assert await reap(app) == 0
    again = await work.claim(short["id"], work.agent2)
    assert again["attempt"]["generation"] == 2


async def test_a_task_fails_once_its_charged_attempts_are_spent(app, work, clock, audit_log):
    task = await work.task("flaky", max_attempts=3)
    # 1: a lapse (charged), 2: a release (not charged), 3: a failure, 4: a lapse.
    first = await work.claim(task["id"], lease_seconds=LEASE)
    clock.advance(seconds=LEASE + 1)
    assert await reap(app) == 1
    second = await work.claim(task["id"])
    await work.call(
        "POST",
        f"/attempts/{second['attempt']['id']}/release",
        second["token"],
        json={"generation": 2},
        expect=200,
    )
    third = await work.claim(task["id"])
    failed = await work.call(
        "POST",
        f"/attempts/{third['attempt']['id']}/fail",
        third["token"],
        json={"generation": 3, "reason": "tests do not pass"},
        expect=200,
    )
    assert failed["state"] == "failed"
    row = await work.one(tasks, tasks.c.public_id == task["id"])
    assert (row["state"], row["attempts_used"]) == ("ready", 2)
    fourth = await work.claim(task["id"], lease_seconds=LEASE)
    clock.advance(seconds=LEASE + 1)
    assert await reap(app) == 1

    row = await work.one(tasks, tasks.c.public_id == task["id"])
    assert (row["state"], row["attempts_used"]) == ("failed", 3)
    assert row["outcome_reason"] == "all 3 attempts were spent"
    rows = await work.rows(attempts)
    assert sorted((r["generation"], r["state"], r["charged"]) for r in rows) == [
        (1, "expired", 1),
        (2, "released", 0),
        (3, "failed", 1),
        (4, "expired", 1),
    ]
    assert {r["public_id"] for r in rows} == {
        c["attempt"]["id"] for c in (first, second, third, fourth)
    }
    failures = [e for e in audit_log.events if e.action == "task.failed"]
    assert [(e.target_id, e.details["reason"]) for e in failures] == [
        (task["id"], "all 3 attempts were spent")
    ]
    # Forbidden: a failed task is not claimable.
    await work.call(
        "POST",
        f"/tasks/{task['id']}/claim",
        work.agent2,
        json={},
        expect=409,
        problem="task-not-claimable",
    )
    assert len(await work.rows(attempts)) == 4


async def test_a_lapse_after_a_stopped_hold_refused_renewal_is_not_charged(
    app, work, clock, audit_log
):
    """The task has one attempt to spend: a charged lapse would fail it."""
    task = await work.task("held", max_attempts=1)
    claim = await work.claim(task["id"], lease_seconds=LEASE)
    attempt_id = claim["attempt"]["id"]
    hold = await work.call(
        "POST",
        "/holds",
        work.owner,
        json={"scope": "task", "target": task["id"], "strength": "stopped", "reason": "freeze"},
        expect=201,
    )
    lease_before = (await work.one(attempts, attempts.c.public_id == attempt_id))[
        "lease_expires_at"
    ]
    clock.advance(seconds=10)
    refused = await work.call(
        "POST",
        f"/attempts/{attempt_id}/renew",
        claim["token"],
        json={"generation": 1},
        expect=403,
        problem="task-held",
    )
    assert refused["hold"]["id"] == hold["id"]
    row = await work.one(attempts, attempts.c.public_id == attempt_id)
    assert (row["lease_expires_at"], row["hold_refused_at"], row["renewed_at"]) == (
        lease_before,
        clock.now_ms(),
        None,
    )
    assert "attempt.renewed" not in audit_log.actions()

    clock.advance(seconds=LEASE)
    assert await reap(app) == 1
    row = await work.one(attempts, attempts.c.public_id == attempt_id)
    assert (row["state"], row["charged"]) == ("expired", 0)
    task_row = await work.one(tasks, tasks.c.public_id == task["id"])
    assert (task_row["state"], task_row["attempts_used"]) == ("ready", 0)
    [expired] = [e for e in audit_log.events if e.action == "attempt.expired"]
    assert expired.details["charged"] is False
    assert "task.failed" not in audit_log.actions()

    # Lifted, the task is claimable again, with the next generation.
    await work.call("POST", f"/holds/{hold['id']}/lift", work.owner, json={}, expect=200)
    again = await work.claim(task["id"], work.agent2)
    assert again["attempt"]["generation"] == 2


# -- only the owner acts on an attempt; an owner or admin may override with a reason ------


@pytest.mark.parametrize("action", ["cancel", "release"])
async def test_the_space_owner_overrides_another_agents_attempt_only_with_a_reason(
    app, work, audit_log, action
):
    task = await work.task(f"override {action}")
    claim = await work.claim(task["id"], work.agent)
    attempt_id = claim["attempt"]["id"]
    body = {"generation": 1, "reason": "the agent is stuck"}
    before = await work.snapshot()
    refused = await work.call(
        "POST", f"/attempts/{attempt_id}/{action}", work.owner, json=body, expect=422
    )
    assert "override_reason" in refused["errors"]
    assert await work.snapshot() == before

    done = await work.call(
        "POST",
        f"/attempts/{attempt_id}/{action}",
        work.owner,
        json={**body, "override_reason": "the agent stopped answering"},
        expect=200,
    )
    state = "canceled" if action == "cancel" else "released"
    assert done["state"] == state
    row = await work.one(attempts, attempts.c.public_id == attempt_id)
    assert (row["state"], row["end_reason"], row["charged"]) == (state, "the agent is stuck", 0)
    task_row = await work.one(tasks, tasks.c.public_id == task["id"])
    assert (task_row["state"], task_row["attempts_used"]) == ("ready", 0)
    [event] = [e for e in audit_log.events if e.action == f"attempt.{state}"]
    assert (event.actor_id, event.target_id, event.admin_override) == (
        work.owner.id,
        attempt_id,
        True,
    )
    # The agent's own token is dead, and so are its reports.
    await work.call(
        "POST", f"/attempts/{attempt_id}/renew", claim["token"], json={"generation": 1}, expect=401
    )


async def test_a_plain_member_cannot_act_on_another_agents_attempt(app, work, audit_log):
    task = await work.task("not yours")
    claim = await work.claim(task["id"], work.agent)
    attempt_id = claim["attempt"]["id"]
    before = await work.snapshot()
    audited = len(audit_log.events)
    bodies = {
        **reports(1),
        "cancel": {"generation": 1, "reason": "mine now"},
    }
    for action, body in bodies.items():
        for extra in ({}, {"override_reason": "I want it"}):
            await work.call(
                "POST",
                f"/attempts/{attempt_id}/{action}",
                work.agent2,
                json={**body, **extra},
                expect=403,
                problem="not-attempt-owner",
            )
    assert await work.snapshot() == before
    assert len(audit_log.events) == audited
    # The owner's own cancel is no override.
    await work.call(
        "POST",
        f"/attempts/{attempt_id}/cancel",
        claim["token"],
        json={"generation": 1, "reason": "done with it"},
        expect=200,
    )
    [event] = [e for e in audit_log.events if e.action == "attempt.canceled"]
    assert (event.actor_id, event.admin_override) == (work.agent.id, False)
