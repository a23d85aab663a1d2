"""Fixtures of the MCP plugin's tests: a served app, a team in a space (a
human owner, author, reviewer and integrator agents, a viewer), and MCP
sessions of the official SDK's client, over streamable HTTP or through the
stdio bridge, for any token."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
import pytest
import sqlalchemy as sa
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from buildmax.spaces import put_member
from buildmax.testing import PrincipalHandle, SpaceHandle, call

REPO = "https://git.test/app.git"


class Tools:
    """An MCP session: call a tool, expecting an answer or a problem."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def ok(self, tool: str, /, **arguments: Any) -> dict[str, Any]:
        """The structured answer of a call that must succeed."""
        result = await self.client.call_tool(tool, arguments)
        text = result.content[0].text if result.content else ""  # type: ignore[union-attr]
        assert not result.is_error, f"{tool}: {text}"
        assert result.structured_content is not None, f"{tool} answered no object: {text}"
        return result.structured_content

    async def refused(
        self, tool: str, slug: str | None = None, /, **arguments: Any
    ) -> dict[str, Any]:
        """The problem of a call that must fail (with ``slug``, when given)."""
        result = await self.client.call_tool(tool, arguments)
        assert result.is_error, f"{tool} succeeded: {result.structured_content}"
        problem = result.structured_content or {}
        text = result.content[0].text  # type: ignore[union-attr]
        assert "Traceback" not in text
        if slug is not None:
            assert problem.get("slug") == slug, text
            assert text.startswith(f"{slug} ("), text
        return problem


Opener = Callable[[str], AbstractAsyncContextManager[Tools]]


@asynccontextmanager
async def http_session(base_url: str, token: str, mode: str = "auto") -> AsyncIterator[Tools]:
    """An SDK client session on ``base_url``'s ``/mcp`` with ``token``:
    ``mode`` "auto" speaks the newest protocol version, "legacy" the
    initialize handshake of the versions up to 2025-11-25 (what most
    clients in use speak)."""
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60)
    transport = streamable_http_client(f"{base_url}/mcp", http_client=http)
    async with http, Client(transport, mode=mode) as c:
        yield Tools(c)


@asynccontextmanager
async def stdio_session(base_url: str, token: str) -> AsyncIterator[Tools]:
    """An SDK client session on ``buildmax mcp stdio --url base_url``, run as
    the client would run it: a child process with the token in its
    environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUILDMAX_")}
    env["BUILDMAX_TOKEN"] = token
    env["XDG_CONFIG_HOME"] = "/nonexistent"  # no login file
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "buildmax", "mcp", "stdio", "--url", base_url],
        env=env,
    )
    async with Client(server) as c:
        yield Tools(c)


def run_bridge(url: str, config_home: Any, **env: str) -> subprocess.CompletedProcess[str]:
    """``buildmax mcp stdio --url url`` with stdin closed, a login file
    nowhere and only ``env`` beside PATH: its exit, stdout and stderr."""
    return subprocess.run(
        [sys.executable, "-m", "buildmax", "mcp", "stdio", "--url", url],
        env={"PATH": "/usr/bin:/bin", "XDG_CONFIG_HOME": str(config_home), **env},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


@dataclass
class Team:
    """A space and the people who work there."""

    app: Any
    client: Any
    base_url: str
    space: SpaceHandle
    owner: PrincipalHandle
    author: PrincipalHandle
    reviewer: PrincipalHandle
    integrator: PrincipalHandle
    viewer: PrincipalHandle

    async def api(self, method: str, path: str, who: Any = None, **kw: Any) -> Any:
        """Call the HTTP API under the space (the owner by default)."""
        url = path if path.startswith("/v1/") else f"/v1/spaces/{self.space.slug}{path}"
        return await call(self.client, method, url, who or self.owner, **kw)

    async def task(self, title: str = "do it", **fields: Any) -> dict[str, Any]:
        """A task in the project, created by the owner over HTTP."""
        body = {"project": "main", "title": title, **fields}
        return await self.api("POST", "/tasks", json=body, expect=201)  # type: ignore[no-any-return]

    async def rows(self, table: sa.Table, *where: Any) -> list[dict[str, Any]]:
        """Committed rows of ``table``."""
        async with self.app.db.read() as conn:
            return [dict(r) for r in await conn.fetch_all(sa.select(table).where(*where))]


async def add_member(app: Any, space: SpaceHandle, who: PrincipalHandle, role: str) -> None:
    """Make ``who`` a member of ``space`` with ``role``."""
    async with app.db.write() as tx:
        await put_member(tx, space.pk, who.pk, role, app.clock.now_ms())


async def make_team(
    app: Any, client: Any, base_url: str, make_principal: Any, make_space: Any
) -> Team:
    """A space with a project whose integration is an agent's work item."""
    owner = await make_principal("human")
    space = await make_space(owner)
    people = {}
    for name, role in (
        ("author", "member"),
        ("reviewer", "member"),
        ("integrator", "member"),
        ("viewer", "viewer"),
    ):
        people[name] = await make_principal("agent")
        await add_member(app, space, people[name], role)
    team = Team(app, client, base_url, space, owner, **people)
    await team.api(
        "POST",
        "/projects",
        json={"name": "main", "repository_url": REPO, "target_branch": "main"},
        expect=201,
    )
    await team.api(
        "POST",
        "/projects/main/policy",
        json={"approvals_required": 1, "integration": "automatic"},
        expect=201,
    )
    return team


@pytest.fixture
async def team(app, client, live_server, make_principal, make_space) -> Team:
    return await make_team(app, client, live_server, make_principal, make_space)
