"""``buildmax mcp stdio`` when the server is not what the client hoped: a
refused token at start or mid-session, a server gone mid-session. Each is
an answer that says why, promptly; the bridge itself carries on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa
from mcp.shared.exceptions import MCPError

from buildmax.tables import tokens
from buildmax.testing import serving

from .conftest import Team, run_bridge, stdio_session


async def test_a_refused_token_at_start_says_so(live_server: str, tmp_path: Any) -> None:
    done = await asyncio.to_thread(run_bridge, live_server, tmp_path, BUILDMAX_TOKEN="bm_nope")
    assert done.returncode == 1
    assert done.stdout == ""
    assert f"error: {live_server}/mcp answered 401 unauthenticated:" in done.stderr
    assert "check BUILDMAX_TOKEN" in done.stderr
    assert "bm_nope" not in done.stderr


async def test_a_token_revoked_mid_session_is_a_tool_error_naming_the_401(team: Team) -> None:
    task = await team.task("t")
    async with stdio_session(team.base_url, team.author.token) as tools:
        await tools.ok("show_task", space=team.space.slug, task=task["id"])
        async with team.app.db.write() as tx:
            await tx.execute(
                sa.update(tokens)
                .where(tokens.c.principal_id == team.author.pk)
                .values(revoked_at=1)
            )
        result = await asyncio.wait_for(
            tools.client.call_tool("show_task", {"space": team.space.slug, "task": task["id"]}),
            timeout=60,
        )
    assert result.is_error
    text = result.content[0].text  # type: ignore[union-attr]
    assert text.startswith("buildmax-unreachable: show_task was not answered:")
    assert "answered 401 unauthenticated" in text


async def test_a_server_gone_mid_session_is_a_prompt_tool_error(
    app: Any, make_principal: Any, make_space: Any
) -> None:
    """The server stops after the session began: the next call is a tool
    error saying the server cannot be reached (not a wait without end), and
    the bridge still answers the client."""
    agent = await make_principal("agent")
    space = await make_space(agent)
    server = serving(app)
    base = await server.__aenter__()
    running = True
    try:
        async with stdio_session(base, agent.token) as tools:
            await tools.ok("list_ready", space=space.slug)
            await server.__aexit__(None, None, None)
            running = False
            result = await asyncio.wait_for(
                tools.client.call_tool("list_ready", {"space": space.slug}), timeout=60
            )
            assert result.is_error
            text = result.content[0].text  # type: ignore[union-attr]
            assert "buildmax-unreachable: list_ready was not answered:" in text
            assert "cannot be reached" in text
            with pytest.raises(MCPError, match="cannot be reached"):
                await asyncio.wait_for(tools.client.list_prompts(), timeout=60)
    finally:
        if running:
            await server.__aexit__(None, None, None)
