"""Races, roles and edges of the review stage: one principal one slot under
concurrent claims, a human's one-request review racing a request for
changes, who may record and resolve, what is pending and what is stale."""

from __future__ import annotations

import asyncio
import contextlib

from buildmax_reviews import workflow
from buildmax_reviews.tables import findings, reviews

from .conftest import add_member


async def test_concurrent_claims_of_two_slots_by_one_reviewer_make_one_owner(flow, monkeypatch):
    """Both claims are held at a barrier after their independence check: the
    claims of one subject's work items are serialised, so the second sees
    the first's attempt and is refused.

    Mutation check: without the subject lock in ``claim_named`` both claims
    succeed on PostgreSQL."""
    await flow.policy(approvals_required=2)
    _, handed = await flow.implemented()
    first, second = handed["work_ids"]
    barrier = asyncio.Barrier(2)
    checked = workflow.not_independent

    async def meeting(tx, queue, task, principal_id):
        reason = await checked(tx, queue, task, principal_id)
        with contextlib.suppress(TimeoutError, asyncio.BrokenBarrierError):
            await asyncio.wait_for(barrier.wait(), 1.0)
        return reason

    monkeypatch.setattr(workflow, "not_independent", meeting)
    answers = await asyncio.gather(
        flow.claim(first, flow.reviewer, expect=None),
        flow.claim(second, flow.reviewer, expect=None),
    )
    won = [a for a in answers if a.get("attempt")]
    assert len(won) == 1, answers
    (lost,) = [a for a in answers if not a.get("attempt")]
    assert lost["status"] == 403 and lost["type"].endswith("claim-vetoed")


async def test_concurrent_claim_next_by_one_reviewer_takes_one_slot(flow, monkeypatch):
    """The same race through claim-next: a candidate whose subject another
    claim holds is skipped rather than waited for.

    Mutation check: without the subject's try-lock in ``claim_next`` the
    reviewer gets both slots on PostgreSQL."""
    await flow.policy(approvals_required=2)
    _, handed = await flow.implemented()
    barrier = asyncio.Barrier(2)
    checked = workflow.not_independent

    async def meeting(tx, queue, task, principal_id):
        reason = await checked(tx, queue, task, principal_id)
        with contextlib.suppress(TimeoutError, asyncio.BrokenBarrierError):
            await asyncio.wait_for(barrier.wait(), 1.0)
        return reason

    monkeypatch.setattr(workflow, "not_independent", meeting)
    answers = await asyncio.gather(
        *(flow.call("POST", "/claims", flow.reviewer, json={}) for _ in range(2))
    )
    taken = [a["task"]["id"] for a in answers if a.get("task")]
    assert len(taken) == 1 and taken[0] in handed["work_ids"], answers


async def test_a_humans_one_request_review_racing_a_request_for_changes(flow):
    """The one-request claim locks the subject before its work item, like
    every other hand-in: no deadlock, no 500, and the subject ends ready."""
    await flow.policy(approvals_required=2)
    for round_ in range(3):
        subject, handed = await flow.implemented(f"round {round_}")
        first, second = handed["work_ids"]
        held = await flow.claim(second, flow.reviewer2)
        answers = await asyncio.gather(
            flow.review(first, flow.human, "approve", expect=None),
            flow.review(
                second,
                held["token"],
                "request_changes",
                findings=[{"severity": "major", "text": "no"}],
                expect=None,
            ),
        )
        assert all(a.get("status", 201) < 500 for a in answers), answers
        assert (await flow.state(subject["id"]))["state"] == "ready"


async def test_viewers_neither_record_nor_resolve(flow, make_principal):
    human_viewer = await make_principal("human", name="human-viewer")
    await add_member(flow.app, flow.space, human_viewer, "viewer")
    subject, handed = await flow.implemented()
    (review_task,) = handed["work_ids"]
    before = await flow.snapshot()
    await flow.review(review_task, human_viewer, "approve", expect=403)
    assert await flow.snapshot() == before

    claim = await flow.claim(review_task, flow.reviewer)
    recorded = await flow.review(
        review_task,
        claim["token"],
        "request_changes",
        findings=[{"severity": "minor", "text": "rename it"}],
    )
    (finding,) = recorded["findings"]
    path = f"/findings/{finding['id']}/resolve"
    await flow.call("POST", path, human_viewer, json={}, expect=403)

    # An attempt's token resolves the findings of its own task only.
    other = await flow.task("unrelated")
    unrelated = await flow.claim(other["id"], flow.integrator)
    await flow.call("POST", path, unrelated["token"], json={}, expect=403)
    again = await flow.claim(subject["id"], flow.author)
    done = await flow.call("POST", path, again["token"], json={"resolution": "renamed"}, expect=200)
    assert done["resolved_by"] == flow.author.id
    assert [f["resolved_at"] is not None for f in await flow.rows(findings)] == [True]


async def test_other_spaces_and_other_kinds_of_work_are_not_found(flow, make_space):
    subject, handed = await flow.implemented()
    (review_task,) = handed["work_ids"]
    elsewhere = await make_space(flow.owner)
    for who in (flow.owner, flow.reviewer):
        path = f"/v1/spaces/{elsewhere.id}/reviews/{review_task}"
        await flow.call("GET", path, flow.owner, expect=404)
        await flow.call("POST", path, who, json={"decision": "approve"}, expect=404)
    listed = await flow.call("GET", f"/v1/spaces/{elsewhere.id}/reviews", flow.owner, expect=200)
    assert listed["items"] == []

    claim = await flow.claim(review_task, flow.reviewer)
    await flow.review(review_task, claim["token"], "approve")
    (integration,) = [r for r in await flow.linked(subject["id"]) if r["stage"] == "integrate"]
    await flow.review(integration["public_id"], flow.human, "approve", expect=404)
    assert len(await flow.rows(reviews)) == 1


async def test_approvals_of_an_earlier_submission_do_not_count(flow):
    await flow.policy(approvals_required=2)
    subject, handed = await flow.implemented()
    first, second = handed["work_ids"]
    await flow.claim(first, flow.reviewer)
    await flow.review(first, flow.reviewer, "approve")
    await flow.claim(second, flow.reviewer2)
    await flow.review(
        second, flow.reviewer2, "request_changes", findings=[{"severity": "major", "text": "x"}]
    )
    again = await flow.claim(subject["id"], flow.author)
    resubmitted = await flow.submit(again)
    new_first, _ = resubmitted["work_ids"]
    await flow.claim(new_first, flow.reviewer)
    await flow.review(new_first, flow.reviewer, "approve")
    shown = await flow.state(subject["id"])
    assert (shown["state"], shown["stage"]) == ("waiting", "review")


async def test_pending_and_stale_leave_out_canceled_work_and_title_edits(flow):
    await flow.policy(approvals_required=2)
    subject, handed = await flow.implemented(criteria="tests pass")
    first, second = handed["work_ids"]
    await flow.call(
        "PATCH",
        f"/tasks/{subject['id']}",
        json={"expected_revision": 1, "title": "a clearer title", "priority": 5},
        expect=200,
    )
    listed = await flow.call("GET", "/reviews?pending=true", expect=200)
    assert sorted((i["task_id"], i["stale"]) for i in listed["items"]) == sorted(
        [(first, False), (second, False)]
    )
    await flow.claim(first, flow.reviewer)
    await flow.review(first, flow.reviewer, "approve")  # a title edit is not stale

    await flow.call(
        "PATCH",
        f"/tasks/{subject['id']}",
        json={"expected_revision": 2, "criteria": "tests pass, docs updated"},
        expect=200,
    )
    listed = await flow.call("GET", "/reviews?pending=true", expect=200)
    assert [(i["task_id"], i["stale"]) for i in listed["items"]] == [(second, True)]
    await flow.claim(second, flow.reviewer2)
    await flow.review(
        second, flow.reviewer2, "request_changes", findings=[{"severity": "minor", "text": "docs"}]
    )
    assert (await flow.call("GET", "/reviews?pending=true", expect=200))["items"] == []
