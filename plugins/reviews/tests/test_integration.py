"""Integrate stage: serialised per target through reservations, concurrent
across targets, freed by a lapsed lease, gated by a human decision when the
policy says so; a failed integration keeps dependents blocked."""

from __future__ import annotations

import asyncio

from buildmax_reviews.tables import activities, integrations

REPO = "https://git.test/app.git"
TARGET = f"repo:{REPO}@main"
LEASE_SECONDS = 600


async def approved(flow, title: str = "the subject", **fields) -> tuple[dict, str]:
    """A task implemented and approved: (subject, its integration work item id)."""
    subject, handed = await flow.implemented(title, **fields)
    (review_task,) = handed["work_ids"]
    await flow.claim(review_task, flow.reviewer)
    await flow.review(review_task, flow.reviewer, "approve")
    (item,) = [r for r in await flow.linked(subject["id"]) if r["stage"] == "integrate"]
    return subject, item["public_id"]


async def test_two_integrations_into_one_target_are_serialised(flow):
    """Released together, two integrators of two approved tasks with the
    same repository+branch: one holds the target, the other gets 409 naming
    the holder. The reservation ends with the attempt."""
    _, first = await approved(flow, "first")
    _, second = await approved(flow, "second")
    answers = await asyncio.gather(
        flow.claim(first, flow.integrator, expect=None),
        flow.claim(second, flow.reviewer2, expect=None),
    )
    won = [a for a in answers if a.get("attempt")]
    lost = [a for a in answers if a.get("status") == 409]
    assert len(won) == 1 and len(lost) == 1, answers
    assert lost[0]["type"].endswith("resource-reserved")
    assert lost[0]["resource"] == TARGET
    assert lost[0]["holder"]["attempt_id"] == won[0]["attempt"]["id"]
    assert await flow.reservations() == [(TARGET, won[0]["attempt"]["id"])]

    await flow.submit(won[0], outcome="merged", before="a1", after="b2")
    assert await flow.reservations() == []
    loser = second if won[0]["task"]["id"] == first else first
    who = flow.reviewer2 if loser == second else flow.integrator
    again = await flow.claim(loser, who)
    await flow.submit(again, outcome="merged", before="b2", after="c3")
    assert len(await flow.rows(integrations)) == 2


async def test_different_targets_integrate_concurrently(flow):
    await flow.call(
        "POST",
        "/projects",
        json={"name": "other", "repository_url": "https://git.test/other.git"},
        expect=201,
    )
    await flow.call("POST", "/projects", json={"name": "local"}, expect=201)
    _, here = await approved(flow, "here")
    flow.project = "other"
    _, there = await approved(flow, "there")
    flow.project = "local"
    local_subject, local = await approved(flow, "no repository")
    a = await flow.claim(here, flow.integrator)
    b = await flow.claim(there, flow.reviewer2)
    c = await flow.claim(local, flow.human)
    project = await flow.call("GET", "/projects/local", expect=200)
    assert await flow.reservations() == sorted(
        [
            (TARGET, a["attempt"]["id"]),
            ("repo:https://git.test/other.git", b["attempt"]["id"]),
            (f"project:{project['id']}", c["attempt"]["id"]),
        ]
    )
    targets = sorted(r["target"] for r in await flow.rows(activities) if r["target"])
    assert targets == sorted(r for r, _ in await flow.reservations())
    assert local_subject["id"]


async def test_a_lapsed_integration_lease_frees_the_target(flow, clock):
    _, first = await approved(flow, "first")
    _, second = await approved(flow, "second")
    stuck = await flow.claim(first, flow.integrator)
    await flow.claim(second, flow.reviewer2, expect=409, problem="resource-reserved")
    clock.advance(seconds=LEASE_SECONDS + 1)
    took = await flow.claim(second, flow.reviewer2)
    assert await flow.reservations() == [(TARGET, took["attempt"]["id"])]
    # Its attempt ended (and with it the claim's token): the owner is told so.
    attempt = stuck["attempt"]
    late = await flow.call(
        "POST",
        f"/attempts/{attempt['id']}/submit",
        flow.integrator,
        json={
            "generation": attempt["generation"],
            "summary": "too late",
            "candidate": {"outcome": "merged", "before": "a", "after": "b"},
        },
        expect=409,
    )
    assert late["type"].endswith("attempt-ended")
    assert await flow.rows(integrations) == []


async def test_without_automatic_integration_a_human_decides_first(flow):
    await flow.policy(approvals_required=1, integration="human")
    subject, item = await approved(flow)
    (activity,) = [r for r in await flow.rows(activities) if r["kind"] == "integration"]
    assert activity["decision_id"]

    parked = await flow.claim(item, flow.integrator, expect=409, problem="task-parked")
    assert activity["decision_id"] in parked["decisions"]
    ready = await flow.call("GET", "/ready", flow.viewer, expect=200)
    assert item not in [t["id"] for t in ready["items"]]
    await flow.call(
        "POST",
        f"/decisions/{activity['decision_id']}/answer",
        flow.integrator,
        json={"answer": "integrate"},
        expect=403,
    )
    await flow.call(
        "POST",
        f"/decisions/{activity['decision_id']}/answer",
        flow.human,
        json={"answer": "integrate", "comment": "go ahead"},
        expect=200,
    )
    claim = await flow.claim(item, flow.integrator)
    await flow.submit(claim, outcome="merged", before="a", after="b")
    assert (await flow.state(subject["id"]))["state"] == "done"


async def test_a_failed_integration_reopens_the_subject_and_keeps_dependents_blocked(flow):
    subject, item = await approved(flow)
    dependent = await flow.task("after it", prerequisites=[subject["id"]])
    claim = await flow.claim(item, flow.integrator)
    bad = await flow.submit(claim, expect=422, outcome="failed")
    assert "reason" in bad["errors"]
    await flow.submit(claim, outcome="failed", reason="merge conflict in app.py")
    reopened = await flow.state(subject["id"])
    assert reopened["state"] == "ready"
    assert "merge conflict in app.py" in reopened["outcome_reason"]
    assert (await flow.state(dependent["id"]))["state"] == "open"
    (failed,) = await flow.rows(integrations)
    assert (failed["outcome"], failed["reason"]) == ("failed", "merge conflict in app.py")
    ready = await flow.call("GET", "/ready", flow.viewer, expect=200)
    assert dependent["id"] not in [t["id"] for t in ready["items"]]


async def test_a_merge_names_both_refs(flow):
    _, item = await approved(flow)
    claim = await flow.claim(item, flow.integrator)
    before = await flow.snapshot()
    bad = await flow.submit(claim, expect=422, outcome="merged", before="a")
    assert bad["type"].endswith("invalid-review") and "after" in bad["errors"]
    bad = await flow.submit(claim, expect=422, outcome="merged", before="a b", after="c")
    assert "before" in bad["errors"]
    assert await flow.snapshot() == before
