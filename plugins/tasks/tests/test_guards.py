"""Guards no other test notices: each test below turns red when the guard
named in its docstring is removed from the plugin (the mutation was applied
and the test seen to fail). Each checks the response, the durable rows and
that nothing else changed."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_hookspecs import StageSpec, TaskQueue, Verdict, hookimpl
from buildmax_tasks.tables import (
    agent_revisions,
    agents,
    decisions,
    dependencies,
    holds,
    policies,
    projects,
    submissions,
    task_revisions,
    tasks,
)

from buildmax.app import create_app

REPO = "repo:https://git.test/guards.git@main"


class CheckStage:
    """A one-slot ``check`` stage; its linked work passes on ``approve``."""

    @hookimpl
    def buildmax_workflow_stages(self) -> list[StageSpec]:
        return [StageSpec("check", order=10, work_kind="review", slots=1, description="check")]

    @hookimpl
    def buildmax_attempt_submitted(
        self, tx: Any, task: Any, attempt: Any, submission: Any
    ) -> Verdict | None:
        if task.subject_task_id is None or task.stage != "check":
            return None
        approved = submission.candidate.get("decision") == "approve"
        return Verdict("pass" if approved else "changes", "not yet")


class SecondJudge:
    """Another plugin that also judges ``check`` work (always ``pass``)."""

    @hookimpl
    def buildmax_attempt_submitted(
        self, tx: Any, task: Any, attempt: Any, submission: Any
    ) -> Verdict | None:
        if task.subject_task_id is None or task.stage != "check":
            return None
        return Verdict("pass", "looks fine to me too")


@pytest.fixture
def buildmax_settings(buildmax_settings):
    """The reaper's own loop stays out of the way: only claims retire lapses."""
    return dataclasses.replace(
        buildmax_settings, plugins={"tasks": {"reap_interval_seconds": 3600}}
    )


@pytest.fixture
def judges() -> list[tuple[str, Any]]:
    """Extra workflow plugins of the app (none unless a test says)."""
    return []


@pytest.fixture
async def app(buildmax_settings, clock, judges):
    application = create_app(
        buildmax_settings, clock=clock, extra_plugins=judges, auto_migrate=True
    )
    async with application.test_app():
        yield application


# -- helpers ------------------------------------------------------------------


async def hand_in(work: Any, claim: dict[str, Any], **body: Any) -> Any:
    attempt = claim["attempt"]
    return await work.call(
        "POST",
        f"/attempts/{attempt['id']}/submit",
        claim["token"],
        json={"generation": attempt["generation"], "summary": "done", **body},
        expect=201,
    )


async def finished(work: Any, title: str) -> dict[str, Any]:
    """A task claimed and handed in: done."""
    task = await work.task(title)
    await hand_in(work, await work.claim(task["id"]))
    assert (await work.task_row(task["id"]))["state"] == "done"
    return task


async def other_space(work: Any, make_principal: Any, make_space: Any) -> tuple[Any, str, Any]:
    """Space B, owned by someone else, with a project ``main`` and an agent
    ``coder``: (its owner, its base path, the agent's body)."""
    bob = await make_principal("human")
    space_b = await make_space(bob)
    base = f"/v1/spaces/{space_b.id}"
    await work.call("POST", base + "/projects", bob, json={"name": "main"}, expect=201)
    coder = await work.call(
        "POST", base + "/agents", bob, json={"name": "coder", "plugins": ["lint"]}, expect=201
    )
    return bob, base, coder


# -- space isolation ------------------------------------------------------------


async def test_listing_tasks_shows_only_the_spaces_own_tasks(work, make_principal, make_space):
    """A member of space A lists /tasks: exactly A's tasks, never those of a
    space B it does not belong to, with or without a filter; nothing changes.

    Mutation caught: routes/tasks.py ``list_tasks`` without
    ``tasks.c.space_id == access.pk`` (B's tasks are listed too)."""
    bob, base_b, _ = await other_space(work, make_principal, make_space)
    for title in ("b one", "b two"):
        await work.call(
            "POST", base_b + "/tasks", bob, json={"project": "main", "title": title}, expect=201
        )
    first = await work.task("a one")
    second = await work.task("a two")
    before = await work.snapshot()

    listed = await work.call("GET", "/tasks", work.agent, expect=200)
    assert [t["id"] for t in listed["items"]] == [second["id"], first["id"]]
    assert listed["next_cursor"] is None
    ready = await work.call("GET", "/tasks?state=ready", work.viewer, expect=200)
    assert [t["id"] for t in ready["items"]] == [second["id"], first["id"]]
    searched = await work.call("GET", "/tasks?q=two", work.agent, expect=200)
    assert [t["id"] for t in searched["items"]] == [second["id"]]
    # B's owner sees B's two tasks and none of A's.
    theirs = await work.call("GET", base_b + "/tasks", bob, expect=200)
    assert sorted(t["title"] for t in theirs["items"]) == ["b one", "b two"]
    assert len(await work.rows(tasks)) == 4
    assert await work.snapshot() == before


async def test_another_spaces_agent_is_refused_on_create_and_update(
    work, make_principal, make_space, audit_log
):
    """Naming space B's agent (by id, or by a name only B uses) when
    creating or revising a task of A is 422 validation-error on ``agent``;
    no task, revision or event is written. A's own agent is accepted.

    Mutation caught: routes/tasks.py ``agent_pk`` without
    ``agents.c.space_id == access.pk`` (B's agent is assigned: 201 / 200)."""
    _, _, coder = await other_space(work, make_principal, make_space)
    helper = await work.call("POST", "/agents", json={"name": "helper", "plugins": []}, expect=201)
    task = await work.task("assign me")
    before = await work.snapshot()
    audit_log.events.clear()

    for ref in (coder["id"], "coder"):
        refused = await work.call(
            "POST",
            "/tasks",
            work.agent,
            json={"project": "main", "title": "stolen", "agent": ref},
            expect=422,
            problem="validation-error",
        )
        assert refused["errors"] == {"agent": ["Not an agent of this space."]}
        patched = await work.call(
            "PATCH",
            f"/tasks/{task['id']}",
            work.agent,
            json={"expected_revision": 1, "agent": ref},
            expect=422,
            problem="validation-error",
        )
        assert patched["errors"] == {"agent": ["Not an agent of this space."]}
    assert await work.snapshot() == before
    assert audit_log.events == []
    row = await work.task_row(task["id"])
    assert (row["revision"], row["agent_id"]) == (1, None)

    # The space's own agent, by name: accepted.
    assigned = await work.call(
        "PATCH",
        f"/tasks/{task['id']}",
        work.agent,
        json={"expected_revision": 1, "agent": "helper"},
        expect=200,
    )
    assert (assigned["agent_id"], assigned["revision"]) == (helper["id"], 2)


# -- roles ------------------------------------------------------------------------


async def test_a_plain_member_may_neither_place_nor_lift_a_hold(work, audit_log):
    """Holds are for space admins: a member's hold on the space, a project
    or a task is 403 forbidden, so is lifting the owner's hold; no hold row
    is written or lifted and nothing else changes.

    Mutations caught (each alone): routes/holds.py ``create`` with
    ``require_space(space, "member", ...)`` (201), and ``lift`` with
    ``require_space(space, "member", ...)`` (200)."""
    task = await work.task("keep going")
    placed = await work.call(
        "POST",
        "/holds",
        json={"scope": "task", "target": task["id"], "strength": "suspended", "reason": "wait"},
        expect=201,
    )
    before = await work.snapshot()
    audit_log.events.clear()

    for scope, target in (("space", None), ("project", "main"), ("task", task["id"])):
        await work.call(
            "POST",
            "/holds",
            work.agent,
            json={"scope": scope, "target": target, "strength": "stopped", "reason": "mine"},
            expect=403,
            problem="forbidden",
        )
    await work.call(
        "POST", f"/holds/{placed['id']}/lift", work.agent, expect=403, problem="forbidden"
    )
    (row,) = await work.rows(holds)
    assert (row["public_id"], row["lifted_at"], row["lifted_by"]) == (placed["id"], None, None)
    assert await work.snapshot() == before
    assert audit_log.events == []
    assert await work.ready_ids() == []

    # The owner may lift it.
    await work.call("POST", f"/holds/{placed['id']}/lift", expect=200)
    assert await work.ready_ids() == [task["id"]]


async def test_a_plain_member_may_neither_define_nor_revise_an_agent(work, audit_log):
    """Agents are for space admins: a member's new agent is 403 forbidden and
    so is its revision of the owner's agent; no agent, revision or plugin
    row is written and nothing else changes.

    Mutations caught (each alone): routes/agents.py ``create`` with
    ``require_space(space, "member", ...)`` (201), and ``revise`` with
    ``require_space(space, "member", ...)`` (201)."""
    made = await work.call(
        "POST", "/agents", json={"name": "coder", "plugins": ["lint"]}, expect=201
    )
    before = await work.snapshot()
    audit_log.events.clear()

    await work.call(
        "POST",
        "/agents",
        work.agent,
        json={"name": "rogue", "plugins": ["shady"]},
        expect=403,
        problem="forbidden",
    )
    await work.call(
        "POST",
        "/agents/coder/revisions",
        work.agent,
        json={"instructions": "do as I say", "plugins": ["shady"], "expected_revision": 1},
        expect=403,
        problem="forbidden",
    )
    (agent,) = await work.rows(agents)
    (revision,) = await work.rows(agent_revisions)
    assert (agent["public_id"], agent["current_revision_id"]) == (made["id"], revision["id"])
    assert (revision["number"], revision["plugins"]) == (1, '["lint"]')
    assert await work.snapshot() == before
    assert audit_log.events == []
    shown = await work.call("GET", "/agents/coder", work.agent, expect=200)
    assert shown["revision"]["number"] == 1


async def test_a_concurrent_agent_revision_names_the_revision_it_lost_to(work, make_principal):
    """Two revisions of one agent at once, both expecting revision 1: one is
    revision 2, the other is 409 naming revision 2 (the one it lost to), and
    no third revision is written.

    Mutation caught: agents.py ``revise_agent`` reading the newest revision
    number before taking the agent's lock (both are 201 on PostgreSQL)."""
    admin = await make_principal("human")
    await work.call("PUT", f"/members/{admin.id}", json={"role": "admin"}, expect=200)
    await work.call("POST", "/agents", json={"name": "coder", "plugins": []}, expect=201)
    body = {"expected_revision": 1, "instructions": "x", "plugins": []}

    answers = await asyncio.gather(
        work.call("POST", "/agents/coder/revisions", json=body),
        work.call("POST", "/agents/coder/revisions", admin, json=body),
    )

    (lost,) = [a for a in answers if a.get("status") == 409]
    (won,) = [a for a in answers if a.get("status") != 409]
    assert won["revision"]["number"] == 2
    assert lost["type"].endswith(":revision-conflict")
    assert lost["revision"] == 2
    assert lost["detail"] == "the agent is at revision 2, not 1"
    assert sorted(r["number"] for r in await work.rows(agent_revisions)) == [1, 2]


async def test_a_task_shows_its_holds_in_the_order_they_were_placed(work, make_principal):
    """``held_by`` lists the holds in placement order whatever the planner
    does once the tables have statistics (ANALYZE, as autovacuum runs it).

    Mutation caught: views.py ``_LIVE_HOLDS`` without its ``ORDER BY`` (on
    PostgreSQL the holds come back in their placers' order)."""
    admin = await make_principal("human")
    await work.call("PUT", f"/members/{admin.id}", json={"role": "admin"}, expect=200)
    task = await work.task()
    for who, scope, target, reason in (
        (admin, "task", task["id"], "first"),
        (work.owner, "project", "main", "second"),
        (admin, "space", None, "third"),
    ):
        body = {"scope": scope, "target": target, "strength": "suspended", "reason": reason}
        await work.call("POST", "/holds", who, json=body, expect=201)
    async with work.app.db.write() as tx:
        await tx.execute(sa.text("ANALYZE"))

    shown = await work.call("GET", f"/tasks/{task['id']}", work.viewer, expect=200)

    assert [h["reason"] for h in shown["held_by"]] == ["first", "second", "third"]


# -- editing and cancelling --------------------------------------------------------


async def test_a_member_cannot_revise_a_task_another_agent_holds(work, audit_log):
    """agent holds the task: agent2's PATCH is 403 forbidden and writes no
    revision; the owner needs override_reason (422 without), and with it
    revises the task, audited as an override.

    Mutation caught: routes/tasks.py ``update`` without the
    ``require_editable(...)`` call (agent2's PATCH is 200)."""
    task = await work.task("held work", priority=1)
    await work.claim(task["id"])
    before = await work.snapshot()
    audit_log.events.clear()

    await work.call(
        "PATCH",
        f"/tasks/{task['id']}",
        work.agent2,
        json={"expected_revision": 1, "title": "hijacked", "priority": 99},
        expect=403,
        problem="forbidden",
    )
    missing = await work.call(
        "PATCH",
        f"/tasks/{task['id']}",
        json={"expected_revision": 1, "title": "hijacked"},
        expect=422,
        problem="validation-error",
    )
    assert "override_reason" in missing["errors"]
    row = await work.task_row(task["id"])
    assert (row["revision"], row["title"], row["priority"], row["state"]) == (
        1,
        "held work",
        1,
        "claimed",
    )
    assert len(await work.rows(task_revisions, task_revisions.c.task_id == row["id"])) == 1
    assert await work.snapshot() == before
    assert audit_log.events == []

    revised = await work.call(
        "PATCH",
        f"/tasks/{task['id']}",
        json={"expected_revision": 1, "title": "renamed", "override_reason": "typo"},
        expect=200,
    )
    assert (revised["revision"], revised["title"], revised["state"]) == (2, "renamed", "claimed")
    (event,) = audit_log.of("task.revised", task["id"])
    assert event.admin_override is True
    assert event.details == {"revision": 2, "fields": ["title"], "override_reason": "typo"}
    (attempt,) = await work.attempts_of(task["id"])
    assert attempt["state"] == "active"


async def test_cancelling_a_done_task_is_refused_and_it_stays_done(work, audit_log):
    """The owner cancels a done task: 409 invalid-state; it stays done and
    nothing changes.

    Mutation caught: routes/tasks.py ``cancel`` without the
    ``row["state"] in TERMINAL`` check (the done task becomes canceled)."""
    task = await finished(work, "shipped")
    before = await work.snapshot()
    audit_log.events.clear()

    refused = await work.call(
        "POST",
        f"/tasks/{task['id']}/cancel",
        json={"reason": "changed my mind", "override_reason": "I own it"},
        expect=409,
        problem="invalid-state",
    )
    assert "done" in refused["detail"]
    row = await work.task_row(task["id"])
    assert (row["state"], row["outcome_reason"]) == ("done", None)
    assert await work.snapshot() == before
    assert audit_log.events == []


# -- dependencies -----------------------------------------------------------------


async def test_a_task_waits_for_every_prerequisite(work, audit_log):
    """C depends on A and B: A done leaves C open (its row untouched, not
    ready, not claimable); B done too makes C ready.

    Mutation caught: lifecycle.py ``_RELEASE_DEPENDENTS`` without the
    ``~sa.exists(...)`` undone-prerequisite condition (C is ready after A)."""
    a = await work.task("A")
    b = await work.task("B")
    c = await work.task("C", prerequisites=[a["id"], b["id"]])
    assert c["state"] == "open"
    waiting = await work.task_row(c["id"])

    await hand_in(work, await work.claim(a["id"]))
    assert (await work.task_row(a["id"]))["state"] == "done"
    assert await work.task_row(c["id"]) == waiting
    assert await work.ready_ids() == [b["id"]]
    refused = await work.call(
        "POST", f"/tasks/{c['id']}/claim", json={}, expect=409, problem="task-not-claimable"
    )
    assert refused["state"] == "open"
    taken = await work.call("POST", "/claims", work.agent2, json={}, expect=201)
    assert taken["task"]["id"] == b["id"]

    await hand_in(work, taken)
    row = await work.task_row(c["id"])
    assert (row["state"], row["generation"]) == ("ready", 0)
    assert await work.ready_ids() == [c["id"]]
    assert await work.attempts_of(c["id"]) == []
    assert [e.target_id for e in audit_log.of("task.done")] == [a["id"], b["id"]]


async def test_retrying_a_task_whose_prerequisite_is_not_done_makes_it_open(work, audit_log):
    """A canceled task depending on an unfinished task is retried by the
    owner: it comes back open (not ready, not claimable) and becomes ready
    once the prerequisite is done.

    Mutation caught: lifecycle.py ``reopen`` always setting ``"ready"``."""
    first = await work.task("first")
    later = await work.task("later", prerequisites=[first["id"]])
    await work.call("POST", f"/tasks/{later['id']}/cancel", json={"reason": "paused"}, expect=200)
    assert (await work.task_row(later["id"]))["state"] == "canceled"

    retried = await work.call("POST", f"/tasks/{later['id']}/retry", expect=200)
    assert (retried["state"], retried["attempts_used"], retried["outcome_reason"]) == (
        "open",
        0,
        None,
    )
    (event,) = audit_log.of("task.retried", later["id"])
    assert event.details == {"previous_state": "canceled", "state": "open"}
    assert (await work.task_row(later["id"]))["state"] == "open"
    assert await work.ready_ids() == [first["id"]]
    await work.call(
        "POST", f"/tasks/{later['id']}/claim", json={}, expect=409, problem="task-not-claimable"
    )
    assert await work.attempts_of(later["id"]) == []

    await hand_in(work, await work.claim(first["id"]))
    assert (await work.task_row(later["id"]))["state"] == "ready"
    assert await work.ready_ids() == [later["id"]]


async def test_a_prerequisite_cannot_be_added_to_a_claimed_task(work, audit_log):
    """Adding a prerequisite to a claimed task is 409 invalid-state: no edge,
    the task stays claimed, nothing changes.

    Mutation caught: graph.py ``add_dependency`` without the ``EDITABLE``
    state check (the edge is added: 201)."""
    running = await work.task("running")
    other = await work.task("other")
    await work.claim(running["id"])
    before = await work.snapshot()
    audit_log.events.clear()

    refused = await work.call(
        "POST",
        f"/tasks/{running['id']}/dependencies",
        json={"prerequisite": other["id"]},
        expect=409,
        problem="invalid-state",
    )
    assert "claimed" in refused["detail"]
    assert await work.rows(dependencies) == []
    assert (await work.task_row(running["id"]))["state"] == "claimed"
    assert await work.snapshot() == before
    assert audit_log.events == []
    links = await work.call("GET", f"/tasks/{running['id']}/dependencies", expect=200)
    assert links == {"prerequisites": [], "dependents": []}


# -- holds, reservations, lapses --------------------------------------------------


async def test_a_suspended_project_hold_keeps_its_tasks_out_of_the_queue(work, audit_log):
    """A suspended hold on project main: its tasks leave /ready and
    claim-next answers 200 with no task (writing nothing); a task of another
    project stays claimable; lifting the hold brings main's tasks back.

    Mutation caught: holds.py ``CLAIMABLE`` without the project-hold condition
    (``tasks.c.project_id.not_in(_live_holds_of("project"))``)."""
    high = await work.task("high", priority=10)
    low = await work.task("low", priority=5)
    placed = await work.call(
        "POST",
        "/holds",
        json={"scope": "project", "target": "main", "strength": "suspended", "reason": "freeze"},
        expect=201,
    )
    assert await work.ready_ids() == []
    before = await work.snapshot()
    audit_log.events.clear()

    nothing = await work.call("POST", "/claims", work.agent, json={}, expect=200)
    assert (nothing["task"], nothing["attempt"], nothing["skipped"]) == (None, None, 0)
    assert await work.snapshot() == before
    assert audit_log.events == []
    shown = await work.call("GET", f"/tasks/{high['id']}", expect=200)
    assert (shown["state"], shown["parked"]) == ("ready", True)
    assert [h["id"] for h in shown["held_by"]] == [placed["id"]]

    # Another project is not covered by the hold.
    await work.call("POST", "/projects", json={"name": "side"}, expect=201)
    side = await work.call(
        "POST", "/tasks", json={"project": "side", "title": "side", "priority": 1}, expect=201
    )
    assert await work.ready_ids() == [side["id"]]

    await work.call("POST", f"/holds/{placed['id']}/lift", expect=200)
    assert await work.ready_ids() == [high["id"], low["id"], side["id"]]
    taken = await work.call("POST", "/claims", work.agent, json={}, expect=201)
    assert (taken["task"]["id"], taken["attempt"]["generation"]) == (high["id"], 1)


async def test_a_candidate_skipped_for_its_second_resource_keeps_no_reservation(work, audit_log):
    """A task names two resources and another attempt holds the second:
    claim-next skips it, and the reservation it made of its first resource
    is undone; the next candidate is claimed.

    Mutation caught: claims.py ``_reserve`` without
    ``await ch.tx.execute(UNRESERVE, ...)`` on conflict (a reservation of
    ``path:app/src/`` by an attempt that never existed is left behind)."""
    holder = await work.task("holder", resources=[REPO])
    both = await work.task("both", priority=20, resources=[REPO, "path:app/src/"])
    docs = await work.task("docs", priority=10, resources=["path:app/docs/"])
    holding = await work.claim(holder["id"], work.agent2)
    assert await work.reservations() == [(REPO, holding["attempt"]["id"])]
    skipped_row = await work.task_row(both["id"])

    taken = await work.call("POST", "/claims", work.agent, json={}, expect=201)
    assert (taken["task"]["id"], taken["skipped"]) == (docs["id"], 1)
    assert await work.reservations() == sorted(
        [(REPO, holding["attempt"]["id"]), ("path:app/docs/", taken["attempt"]["id"])]
    )
    assert await work.task_row(both["id"]) == skipped_row
    assert await work.attempts_of(both["id"]) == []
    assert [e.target_id for e in audit_log.of("task.claimed")] == [holder["id"], docs["id"]]

    # Once the holder hands in, the skipped task takes both resources.
    await hand_in(work, holding)
    again = await work.claim(both["id"], work.agent2)
    assert await work.reservations() == sorted(
        [
            (REPO, again["attempt"]["id"]),
            ("path:app/docs/", taken["attempt"]["id"]),
            ("path:app/src/", again["attempt"]["id"]),
        ]
    )


async def test_claim_next_recovers_a_lapsed_task_in_the_same_call(work, clock, audit_log):
    """With the reaper's loop idle, an attempt's lease lapses; the next
    claim-next retires it (expired, charged) and claims its task again:
    generation 2, in one call.

    Mutation caught: claims.py ``claim_next`` without
    ``await retire_lapsed_in_space(ch, limit=20)`` (200 with no task)."""
    task = await work.task("lapsing", max_attempts=3)
    first = await work.claim(task["id"], lease_seconds=30)
    clock.advance(seconds=31)
    assert (await work.task_row(task["id"]))["state"] == "claimed"

    taken = await work.call("POST", "/claims", work.agent2, json={}, expect=201)
    assert (taken["task"]["id"], taken["attempt"]["generation"], taken["skipped"]) == (
        task["id"],
        2,
        0,
    )
    old, new = await work.attempts_of(task["id"])
    assert (old["public_id"], old["state"], old["charged"]) == (
        first["attempt"]["id"],
        "expired",
        1,
    )
    assert (new["public_id"], new["state"], new["claimant_id"]) == (
        taken["attempt"]["id"],
        "active",
        work.agent2.pk,
    )
    row = await work.task_row(task["id"])
    assert (row["state"], row["generation"], row["attempts_used"]) == ("claimed", 2, 1)
    assert row["current_attempt_id"] == new["id"]
    assert [e.target_id for e in audit_log.of("attempt.expired")] == [first["attempt"]["id"]]
    assert len(audit_log.of("task.claimed", task["id"])) == 2


# -- the stage engine ---------------------------------------------------------------


@pytest.mark.parametrize("judges", [[("checkstage", CheckStage()), ("second", SecondJudge())]])
async def test_two_plugins_judging_one_hand_in_fail_it_and_roll_back(work, judges, audit_log):
    """Two plugins return a verdict for the same linked work: the hand-in
    fails (500 internal-error) and rolls back: no submission, the item is
    still claimed by its attempt, the subject still waits, nothing changes.

    Mutation caught: engine.py ``_one_verdict`` without the "more than one
    plugin judged" check (the first verdict is applied: 201)."""
    subject = await work.task("the subject")
    handed = await hand_in(work, await work.claim(subject["id"]))
    [item_id] = handed["work_ids"]
    review = await work.claim(item_id, work.agent2)
    before = await work.snapshot()

    failed = await work.call(
        "POST",
        f"/attempts/{review['attempt']['id']}/submit",
        review["token"],
        json={"generation": 1, "summary": "fine", "candidate": {"decision": "approve"}},
        expect=500,
        problem="internal-error",
    )
    assert "internal error" in failed["detail"]
    assert await work.snapshot() == before
    item = await work.task_row(item_id)
    assert (item["state"], item["current_submission_id"]) == ("claimed", None)
    assert await work.rows(submissions, submissions.c.task_id == item["id"]) == []
    (attempt,) = await work.attempts_of(item_id)
    assert (attempt["public_id"], attempt["state"]) == (review["attempt"]["id"], "active")
    row = await work.task_row(subject["id"])
    assert (row["state"], row["stage"]) == ("waiting", "check")


# -- policies and decisions -------------------------------------------------------


async def test_a_stale_policy_revision_is_refused(work, audit_log):
    """Setting the policy with an expected_revision that is no longer
    current is 409 revision-conflict naming the current one; no policy row
    is added, the project keeps its policy, nothing changes.

    Mutation caught: routes/projects.py ``set_policy`` without the
    ``expected_revision`` check (revision 2 is written)."""
    first = await work.call(
        "POST",
        "/projects/main/policy",
        json={"expected_revision": 0, "approvals_required": 2},
        expect=201,
    )
    assert first["revision"] == 1
    before = await work.snapshot()
    audit_log.events.clear()

    stale = await work.call(
        "POST",
        "/projects/main/policy",
        json={"expected_revision": 0, "approvals_required": 3},
        expect=409,
        problem="revision-conflict",
    )
    assert stale["revision"] == 1
    (policy,) = await work.rows(policies)
    assert (policy["revision"], policy["approvals_required"]) == (1, 2)
    (project,) = await work.rows(projects)
    assert project["policy_id"] == policy["id"]
    assert await work.snapshot() == before
    assert audit_log.events == []
    shown = await work.call("GET", "/projects/main", expect=200)
    assert (shown["policy"]["revision"], shown["policy"]["approvals_required"]) == (1, 2)


async def test_a_decision_with_duplicate_options_is_refused(work, audit_log):
    """Options must be distinct: duplicates are 422 validation-error on
    ``options``; no decision is opened, the task is not parked.

    Mutation caught: routes/decisions.py ``create`` without the
    distinct-options check (the decision is opened: 201)."""
    task = await work.task("ask me")
    before = await work.snapshot()
    audit_log.events.clear()

    refused = await work.call(
        "POST",
        f"/tasks/{task['id']}/decisions",
        work.agent,
        json={"question": "which?", "options": ["ship", "wait", "ship"]},
        expect=422,
        problem="validation-error",
    )
    assert refused["errors"] == {"options": ["Duplicates."]}
    assert await work.rows(decisions) == []
    assert await work.snapshot() == before
    assert audit_log.events == []
    assert await work.ready_ids() == [task["id"]]


async def test_a_decision_about_a_finished_task_is_refused(work, audit_log):
    """Asking a decision about a done task is 409 invalid-state; no decision
    row, nothing changes.

    Mutation caught: routes/decisions.py ``create`` without the
    ``row["state"] in TERMINAL`` check (the decision is opened: 201)."""
    task = await finished(work, "over")
    before = await work.snapshot()
    audit_log.events.clear()

    refused = await work.call(
        "POST",
        f"/tasks/{task['id']}/decisions",
        work.agent,
        json={"question": "redo it?", "options": ["yes", "no"]},
        expect=409,
        problem="invalid-state",
    )
    assert "done" in refused["detail"]
    assert await work.rows(decisions) == []
    assert await work.snapshot() == before
    assert audit_log.events == []


# -- the TaskQueue service -------------------------------------------------------------


async def test_agents_naming_lists_only_current_revisions(work, make_principal, make_space):
    """An agent revised to stop naming ``lint`` is no longer listed for it
    (its first revision still names lint); it is listed for the plugin its
    current revision names; another space's agents are never listed.

    Mutation caught: queue.py ``agents_naming`` without
    ``agents.c.current_revision_id == agent_revisions.c.id`` (coder's
    first revision is still listed for lint)."""
    await other_space(work, make_principal, make_space)  # B's coder names lint
    await work.call("POST", "/agents", json={"name": "coder", "plugins": ["lint"]}, expect=201)
    helper = await work.call(
        "POST", "/agents", json={"name": "helper", "plugins": ["lint"]}, expect=201
    )
    revised = await work.call(
        "POST",
        "/agents/coder/revisions",
        json={"instructions": "format only", "plugins": ["format"], "expected_revision": 1},
        expect=201,
    )
    queue = work.app.services.get(TaskQueue)
    async with work.app.db.read() as conn:
        lint = await queue.agents_naming(conn, work.space.id, "lint")
        fmt = await queue.agents_naming(conn, work.space.id, "format")
        nobody = await queue.agents_naming(conn, work.space.id, "shady")

    assert [(r.agent_name, r.number, r.id) for r in lint] == [
        ("helper", 1, helper["revision"]["id"])
    ]
    assert {r.space_id for r in lint} == {work.space.id}
    assert [(r.agent_name, r.number, r.id, r.plugins) for r in fmt] == [
        ("coder", 2, revised["revision"]["id"], ("format",))
    ]
    assert nobody == []
    # The first revision is kept: it names lint, it is just not current.
    coder = next(
        a
        for a in await work.rows(agents)
        if a["name"] == "coder" and a["space_id"] == work.space.pk
    )
    numbers = await work.rows(agent_revisions, agent_revisions.c.agent_id == coder["id"])
    assert sorted((r["number"], r["plugins"]) for r in numbers) == [
        (1, '["lint"]'),
        (2, '["format"]'),
    ]
