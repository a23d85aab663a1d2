"""``buildmax mcp stdio``: an MCP server on stdin/stdout that forwards every
request to a BuildMax server's ``/mcp`` endpoint, for clients that only
launch stdio servers.

The bridge holds no state of its own: each request opens a session of the
SDK's client on the server, asks, and closes it, with the token from
``BUILDMAX_TOKEN`` (or the login file). So a server that restarts, or a
replica behind a proxy that changes, is no concern of the bridge's, and a
server that cannot be reached fails that request (a tool error a model
reads) rather than the bridge. The server decides everything: the bridge
offers exactly the tools, resources and prompts it offers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared.exceptions import MCPError

from buildmax import __version__

from .snippets import endpoint_url

#: How long the bridge waits for the server's answer to one request. A tool
#: call is bounded on the server (``call_timeout_seconds``); this is longer.
ANSWER_TIMEOUT = 120.0
#: The protocol version of the bridge's own probe of the endpoint.
_PROBE_VERSION = "2025-06-18"
T = TypeVar("T")


class Unanswered(Exception):
    """The server did not answer a request: what it said, or why not."""


class Bridge:
    """The server's ``/mcp`` at ``url``, asked with ``token``."""

    def __init__(self, url: str, token: str) -> None:
        self.endpoint = endpoint_url(url)
        self.http = httpx2.AsyncClient(
            headers={
                "Authorization": f"Bearer {token}",
                "User-Agent": f"buildmax-mcp/{__version__}",
            },
            timeout=httpx2.Timeout(ANSWER_TIMEOUT, connect=10.0),
        )

    async def close(self) -> None:
        """Close the HTTP connections."""
        await self.http.aclose()

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[Client]:
        transport = streamable_http_client(self.endpoint, http_client=self.http)
        async with Client(transport, read_timeout_seconds=ANSWER_TIMEOUT) as client:
            yield client

    async def ask(self, what: str, question: Callable[[Client], Awaitable[T]]) -> T:
        """The server's answer to ``question``, in a session of its own;
        :class:`Unanswered` saying why when there is none."""
        try:
            async with self._session() as client:
                return await question(client)
        except MCPError as error:
            if error.error.code != types.INTERNAL_ERROR:
                raise  # the server's own answer (a resource it does not have)
            refused = await self.refusal()
            raise Unanswered(refused or f"{what}: {error.error.message}") from None
        except Exception as error:  # the SDK's task groups wrap a lost connection
            refused = await self.refusal()
            raise Unanswered(refused or f"{what}: {_innermost(error)}") from None

    async def refusal(self) -> str | None:
        """Why the endpoint does not answer MCP now (``None``: it does): it
        cannot be reached, or it answers an HTTP error (a revoked token)."""
        message = {"jsonrpc": "2.0", "id": 0, "method": "tools/list", "params": {}}
        try:
            answer = await self.http.post(
                self.endpoint,
                json=message,
                headers={
                    "Accept": "application/json, text/event-stream",
                    "MCP-Protocol-Version": _PROBE_VERSION,
                },
            )
        except (httpx2.HTTPError, OSError) as error:
            return f"{self.endpoint} cannot be reached: {error}"
        if answer.status_code == 200:
            return None
        try:
            problem = answer.json()
        except ValueError:
            problem = {}
        if not isinstance(problem, dict):
            problem = {}
        slug = str(problem.get("type", "")).rsplit(":", 1)[-1]
        said = problem.get("detail") or answer.reason_phrase
        hint = " (check BUILDMAX_TOKEN)" if answer.status_code in (401, 403) else ""
        return f"{self.endpoint} answered {answer.status_code} {slug}: {said}{hint}"


def _innermost(error: BaseException) -> BaseException:
    """The first exception inside ``error``'s exception groups."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def bridge_server(bridge: Bridge) -> Server[Any]:
    """A stdio-side server whose every handler asks the server through ``bridge``."""

    async def forwarded(what: str, question: Callable[[Client], Awaitable[T]]) -> T:
        try:
            return await bridge.ask(what, question)
        except Unanswered as unanswered:
            raise MCPError(types.INTERNAL_ERROR, str(unanswered)) from None

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        cursor = params.cursor if params else None
        return await forwarded("tools/list", lambda c: c.list_tools(cursor=cursor))

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        try:
            return await bridge.ask(
                params.name, lambda c: c.call_tool(params.name, params.arguments)
            )
        except Unanswered as unanswered:
            text = (
                f"buildmax-unreachable: {params.name} was not answered: {unanswered}; a change "
                "it made commits or rolls back whole: retry with the same idempotency_key"
            )
            return types.CallToolResult(
                content=[types.TextContent(type="text", text=text)], is_error=True
            )

    async def list_resources(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        cursor = params.cursor if params else None
        return await forwarded("resources/list", lambda c: c.list_resources(cursor=cursor))

    async def list_resource_templates(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        cursor = params.cursor if params else None
        return await forwarded(
            "resources/templates/list", lambda c: c.list_resource_templates(cursor=cursor)
        )

    async def read_resource(
        ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        return await forwarded("resources/read", lambda c: c.read_resource(params.uri))

    async def list_prompts(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        cursor = params.cursor if params else None
        return await forwarded("prompts/list", lambda c: c.list_prompts(cursor=cursor))

    async def get_prompt(
        ctx: ServerRequestContext[Any, Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        return await forwarded("prompts/get", lambda c: c.get_prompt(params.name, params.arguments))

    return Server(
        "buildmax",
        version=__version__,
        title="BuildMax (stdio bridge)",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_resource_templates,
        on_read_resource=read_resource,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
    )


async def run_bridge(url: str, token: str) -> None:
    """Check that the server at ``url`` answers MCP with ``token`` (else
    :class:`Unanswered` saying why), then serve stdin/stdout until the
    client closes it."""
    bridge = Bridge(url, token)
    try:
        refused = await bridge.refusal()
        if refused is not None:
            raise Unanswered(refused)
        server = bridge_server(bridge)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
    finally:
        await bridge.close()
