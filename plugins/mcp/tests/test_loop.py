"""J07 through MCP with the official SDK's client: an author implements and
submits, an independent reviewer approves, an integrator merges, each with
an agent token of its own; over streamable HTTP and through
``buildmax mcp stdio``."""

from __future__ import annotations

from typing import Any

import pytest
from buildmax_audit.tables import events as audit_events
from buildmax_tasks.tables import submissions

from .conftest import Team, http_session, stdio_session


async def run_j07(team: Team, open_session: Any) -> dict[str, Any]:
    """The whole loop through tools; returns the ids it made."""
    space = team.space.slug
    subject = await team.task("the subject")
    dependent = await team.task("the dependent", prerequisites=[subject["id"]])

    async with open_session(team.author.token) as author:
        ready = await author.ok("list_ready", space=space, kind="code")
        assert [t["id"] for t in ready["items"]] == [subject["id"]]
        shown = await author.ok("show_task", space=space, task=subject["id"])
        assert shown["title"] == "the subject"
        claim = await author.ok("claim_next", space=space, kind="code")
        attempt = claim["attempt"]
        assert (claim["task"]["id"], attempt["generation"]) == (subject["id"], 1)
        await author.ok(
            "renew", space=space, attempt=attempt["id"], generation=attempt["generation"]
        )
        await author.ok(
            "checkpoint",
            space=space,
            attempt=attempt["id"],
            generation=attempt["generation"],
            data={"step": "tests pass"},
        )
        note = await author.ok(
            "upload_artifact",
            space=space,
            name="notes.md",
            content="# what changed\n",
            attempt=attempt["id"],
            generation=attempt["generation"],
            idempotency_key="notes-1",
        )
        handed = await author.ok(
            "submit",
            space=space,
            attempt=attempt["id"],
            generation=attempt["generation"],
            summary="implemented",
            candidate={"commit": "3f2a9c1", "branch": "t-1"},
            artifacts=[note["id"]],
            idempotency_key="submit-1",
        )
        assert (handed["task"]["state"], handed["stage"]) == ("waiting", "review")
        (review_work,) = handed["work_ids"]
        # The author cannot review its own work, by any tool.
        await author.refused("claim_task", "claim-vetoed", space=space, task=review_work)
        nothing = await author.ok("claim_review", space=space)
        assert nothing["task"] is None

    async with open_session(team.reviewer.token) as reviewer:
        pending = await reviewer.ok("list_reviews", space=space, kind="review", pending="true")
        assert [item["task_id"] for item in pending["items"]] == [review_work]
        review_claim = await reviewer.ok("claim_review", space=space)
        assert review_claim["task"]["id"] == review_work
        work = await reviewer.ok(
            "show_submission", space=space, submission=review_claim["task"]["submission_id"]
        )
        assert work["summary"] == "implemented"
        recorded = await reviewer.ok(
            "record_review",
            space=space,
            ident=review_work,
            decision="approve",
            summary="reads well",
            findings=[{"severity": "minor", "text": "a typo", "path": "notes.md", "line": 1}],
            generation=review_claim["attempt"]["generation"],
        )
        assert recorded["review"]["decision"] == "approve"

    async with open_session(team.author.token) as author:
        found = await author.ok("list_findings", space=space, subject=subject["id"])
        assert [f["text"] for f in found["items"]] == ["a typo"]

    async with open_session(team.integrator.token) as integrator:
        integration = await integrator.ok("claim_integration", space=space)
        assert integration["task"]["subject_task_id"] == subject["id"]
        merged = await integrator.ok(
            "submit",
            space=space,
            attempt=integration["attempt"]["id"],
            generation=integration["attempt"]["generation"],
            summary="merged",
            candidate={"outcome": "merged", "before": "3f2a9c1", "after": "8d0e4b7"},
        )
        assert merged["task"]["state"] == "done"
        after = await integrator.ok("show_task", space=space, task=subject["id"])
        assert after["state"] == "done"
        ready = await integrator.ok("list_ready", space=space)
        assert dependent["id"] in [t["id"] for t in ready["items"]]
    return {"subject": subject["id"], "attempt": attempt["id"]}


@pytest.mark.parametrize("transport", ["streamable-http", "streamable-http-legacy", "stdio"])
async def test_j07_through_mcp(team: Team, transport: str) -> None:
    """The loop completes; one submission was made; every audit event of
    it came through MCP (request id ``mcp/...``), attributed to the agent
    that called the tool. Over HTTP in the newest protocol version and in
    the handshake era's; through the stdio bridge."""

    def open_session(token: str) -> Any:
        if transport == "stdio":
            return stdio_session(team.base_url, token)
        return http_session(team.base_url, token, "legacy" if "legacy" in transport else "auto")

    made = await run_j07(team, open_session)
    handed_in = await team.rows(submissions, submissions.c.summary == "implemented")
    assert len(handed_in) == 1
    events = await team.rows(audit_events, audit_events.c.space_id == team.space.id)
    through_tools = [e for e in events if e["actor_id"] != team.owner.id]
    assert through_tools, "no audit event came from the agents"
    assert all(str(e["request_id"]).startswith("mcp/rq_") for e in through_tools), [
        (e["action"], e["request_id"]) for e in through_tools
    ]
    claimed = [e for e in through_tools if e["action"] == "task.claimed"]
    assert {e["actor_id"] for e in claimed} == {
        team.author.id,
        team.reviewer.id,
        team.integrator.id,
    }
    assert made["attempt"] in {e["target_id"] for e in events}
