"""Review stage: J07 end to end, request changes, several approvals,
independence, human review and stale criteria, over HTTP on the engine
under test."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from buildmax_reviews import workflow
from buildmax_reviews.tables import activities, findings, integrations, reviews
from buildmax_tasks.tables import attempts, submissions, tasks

from buildmax.tables import tokens

TARGET = "repo:https://git.test/app.git@main"


async def test_j07_implement_review_integrate_done_and_the_dependent_ready(flow):
    """A claims and submits; A cannot take the review (403 naming why); B
    approves; C integrates; the subject is done, its dependent ready, and
    the audit trail holds each step exactly once."""
    subject = await flow.task("the subject")
    dependent = await flow.task("the dependent", prerequisites=[subject["id"]])
    assert dependent["state"] == "open"

    claim = await flow.claim(subject["id"], flow.author)
    handed = await flow.submit(claim)
    assert (handed["task"]["state"], handed["stage"]) == ("waiting", "review")
    (review_task,) = handed["work_ids"]

    refused = await flow.claim(review_task, flow.author, expect=403, problem="claim-vetoed")
    assert "handed in the work under review" in refused["detail"]
    nothing = await flow.call("POST", "/claims", flow.author, json={}, expect=200)
    assert nothing["task"] is None

    review_claim = await flow.claim(review_task, flow.reviewer)
    recorded = await flow.review(
        review_task, review_claim["token"], "approve", summary="reads well"
    )
    assert recorded["review"]["decision"] == "approve"
    assert recorded["review"]["human"] is False
    assert recorded["review"]["reviewer_id"] == flow.reviewer.id
    assert recorded["task_state"] == "done"

    shown = await flow.state(subject["id"])
    assert (shown["state"], shown["stage"]) == ("waiting", "integrate")
    integration_row = [r for r in await flow.linked(subject["id"]) if r["stage"] == "integrate"]
    (integration,) = integration_row
    assert (integration["kind"], integration["resources"]) == ("integration", f'["{TARGET}"]')

    integrate_claim = await flow.claim(integration["public_id"], flow.integrator)
    assert await flow.reservations() == [(TARGET, integrate_claim["attempt"]["id"])]
    done = await flow.submit(integrate_claim, outcome="merged", before="abc123", after="def456")
    assert done["task"]["state"] == "done"
    assert (await flow.state(subject["id"]))["state"] == "done"
    assert await flow.reservations() == []
    ready = await flow.call("GET", "/ready", flow.viewer, expect=200)
    assert dependent["id"] in [t["id"] for t in ready["items"]]

    (review_row,) = await flow.rows(reviews)
    assert (review_row["reviewer_id"], review_row["reviewer_kind"], review_row["decision"]) == (
        flow.reviewer.id,
        "agent",
        "approve",
    )
    (merged,) = await flow.rows(integrations)
    assert (merged["outcome"], merged["before_ref"], merged["after_ref"], merged["target"]) == (
        "merged",
        "abc123",
        "def456",
        TARGET,
    )
    shown_integration = await flow.call(
        "GET", f"/reviews/{merged['public_id']}", flow.viewer, expect=200
    )
    assert shown_integration["integration"]["outcome"] == "merged"

    once = {
        "task.claimed": [subject["id"], review_task, integration["public_id"]],
        "task.stage_entered": [subject["id"], subject["id"]],
        "review.recorded": [review_row["public_id"]],
        "integration.recorded": [merged["public_id"]],
        "task.done": [review_task, integration["public_id"], subject["id"]],
    }
    for action, targets in once.items():
        found = [e["target_id"] for e in await flow.audited(action)]
        assert Counter(found) == Counter(targets), action
    stages = [e["details"] for e in await flow.audited("task.stage_entered")]
    assert ['"stage":"review"' in d for d in stages].count(True) == 1
    assert ['"stage":"integrate"' in d for d in stages].count(True) == 1


async def test_request_changes_reopens_the_subject_and_a_resubmission_gets_new_reviews(flow):
    subject, handed = await flow.implemented()
    (first_review,) = handed["work_ids"]
    first_submission = handed["submission"]["id"]
    claim = await flow.claim(first_review, flow.reviewer)

    # A request for changes without a finding is refused and changes nothing.
    before = await flow.snapshot()
    bad = await flow.review(
        first_review, claim["token"], "request_changes", expect=422, problem="invalid-review"
    )
    assert "findings" in bad["errors"]
    assert await flow.snapshot() == before

    finding = {"severity": "major", "text": "the loop never ends", "path": "src/app.py", "line": 12}
    recorded = await flow.review(
        first_review, claim["token"], "request_changes", summary="not yet", findings=[finding]
    )
    (finding_out,) = recorded["findings"]
    assert finding_out["text"] == "the loop never ends" and finding_out["resolved"] is False

    reopened = await flow.state(subject["id"])
    assert (reopened["state"], reopened["stage"]) == ("ready", None)
    assert reopened["finding_ids"] == [finding_out["id"]]
    listed = await flow.call("GET", f"/findings?subject={subject['id']}", flow.author, expect=200)
    assert [(f["id"], f["line"]) for f in listed["items"]] == [(finding_out["id"], 12)]

    # The next attempt sees the findings, hands in again: new review work.
    again = await flow.claim(subject["id"], flow.author)
    assert again["task"]["finding_ids"] == [finding_out["id"]]
    second = await flow.submit(again)
    (second_review,) = second["work_ids"]
    assert second_review != first_review
    assert second["submission"]["id"] != first_submission

    old = await flow.call("GET", f"/reviews/{first_review}", flow.viewer, expect=200)
    assert (old["submission_id"], old["review"]["decision"]) == (
        first_submission,
        "request_changes",
    )
    new = await flow.call("GET", f"/reviews/{second_review}", flow.viewer, expect=200)
    assert (new["submission_id"], new["review"]) == (second["submission"]["id"], None)

    resolved = await flow.call(
        "POST",
        f"/findings/{finding_out['id']}/resolve",
        flow.author,
        json={"resolution": "bounded the loop"},
        expect=200,
    )
    assert resolved["resolved"] is True and resolved["resolved_by"] == flow.author.id
    again_resolved = await flow.call(
        "POST",
        f"/findings/{finding_out['id']}/resolve",
        flow.reviewer,
        json={"resolution": "later"},
        expect=200,
    )
    assert again_resolved["resolution"] == "bounded the loop"
    assert len(await flow.audited("finding.resolved", finding_out["id"])) == 1
    open_now = await flow.call("GET", "/findings?state=open", flow.viewer, expect=200)
    assert open_now["items"] == []


async def test_reject_fails_the_subject_with_the_reason(flow):
    subject, handed = await flow.implemented()
    (review_task,) = handed["work_ids"]
    claim = await flow.claim(review_task, flow.reviewer)
    await flow.review(review_task, claim["token"], "reject", expect=422)
    await flow.review(review_task, claim["token"], "reject", summary="wrong approach entirely")
    failed = await flow.state(subject["id"])
    assert failed["state"] == "failed"
    assert failed["outcome_reason"] == "wrong approach entirely"


async def test_two_approvals_need_two_different_reviewers(flow):
    await flow.policy(approvals_required=2)
    subject, handed = await flow.implemented()
    first, second = handed["work_ids"]

    await flow.claim(first, flow.reviewer)
    refused = await flow.claim(second, flow.reviewer, expect=403, problem="claim-vetoed")
    assert "already holds review slot 1" in refused["detail"]

    await flow.review(first, flow.reviewer, "approve")
    assert (await flow.state(subject["id"]))["stage"] == "review"
    # Having handed in slot 1, the reviewer still may not take slot 2.
    await flow.claim(second, flow.reviewer, expect=403, problem="claim-vetoed")

    await flow.claim(second, flow.reviewer2)
    await flow.review(second, flow.reviewer2, "approve")
    assert (await flow.state(subject["id"]))["stage"] == "integrate"
    assert len(await flow.rows(reviews)) == 2


async def test_independence_is_checked_again_when_the_review_is_recorded(flow, monkeypatch):
    """With the claim-time check out of the way, one principal holding both
    slots is refused when recording either review, until it lets one go."""
    await flow.policy(approvals_required=2)
    subject, handed = await flow.implemented()
    first, second = handed["work_ids"]

    async def no_opinion(app, tx, task, principal):
        return None

    monkeypatch.setattr(workflow, "claim_check", no_opinion)
    await flow.claim(first, flow.reviewer)
    held = await flow.claim(second, flow.reviewer)
    before = await flow.snapshot()
    refused = await flow.review(
        first, flow.reviewer, "approve", expect=403, problem="reviewer-not-independent"
    )
    assert "slot 2" in refused["detail"]
    assert await flow.snapshot() == before

    await flow.call(
        "POST",
        f"/attempts/{held['attempt']['id']}/release",
        held["token"],
        json={"generation": held["attempt"]["generation"], "reason": "one slot is enough"},
        expect=200,
    )
    await flow.review(first, flow.reviewer, "approve")
    assert (await flow.state(subject["id"]))["stage"] == "review"
    await flow.claim(second, flow.reviewer2)
    await flow.review(second, flow.reviewer2, "approve")
    assert (await flow.state(subject["id"]))["stage"] == "integrate"


async def test_the_author_cannot_record_a_review_even_holding_the_slot(flow, monkeypatch):
    _subject, handed = await flow.implemented()
    (review_task,) = handed["work_ids"]

    async def no_opinion(app, tx, task, principal):
        return None

    monkeypatch.setattr(workflow, "claim_check", no_opinion)
    await flow.claim(review_task, flow.author)
    await flow.review(
        review_task, flow.author, "approve", expect=403, problem="reviewer-not-independent"
    )
    assert await flow.rows(reviews) == []


async def test_concurrent_submits_of_the_subject_create_one_set_of_review_tasks(flow):
    await flow.policy(approvals_required=2)
    subject = await flow.task("raced")
    claim = await flow.claim(subject["id"], flow.author)
    answers = await asyncio.gather(*(flow.submit(claim, expect=None) for _ in range(6)))
    assert sum("submission" in a for a in answers) == 1, answers
    assert {a["status"] for a in answers if "submission" not in a} == {409}, answers
    linked = await flow.linked(subject["id"])
    assert sorted(r["slot"] for r in linked) == [0, 1]
    assert len(await flow.rows(activities)) == 2
    assert len(await flow.rows(submissions)) == 1


async def test_a_human_slot_is_for_humans_and_the_stage_waits_for_a_human(flow):
    await flow.policy(approvals_required=2, human_review_required=True)
    subject, handed = await flow.implemented()
    human_slot, agent_slot = handed["work_ids"]
    items = {i["task_id"]: i for i in (await flow.call("GET", "/reviews", expect=200))["items"]}
    assert items[human_slot]["human_only"] is True and items[agent_slot]["human_only"] is False

    refused = await flow.claim(human_slot, flow.reviewer, expect=403, problem="claim-vetoed")
    assert "human" in refused["detail"]
    # An agent cannot record on the unheld human slot either.
    await flow.review(human_slot, flow.reviewer, "approve", expect=409)

    claim = await flow.claim(agent_slot, flow.reviewer)
    before = await flow.snapshot()
    await flow.review(
        agent_slot,
        claim["token"],
        "approve",
        human=True,
        expect=403,
        problem="human-review-refused",
    )
    assert await flow.snapshot() == before
    await flow.review(agent_slot, claim["token"], "approve")
    assert (await flow.state(subject["id"]))["stage"] == "review"

    # The human reviews the unheld slot in one request: no lease, no token left.
    recorded = await flow.review(human_slot, flow.human, "approve", summary="checked by hand")
    assert recorded["review"]["human"] is True
    assert (await flow.state(subject["id"]))["stage"] == "integrate"
    human_task = (await flow.rows(tasks, tasks.c.public_id == human_slot))[0]
    (attempt,) = await flow.rows(attempts, attempts.c.task_id == human_task["id"])
    assert attempt["state"] == "submitted"
    (token,) = await flow.rows(tokens, tokens.c.scope_id == attempt["public_id"])
    assert token["revoked_at"] is not None
    (event,) = await flow.audited("review.recorded", recorded["review"]["id"])
    assert '"human":true' in event["details"] and event["actor_id"] == flow.human.id


async def test_edited_criteria_make_pending_reviews_stale(flow):
    subject, handed = await flow.implemented(criteria="tests pass")
    (review_task,) = handed["work_ids"]
    listed = await flow.call("GET", f"/reviews?subject={subject['id']}", expect=200)
    assert [i["stale"] for i in listed["items"]] == [False]

    await flow.call(
        "PATCH",
        f"/tasks/{subject['id']}",
        json={"expected_revision": 1, "criteria": "tests pass and docs updated"},
        expect=200,
    )
    listed = await flow.call("GET", f"/reviews?subject={subject['id']}&pending=true", expect=200)
    assert [(i["task_id"], i["stale"]) for i in listed["items"]] == [(review_task, True)]

    claim = await flow.claim(review_task, flow.reviewer)
    refused = await flow.review(
        review_task, claim["token"], "approve", expect=409, problem="review-stale"
    )
    assert refused["revision"] == 2 and refused["submitted_against"] == 1
    await flow.review(
        review_task,
        claim["token"],
        "request_changes",
        findings=[{"severity": "minor", "text": "docs are now required"}],
    )
    assert (await flow.state(subject["id"]))["state"] == "ready"


async def test_an_override_cannot_record_a_review_for_its_reviewer(flow):
    _subject, handed = await flow.implemented()
    (review_task,) = handed["work_ids"]
    claim = await flow.claim(review_task, flow.reviewer)
    attempt = claim["attempt"]
    refused = await flow.call(
        "POST",
        f"/attempts/{attempt['id']}/submit",
        flow.owner,
        json={
            "generation": attempt["generation"],
            "summary": "approved for them",
            "candidate": {"decision": "approve"},
            "override_reason": "in a hurry",
        },
        expect=403,
        problem="human-review-refused",
    )
    assert "override" in refused["detail"]
    assert await flow.rows(reviews) == []


@pytest.mark.parametrize(
    "candidate, field",
    [
        ({}, "decision"),
        ({"decision": "maybe"}, "decision"),
        ({"decision": "approve", "findings": [{"severity": "huge", "text": "x"}]}, "findings"),
        (
            {"decision": "approve", "findings": [{"severity": "note", "text": "x", "line": 3}]},
            "findings",
        ),
        ({"decision": "approve", "extra": 1}, "extra"),
    ],
)
async def test_a_malformed_review_handed_in_is_refused_and_changes_nothing(flow, candidate, field):
    _subject, handed = await flow.implemented()
    (review_task,) = handed["work_ids"]
    claim = await flow.claim(review_task, flow.reviewer)
    before = await flow.snapshot()
    bad = await flow.submit(claim, expect=422, **candidate)
    assert bad["type"].endswith("invalid-review") and field in bad["errors"], bad
    assert await flow.snapshot() == before
    assert await flow.rows(findings) == []


async def test_an_agent_must_claim_before_recording_a_review(flow):
    """Only a human claims and hands in at once: an agent's review on an
    unheld work item is refused, and no attempt is left behind."""
    _, handed = await flow.implemented()
    (review_task,) = handed["work_ids"]
    before = await flow.snapshot()
    refused = await flow.review(
        review_task, flow.reviewer, "approve", expect=409, problem="task-not-claimable"
    )
    assert "claim the task" in refused["detail"]
    assert await flow.snapshot() == before
    # Nor may another member record on a work item the reviewer holds.
    await flow.claim(review_task, flow.reviewer)
    await flow.review(
        review_task, flow.reviewer2, "approve", expect=403, problem="not-attempt-owner"
    )
    await flow.review(review_task, flow.viewer, "approve", expect=403)
