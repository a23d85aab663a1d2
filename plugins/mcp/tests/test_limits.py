"""The bounds of ``/mcp``: tool calls in flight per token (a
too-many-requests tool error past ``max_calls_per_token``), one call's
time (``call_timeout_seconds``), the upload limit (``max_upload_bytes``),
and a bad ``[plugins.mcp]`` table."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from buildmax_hookspecs import AgentTool, hookimpl
from quart import Blueprint, Response

from buildmax.apidoc import api
from buildmax.app import create_app
from buildmax.config import ConfigError
from buildmax.testing import serving

from .conftest import http_session

probe = Blueprint("mcp_limits_probe", __name__)
#: The event that lets the slow probe answer (a new one per test: per loop).
RELEASE: list[asyncio.Event] = []
#: How many slow probes are running now.
RUNNING = [0]


@probe.get("/v1/mcp-limits-probe")
@api("Answer when released (a probe of slow work)")
async def slow_probe() -> Response:
    RUNNING[0] += 1
    try:
        await RELEASE[-1].wait()
    finally:
        RUNNING[0] -= 1
    return Response('{"done": true}', content_type="application/json")


class SlowTool:
    @hookimpl
    def buildmax_blueprints(self, app: Any) -> list[Any]:
        return [probe]

    @hookimpl
    def buildmax_agent_tools(self) -> list[AgentTool]:
        return [
            AgentTool(
                name="slow_probe",
                description="Answers when the test releases it: a probe of slow work.",
                method="GET",
                path="/v1/mcp-limits-probe",
            )
        ]


@asynccontextmanager
async def served(settings: Any, **mcp: int) -> AsyncIterator[tuple[Any, str]]:
    app = create_app(
        settings.replace(plugins={"mcp": mcp}),
        auto_migrate=True,
        extra_plugins=[("slow", SlowTool())],
    )
    async with app.test_app(), serving(app) as base:
        yield app, base


async def test_calls_in_flight_past_the_limit_are_refused(
    buildmax_settings: Any, make_principal: Any
) -> None:
    """With one call allowed per token, a second call while the first runs
    is a too-many-requests tool error; another token is not held up; once
    the first ends, the token calls again."""
    RELEASE.append(asyncio.Event())
    async with served(buildmax_settings, max_calls_per_token=1) as (app, base):
        one = await _principal(app)
        other = await _principal(app)
        async with http_session(base, one) as tools, http_session(base, other) as others:
            first = asyncio.create_task(tools.ok("slow_probe"))
            await asyncio.sleep(0.3)
            refused = await tools.refused("slow_probe", "too-many-requests")
            assert (refused["status"], refused["retry_after"]) == (429, 1)
            second_token = asyncio.create_task(others.ok("slow_probe"))
            await asyncio.sleep(0.1)
            RELEASE[-1].set()
            assert await first == {"done": True}
            assert await second_token == {"done": True}
            assert await tools.ok("slow_probe") == {"done": True}
            assert app.extensions["mcp.server"].in_flight == {}


async def test_a_call_past_its_time_is_a_tool_error(buildmax_settings: Any) -> None:
    RELEASE.append(asyncio.Event())
    async with served(buildmax_settings, call_timeout_seconds=1) as (app, base):
        token = await _principal(app)
        async with http_session(base, token) as tools:
            for _ in range(3):
                problem = await tools.refused("slow_probe", "tool-call-timeout")
                assert "idempotency_key" in problem["detail"]
                # The route's work ended with the call: nothing runs on.
                assert RUNNING[0] == 0
            assert app.extensions["mcp.server"].in_flight == {}
    RELEASE[-1].set()


async def test_a_client_that_goes_away_ends_its_call_s_work(buildmax_settings: Any) -> None:
    """A client gives up on a /mcp request: the tool's route request is
    cancelled with it, and the token's count of calls in flight is back
    to 0 (no call keeps running past its client)."""
    import httpx

    RELEASE.append(asyncio.Event())
    async with served(buildmax_settings) as (app, base):
        token = await _principal(app)
        message = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "slow_probe", "arguments": {}},
        }
        headers = {
            "Authorization": f"Bearer {token}",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2025-06-18",
        }
        async with httpx.AsyncClient(timeout=0.5) as http:
            with pytest.raises(httpx.ReadTimeout):
                await http.post(f"{base}/mcp", json=message, headers=headers)
        for _ in range(100):  # the server notices the disconnect
            if RUNNING[0] == 0 and not app.extensions["mcp.server"].in_flight:
                break
            await asyncio.sleep(0.05)
        assert RUNNING[0] == 0
        assert app.extensions["mcp.server"].in_flight == {}
    RELEASE[-1].set()


async def test_the_upload_limit_is_a_setting(buildmax_settings: Any) -> None:
    async with served(buildmax_settings, max_upload_bytes=10) as (app, base):
        token = await _principal(app)
        async with http_session(base, token) as tools:
            problem = await tools.refused(
                "upload_artifact", "tool-upload-too-large", space="s", name="n", content="x" * 11
            )
    assert problem["limit"] == 10


@pytest.mark.engine_independent
@pytest.mark.parametrize(
    "table",
    [{"max_calls_per_token": 0}, {"call_timeout_seconds": "30"}, {"sessions": 5}],
)
def test_a_bad_plugins_mcp_table_stops_the_app(buildmax_settings: Any, table: Any) -> None:
    with pytest.raises(ConfigError, match=r"\[plugins\.mcp\]"):
        create_app(buildmax_settings.replace(plugins={"mcp": table}))


async def _principal(app: Any) -> str:
    return (await _agent(app))[1]


async def _agent(app: Any) -> tuple[int, str]:
    """A new agent principal: its key and a token."""
    from buildmax.principals import create_principal
    from buildmax.tokens import issue_token

    async with app.db.write() as tx:
        now = app.clock.now_ms()
        row = await create_principal(
            tx, kind="agent", name=f"a{now}{id(tx)}", system_role=None, now=now
        )
        issued = await issue_token(tx, principal_pk=row["id"], now=now, name="test")
    return row["id"], issued.secret


async def test_a_slow_call_holds_up_no_other_call(buildmax_settings: Any) -> None:
    """/mcp only relays: while one token's call waits, another token's claim
    through MCP (a write, admitted on its own) completes. Were /mcp itself
    admitted as a write on SQLite, the claim would wait for the slow call."""
    RELEASE.append(asyncio.Event())
    async with served(buildmax_settings) as (app, base):
        slow_token = await _principal(app)
        owner_token, space = await _space_with_a_task(app)
        async with http_session(base, slow_token) as slow, http_session(base, owner_token) as owner:
            waiting = asyncio.create_task(slow.ok("slow_probe"))
            await asyncio.sleep(0.2)
            claimed = await asyncio.wait_for(owner.ok("claim_next", space=space), timeout=20)
            assert claimed["task"] is not None
            assert not waiting.done()
            RELEASE[-1].set()
            assert await waiting == {"done": True}


async def _space_with_a_task(app: Any) -> tuple[str, str]:
    """An owner's token and a space (slug) with one ready task."""
    from buildmax.spaces import create_space
    from buildmax.testing import call

    pk, token = await _agent(app)
    async with app.db.write() as tx:
        await create_space(
            tx, slug="relay", name="relay", owner_pk=pk, created_by=pk, now=app.clock.now_ms()
        )
    client = app.test_client()
    project = await call(
        client, "POST", "/v1/spaces/relay/projects", token, json={"name": "p"}, expect=201
    )
    await call(
        client,
        "POST",
        "/v1/spaces/relay/tasks",
        token,
        json={"project": project["id"], "title": "t"},
        expect=201,
    )
    return token, "relay"
