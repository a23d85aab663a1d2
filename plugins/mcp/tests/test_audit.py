"""A loop through MCP leaves the audit events the same loop leaves over
HTTP: equal but for the request ids, which through MCP are
``mcp/<the /mcp request's id>``."""

from __future__ import annotations

import json
import re
from typing import Any

from buildmax_audit.tables import events as audit_events

from .conftest import Team, http_session, make_team

_PUBLIC_ID = re.compile(r"\b[a-z]{2,3}_[A-Za-z0-9_-]{16,}\b")
_COMPARED = ("action", "actor_kind", "acting_through", "target_type", "target_id", "details")


async def _loop_over_http(team: Team) -> None:
    task = await team.task("the same work")
    claim = await team.api("POST", "/claims", team.author, json={"kind": "code"}, expect=201)
    attempt = claim["attempt"]["id"]
    await team.api(
        "POST", f"/attempts/{attempt}/renew", team.author, json={"generation": 1}, expect=200
    )
    await team.api(
        "POST",
        f"/attempts/{attempt}/checkpoint",
        team.author,
        json={"generation": 1, "data": {"n": 1}},
        expect=201,
    )
    await team.api(
        "POST",
        f"/attempts/{attempt}/submit",
        team.author,
        json={"generation": 1, "summary": "done", "candidate": {"commit": "abc"}},
        key="k-1",
        expect=201,
    )
    assert task["id"] == claim["task"]["id"]


async def _loop_over_mcp(team: Team) -> None:
    space = team.space.slug
    await team.task("the same work")
    async with http_session(team.base_url, team.author.token) as tools:
        claim = await tools.ok("claim_next", space=space, kind="code")
        attempt = claim["attempt"]["id"]
        await tools.ok("renew", space=space, attempt=attempt, generation=1)
        await tools.ok("checkpoint", space=space, attempt=attempt, generation=1, data={"n": 1})
        await tools.ok(
            "submit",
            space=space,
            attempt=attempt,
            generation=1,
            summary="done",
            candidate={"commit": "abc"},
            idempotency_key="k-1",
        )


def _normalised(rows: list[dict[str, Any]], team: Team) -> list[dict[str, Any]]:
    """The compared fields of each event, public ids replaced by their order
    of first appearance and the principals by their role in the team."""
    names: dict[str, str] = {
        team.author.id: "<author>",
        team.owner.id: "<owner>",
        team.space.id: "<space>",
    }

    def name(found: re.Match[str]) -> str:
        return names.setdefault(found.group(0), f"<id{len(names)}>")

    out = []
    for row in rows:
        event = {key: row[key] for key in _COMPARED}
        event["actor"] = names.get(row["actor_id"], row["actor_id"])
        text = _PUBLIC_ID.sub(name, json.dumps(event, sort_keys=True))
        out.append(json.loads(text))
    return out


async def _events(team: Team) -> list[dict[str, Any]]:
    rows = await team.rows(audit_events, audit_events.c.space_id == team.space.id)
    return sorted(rows, key=lambda r: r["id"])


async def test_a_loop_through_mcp_leaves_the_audit_events_of_the_loop_over_http(
    app: Any, client: Any, live_server: str, make_principal: Any, make_space: Any
) -> None:
    over_http = await make_team(app, client, live_server, make_principal, make_space)
    over_mcp = await make_team(app, client, live_server, make_principal, make_space)
    setup = {team.space.id: len(await _events(team)) for team in (over_http, over_mcp)}
    await _loop_over_http(over_http)
    await _loop_over_mcp(over_mcp)

    http_events = (await _events(over_http))[setup[over_http.space.id] :]
    mcp_events = (await _events(over_mcp))[setup[over_mcp.space.id] :]
    assert [e["action"] for e in mcp_events] == [e["action"] for e in http_events]
    assert {"task.claimed", "attempt.submitted"} <= {e["action"] for e in mcp_events}
    assert _normalised(mcp_events, over_mcp) == _normalised(http_events, over_http)
    # The owner's task creation came over HTTP in both; the agent's steps
    # carry the mark only through MCP.
    agent_http = [e for e in http_events if e["actor_id"] == over_http.author.id]
    agent_mcp = [e for e in mcp_events if e["actor_id"] == over_mcp.author.id]
    assert agent_http and all(e["request_id"].startswith("rq_") for e in agent_http)
    assert agent_mcp and all(e["request_id"].startswith("mcp/rq_") for e in agent_mcp)
    # Each tool call is a request of its own, as each HTTP request is.
    assert len({e["request_id"] for e in agent_mcp}) == len({e["request_id"] for e in agent_http})


async def test_a_client_cannot_forge_the_mcp_mark(team: Team) -> None:
    """An X-Request-Id holding a "/" is not taken from the network: only a
    call through MCP is recorded as one."""
    task = await team.task("t")
    answer = await team.client.post(
        f"/v1/spaces/{team.space.slug}/tasks/{task['id']}/claim",
        json={},
        headers={"Authorization": f"Bearer {team.author.token}", "X-Request-Id": "mcp/rq_forged"},
    )
    assert answer.status_code == 201
    assert answer.headers["X-Request-Id"].startswith("rq_")
    (claimed,) = await team.rows(
        audit_events,
        audit_events.c.action == "task.claimed",
        audit_events.c.space_id == team.space.id,
    )
    assert claimed["request_id"] == answer.headers["X-Request-Id"]


async def test_a_tool_call_s_request_id_is_marked_from_its_mcp_request_s(team: Team) -> None:
    """The /mcp answer keeps its own request id (the call made inside it
    has an app context, and so a request id, of its own); the call's is
    ``mcp/`` + that id, as its problem document says."""
    answer = await team.client.post(
        "/mcp",
        json={
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {
                "name": "show_task",
                "arguments": {"space": team.space.slug, "task": "ta_none"},
            },
        },
        headers={
            "Authorization": f"Bearer {team.author.token}",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-06-18",
            "X-Request-Id": "outer-1",
        },
    )
    assert answer.status_code == 200
    assert answer.headers["X-Request-Id"] == "outer-1"
    result = (await answer.get_json())["result"]
    assert result["isError"] is True
    assert result["structuredContent"]["slug"] == "not-found"
    assert result["structuredContent"]["request_id"] == "mcp/outer-1"
