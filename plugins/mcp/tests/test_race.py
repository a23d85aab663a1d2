"""50 MCP client sessions race ``claim_next`` on 10 ready tasks: 10 owners,
each task claimed once, the other 40 told there is nothing to claim; in
the test's server, and on PostgreSQL across two server processes (the
endpoint keeps no session, so either process serves any request)."""

from __future__ import annotations

import asyncio
from collections import Counter
from contextlib import AsyncExitStack
from typing import Any

import pytest
from buildmax_tasks.tables import attempts, tasks

from buildmax.config import Config
from buildmax.testing.processes import start_server

from .conftest import Team, add_member, http_session

AGENTS, READY = 50, 10


async def _race(team: Team, make_principal: Any, urls: list[str]) -> list[dict[str, Any]]:
    """Connect 50 agents' sessions (spread over ``urls``), then release
    their claim_next calls together; returns each answer."""
    for n in range(READY):
        await team.task(f"ready {n}")
    agents = []
    for _ in range(AGENTS):
        agent = await make_principal("agent")
        await add_member(team.app, team.space, agent, "member")
        agents.append(agent)
    go = asyncio.Event()
    async with AsyncExitStack() as stack:
        sessions = [
            await stack.enter_async_context(http_session(urls[n % len(urls)], agent.token))
            for n, agent in enumerate(agents)
        ]

        async def claim(tools: Any) -> dict[str, Any]:
            await go.wait()
            answer: dict[str, Any] = await tools.ok("claim_next", space=team.space.slug)
            return answer

        racing = [asyncio.create_task(claim(tools)) for tools in sessions]
        await asyncio.sleep(0.1)
        go.set()
        answers = await asyncio.gather(*racing)
    return [{**answer, "agent": agent.id} for answer, agent in zip(answers, agents, strict=True)]


async def _check(team: Team, answers: list[dict[str, Any]]) -> None:
    won = [a for a in answers if a["task"] is not None]
    assert Counter(a["task"] is None for a in answers) == {True: AGENTS - READY, False: READY}
    assert len({a["task"]["id"] for a in won}) == READY
    assert len({a["agent"] for a in won}) == READY
    assert {a["attempt"]["generation"] for a in won} == {1}
    rows = await team.rows(attempts)
    assert len(rows) == READY
    assert len({r["task_id"] for r in rows}) == READY
    claimed = await team.rows(tasks, tasks.c.state == "claimed")
    assert len(claimed) == READY


async def test_50_sessions_race_claim_next_on_10_tasks(team: Team, make_principal: Any) -> None:
    answers = await _race(team, make_principal, [team.base_url])
    await _check(team, answers)


@pytest.fixture
def two_servers(app: Any, buildmax_database_url: str, tmp_path: Any) -> Any:
    """Two ``buildmax serve`` processes on the test's PostgreSQL database."""
    settings = Config(data_dir=str(tmp_path / "srv"), database_url=buildmax_database_url)
    pool = {"BUILDMAX_PG_POOL_MAX": "5"}  # the PostgreSQL server is shared with the run
    first = start_server(settings, tmp_path / "a.log", extra_env=pool)
    second = None
    try:
        second = start_server(settings, tmp_path / "b.log", extra_env=pool)
        yield first, second
    finally:
        first.stop()
        if second is not None:
            second.stop()


@pytest.mark.postgres_only
async def test_50_sessions_over_two_server_processes_race_claim_next_on_10_tasks(
    team: Team, make_principal: Any, two_servers: Any
) -> None:
    a, b = two_servers
    answers = await _race(team, make_principal, [a.url, b.url])
    await _check(team, answers)
    # Both processes served claims (each logs its requests).
    assert "POST /mcp 200" in a.log() and "POST /mcp 200" in b.log()
