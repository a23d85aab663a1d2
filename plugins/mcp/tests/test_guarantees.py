"""Through MCP, the guarantees of the HTTP API: role and scope per call,
fencing, idempotent retries, spaces kept apart (a sweep over every tool),
problems as tool errors, nothing changed by a refused call."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from buildmax_artifacts.tables import artifacts
from buildmax_audit.tables import events as audit_events
from buildmax_lessons.tables import TABLES as LESSON_TABLES
from buildmax_reviews.tables import TABLES as REVIEW_TABLES
from buildmax_tasks.tables import TABLES as TASK_TABLES
from buildmax_tasks.tables import attempts, submissions

from .conftest import Team, add_member, http_session, make_team


async def snapshot(team: Team) -> dict[str, list[str]]:
    """Every row of the tasks, reviews and artifacts tables and the audit
    trail: what a refused call must leave as it was."""
    found = {}
    async with team.app.db.read() as conn:
        for table in [*TASK_TABLES, *REVIEW_TABLES, *LESSON_TABLES, artifacts, audit_events]:
            rows = await conn.fetch_all(sa.select(table))
            found[table.name] = sorted(repr(sorted(dict(r).items())) for r in rows)
    return found


async def test_a_viewer_cannot_claim_and_nothing_is_claimed(team: Team) -> None:
    await team.task("ready")
    before = await snapshot(team)
    async with http_session(team.base_url, team.viewer.token) as viewer:
        ready = await viewer.ok("list_ready", space=team.space.slug)
        assert len(ready["items"]) == 1  # a viewer reads
        problem = await viewer.refused("claim_next", "forbidden", space=team.space.slug)
        await viewer.refused(
            "claim_task", "forbidden", space=team.space.slug, task=ready["items"][0]["id"]
        )
    assert problem["status"] == 403
    assert await snapshot(team) == before


async def test_an_attempt_token_acts_on_its_own_attempt_only(team: Team) -> None:
    """Connected with a claim's run token: it renews its own attempt; another
    attempt is refused (not-attempt-owner), and so is a claim (the route
    takes no attempt-scoped token)."""
    space = team.space.slug
    await team.task("mine")
    await team.task("theirs")
    async with http_session(team.base_url, team.author.token) as author:
        mine = await author.ok("claim_next", space=space)
    async with http_session(team.base_url, team.reviewer.token) as other:
        theirs = await other.ok("claim_next", space=space)
    async with http_session(team.base_url, mine["token"]) as run:
        renewed = await run.ok("renew", space=space, attempt=mine["attempt"]["id"], generation=1)
        assert renewed["id"] == mine["attempt"]["id"]
        before = await snapshot(team)
        await run.refused(
            "renew", "not-attempt-owner", space=space, attempt=theirs["attempt"]["id"], generation=1
        )
        await run.refused(
            "submit",
            "not-attempt-owner",
            space=space,
            attempt=theirs["attempt"]["id"],
            generation=1,
            summary="not mine",
        )
        await run.refused("claim_next", "token-scope-refused", space=space)
        assert await snapshot(team) == before


async def test_a_stale_generation_is_refused(team: Team) -> None:
    """The author releases its claim and claims the task again (generation
    2): reports carrying generation 1 are refused and change nothing."""
    space = team.space.slug
    task = await team.task("contended")
    async with http_session(team.base_url, team.author.token) as author:
        first = await author.ok("claim_task", space=space, task=task["id"])
        await author.ok("release", space=space, attempt=first["attempt"]["id"], generation=1)
        second = await author.ok("claim_task", space=space, task=task["id"])
        assert second["attempt"]["generation"] == 2
        before = await snapshot(team)
        for tool, extra in (
            ("renew", {}),
            ("checkpoint", {"data": 1}),
            ("submit", {"summary": "late"}),
        ):
            await author.refused(
                tool,
                "stale-generation",
                space=space,
                attempt=second["attempt"]["id"],
                generation=1,
                **extra,
            )
        await author.refused(
            "submit",
            "attempt-ended",
            space=space,
            attempt=first["attempt"]["id"],
            generation=1,
            summary="late",
        )
        assert await snapshot(team) == before


async def test_a_retried_submit_with_the_same_key_makes_one_submission(team: Team) -> None:
    space = team.space.slug
    task = await team.task("once")
    async with http_session(team.base_url, team.author.token) as author:
        claim = await author.ok("claim_task", space=space, task=task["id"])
        arguments = {
            "space": space,
            "attempt": claim["attempt"]["id"],
            "generation": 1,
            "summary": "done once",
            "idempotency_key": "submit-once",
        }
        first = await author.ok("submit", **arguments)
        again = await author.ok("submit", **arguments)
        other = await author.refused(
            "submit", "idempotency-key-reused", **{**arguments, "summary": "else"}
        )
    assert again == first
    assert other["status"] == 422
    assert len(await team.rows(submissions, submissions.c.summary == "done once")) == 1
    handed = await team.rows(
        audit_events,
        audit_events.c.action == "attempt.submitted",
        audit_events.c.target_id == claim["attempt"]["id"],
    )
    assert len(handed) == 1


# -- spaces kept apart --------------------------------------------------------------


async def _everything_in(team: Team) -> dict[str, Any]:
    """One of every record the tools name, in ``team``'s space: a task, an
    attempt, a submission, review work with a finding, an artifact, a
    lesson and a decision. Returns the argument values that name them (a decision is
    named by no tool's path: it is listed)."""
    task = await team.task("theirs")
    claim = await team.api("POST", f"/tasks/{task['id']}/claim", team.author, json={}, expect=201)
    attempt = claim["attempt"]
    artifact = await team.api(
        "POST",
        f"/artifacts?name=x.txt&attempt={attempt['id']}&generation=1",
        team.author,
        data=b"theirs",
        content_type="text/plain",
        expect=201,
    )
    handed = await team.api(
        "POST",
        f"/attempts/{attempt['id']}/submit",
        team.author,
        json={"generation": 1, "summary": "theirs", "artifacts": [artifact["id"]]},
        expect=201,
    )
    (work,) = handed["work_ids"]
    await team.api("POST", f"/tasks/{work}/claim", team.reviewer, json={}, expect=201)
    await team.api(
        "POST",
        f"/reviews/{work}",
        team.reviewer,
        json={
            "decision": "request_changes",
            "summary": "fix it",
            "findings": [{"severity": "major", "text": "broken"}],
        },
        expect=201,
    )
    finding = (await team.api("GET", "/findings", team.viewer, expect=200))["items"][0]
    other = await team.task("asked about")
    await team.api(
        "POST",
        f"/tasks/{other['id']}/decisions",
        team.author,
        json={"question": "which?", "options": ["a", "b"]},
        expect=201,
    )
    lesson = await team.api(
        "POST",
        "/lessons",
        team.author,
        json={"kind": "gotcha", "title": "theirs", "text": "theirs"},
        expect=201,
    )
    return {
        "lesson": lesson["id"],
        "task": task["id"],
        "attempt": attempt["id"],
        "submission": handed["submission"]["id"],
        "ident": work,
        "finding": finding["id"],
        "artifact": artifact["id"],
    }


#: Values for every other argument a tool may require.
FILLERS: dict[str, Any] = {
    "generation": 1,
    "summary": "x",
    "decision": "approve",
    "question": "q?",
    "options": ["a", "b"],
    "data": {"k": 1},
    "name": "n.txt",
    "content": "hi",
    "reason": "r",
    "resolution": "done",
    "kind": "gotcha",
    "title": "t",
    "text": "x",
    "vote": "helpful",
}


async def test_a_member_of_one_space_sees_nothing_of_another_through_any_tool(
    team: Team, make_principal: Any, make_space: Any
) -> None:
    """Every tool, called by a member of the team's space with the other
    space named, or with the team's space and the other space's ids, is
    refused (404 or 403), and the other space is left as it was."""
    others = await make_team(team.app, team.client, team.base_url, make_principal, make_space)
    names = await _everything_in(others)
    before = await snapshot(others)
    async with http_session(team.base_url, team.author.token) as tools:
        listed = (await tools.client.list_tools()).tools
        assert len(listed) > 20
        for tool in listed:
            properties = tool.input_schema["properties"]
            values = {**FILLERS, **names}
            arguments = {k: v for k, v in values.items() if k in properties}
            for space in (others.space.slug, team.space.slug):
                if space == team.space.slug and not set(names) & set(arguments):
                    continue  # nothing of the other space to name
                problem = await tools.refused(tool.name, None, **arguments, space=space)
                assert problem["slug"] in {"not-found", "forbidden", "not-attempt-owner"}, (
                    tool.name,
                    space,
                    problem,
                    arguments,
                )
                assert problem["status"] in {403, 404}
                assert "theirs" not in str(problem)
    assert await snapshot(others) == before


# -- problems as tool errors ------------------------------------------------------------


async def test_invalid_arguments_are_tool_errors_naming_the_field(team: Team) -> None:
    space = team.space.slug
    task = await team.task("t")
    before = await snapshot(team)
    async with http_session(team.base_url, team.author.token) as tools:
        unknown = await tools.refused(
            "claim_next", "invalid-tool-arguments", space=space, colour="red"
        )
        assert "colour" in unknown["detail"] and "kind" in unknown["detail"]
        missing = await tools.refused("show_task", "invalid-tool-arguments", space=space)
        assert missing["argument"] == "task"
        wrong = await tools.refused("claim_next", "validation-error", space=space, kind="poetry")
        assert "kind" in wrong["errors"]
        # A value is one path segment: it reaches no other route, adds no query.
        for smuggled in ("../../v1/audit", f"{task['id']}/dependencies", "..", "."):
            await tools.refused("show_task", "invalid-tool-arguments", space=space, task=smuggled)
        await tools.refused("show_task", "invalid-tool-arguments", space=f"{space}/..", task="x")
        for odd in (f"{task['id']}?x=1", f"{task['id']}#x", f"{task['id']}%2Fdependencies"):
            await tools.refused("show_task", "not-found", space=space, task=odd)
        await tools.refused(
            "show_task", "invalid-tool-arguments", space=space, task={"id": task["id"]}
        )
        await tools.refused("no_such_tool", "unknown-tool", space=space)
        # Values that become headers: refused as the network's would be, not a 500.
        for key in ("", "a b", "k\r\nX-Evil: 1", "é"):
            await tools.refused("claim_next", "bad-request", space=space, idempotency_key=key)
        for media in ("text/plain\r\nX-Evil: 1", "☃/x"):
            problem = await tools.refused(
                "upload_artifact", None, space=space, name="n", content="x", media_type=media
            )
            assert problem["status"] in (400, 415), problem
    assert await snapshot(team) == before


async def test_an_upload_through_a_tool_within_its_limit(team: Team) -> None:
    """Text and base64 upload and link to the attempt; too large is refused
    with the HTTP upload to make instead; not base64 is refused; none of
    the refused ones stores anything."""
    space = team.space.slug
    task = await team.task("with a file")
    async with http_session(team.base_url, team.author.token) as tools:
        claim = await tools.ok("claim_task", space=space, task=task["id"])
        attempt = claim["attempt"]["id"]
        text = await tools.ok(
            "upload_artifact",
            space=space,
            name="a.md",
            content="héllo",
            attempt=attempt,
            generation=1,
        )
        assert (text["size"], text["media_type"]) == (6, "text/plain")
        binary = await tools.ok(
            "upload_artifact",
            space=space,
            name="b.bin",
            content_base64="AAEC\n/w==\n",  # wrapped, as the base64 command writes it
            media_type="application/x-thing",
        )
        assert (binary["size"], binary["media_type"]) == (4, "application/x-thing")
        before = await snapshot(team)
        large = await tools.refused(
            "upload_artifact",
            "tool-upload-too-large",
            space=space,
            name="big",
            content="x" * (600 * 1024),
        )
        assert large["path"] == f"/v1/spaces/{space}/artifacts"
        assert large["query"] == {"name": "big"}
        assert "Idempotency-Key" in large["detail"]
        await tools.refused(
            "upload_artifact", "invalid-tool-arguments", space=space, name="n", content_base64="%%%"
        )
        await tools.refused(
            "upload_artifact",
            "invalid-tool-arguments",
            space=space,
            name="n",
            content="a",
            content_base64="YQ==",
        )
        assert await snapshot(team) == before
    stored = await team.rows(artifacts, artifacts.c.name == "a.md")
    assert len(stored) == 1


async def test_the_endpoint_needs_a_valid_token(team: Team) -> None:
    """Without a token, or with a revoked or made-up one, /mcp answers 401
    (problem+json, WWW-Authenticate) before any MCP message is read."""
    message = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    for headers in ({}, {"Authorization": "Bearer bm_not_a_real_token"}):
        answer = await team.client.post(
            "/mcp",
            json=message,
            headers={**headers, "Accept": "application/json, text/event-stream"},
        )
        assert answer.status_code == 401
        assert answer.headers["Content-Type"] == "application/problem+json"
        assert answer.headers["WWW-Authenticate"].startswith("Bearer")


async def test_two_spaces_two_teams_one_agent_in_both(
    team: Team, make_principal: Any, make_space: Any
) -> None:
    """An agent that is a member of two spaces works in each through one
    session: the space is an argument of every call, not of the session."""
    others = await make_team(team.app, team.client, team.base_url, make_principal, make_space)
    await add_member(team.app, others.space, team.author, "member")
    await team.task("here")
    await others.task("there")
    async with http_session(team.base_url, team.author.token) as tools:
        here = await tools.ok("claim_next", space=team.space.slug)
        there = await tools.ok("claim_next", space=others.space.slug)
    assert (here["task"]["title"], there["task"]["title"]) == ("here", "there")
    rows = await team.rows(attempts)
    assert len(rows) == 2


async def test_no_server_stream_and_no_session_id(team: Team) -> None:
    """The endpoint is stateless: GET /mcp (a server-to-client stream) is
    405 naming POST, and an answer carries no Mcp-Session-Id."""
    auth = {"Authorization": f"Bearer {team.author.token}"}
    stream = await team.client.get("/mcp", headers={**auth, "Accept": "text/event-stream"})
    assert stream.status_code == 405
    assert "POST" in stream.headers["Allow"]
    listed = await team.client.post(
        "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
        headers={
            **auth,
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-06-18",
        },
    )
    assert listed.status_code == 200, await listed.get_data()
    assert "Mcp-Session-Id" not in listed.headers
    body = await listed.get_json()
    assert len(body["result"]["tools"]) > 20, body


async def test_a_removed_member_s_tokens_act_through_no_tool(team: Team) -> None:
    """The claimant leaves the space with its attempt live: its own token
    and its run token are refused by every tool about the space or the
    attempt (not-found), as the routes refuse them over HTTP."""
    from buildmax.tables import space_members

    space = team.space.slug
    task = await team.task("left behind")
    async with http_session(team.base_url, team.author.token) as author:
        claim = await author.ok("claim_task", space=space, task=task["id"])
    async with team.app.db.write() as tx:
        await tx.execute(
            sa.delete(space_members).where(
                space_members.c.space_id == team.space.pk,
                space_members.c.principal_id == team.author.pk,
            )
        )
    attempt = claim["attempt"]["id"]
    for token in (team.author.token, claim["token"]):
        async with http_session(team.base_url, token) as tools:
            for tool, arguments in (
                ("show_task", {"task": task["id"]}),
                ("show_attempt", {"attempt": attempt}),
                ("renew", {"attempt": attempt, "generation": 1}),
                ("submit", {"attempt": attempt, "generation": 1, "summary": "x"}),
                (
                    "upload_artifact",
                    {"name": "n", "content": "x", "attempt": attempt, "generation": 1},
                ),
            ):
                await tools.refused(tool, "not-found", space=space, **arguments)


async def test_a_post_that_is_not_json_rpc_is_a_problem(team: Team) -> None:
    """The transport's refusals are answered as every refusal of this server
    is (problem+json); a JSON-RPC error stays a JSON-RPC error."""
    auth = {"Authorization": f"Bearer {team.author.token}"}
    plain = await team.client.post(
        "/mcp", data=b"hello", headers={**auth, "Content-Type": "text/plain"}
    )
    assert plain.status_code == 400
    assert plain.headers["Content-Type"] == "application/problem+json"
    assert (await plain.get_json())["type"] == "urn:buildmax:problem:bad-request"
    unacceptable = await team.client.post(
        "/mcp",
        json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
        headers={**auth, "Accept": "text/plain", "MCP-Protocol-Version": "2025-06-18"},
    )
    assert unacceptable.status_code == 406
    assert unacceptable.headers["Content-Type"].startswith("application/json")
    assert "error" in await unacceptable.get_json()
