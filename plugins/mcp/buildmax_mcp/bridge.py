"""``buildmax mcp stdio``: an MCP server on stdin/stdout that forwards every
request to a BuildMax server's ``/mcp`` endpoint, for clients that only
launch stdio servers.

The bridge holds no state of its own: each request becomes one request to
the server, with the token from ``BUILDMAX_TOKEN`` (or the login file), and
the answer comes back unchanged. The server decides everything, so the
bridge offers exactly the tools, resources and prompts the server offers.
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
T = TypeVar("T")


@asynccontextmanager
async def upstream(url: str, token: str) -> AsyncIterator[Client]:
    """A client of the server's ``/mcp`` endpoint, authenticated with ``token``."""
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {token}", "User-Agent": f"buildmax-mcp/{__version__}"},
        timeout=httpx2.Timeout(ANSWER_TIMEOUT, connect=10.0),
    )
    async with http, Client(streamable_http_client(endpoint_url(url), http_client=http)) as client:
        yield client


async def _forwarded(what: str, call: Callable[[], Awaitable[T]]) -> T:
    """The server's answer to ``call``; a failure to reach it is an MCP error
    naming what was asked (never a traceback on the wire)."""
    try:
        return await call()
    except MCPError:
        raise
    except (httpx2.HTTPError, OSError) as exc:
        raise MCPError(types.INTERNAL_ERROR, f"BuildMax did not answer {what}: {exc}") from None


def bridge_server(client: Client) -> Server[Any]:
    """A stdio-side server whose every handler asks ``client``."""

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        cursor = params.cursor if params else None
        return await _forwarded("tools/list", lambda: client.list_tools(cursor=cursor))

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        try:
            return await client.call_tool(params.name, params.arguments)
        except (httpx2.HTTPError, OSError) as exc:
            return types.CallToolResult(
                content=[
                    types.TextContent(
                        type="text",
                        text=f"buildmax-unreachable: {params.name} was not answered: {exc}; "
                        "retry with the same idempotency_key",
                    )
                ],
                is_error=True,
            )

    async def list_resources(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        cursor = params.cursor if params else None
        return await _forwarded("resources/list", lambda: client.list_resources(cursor=cursor))

    async def list_resource_templates(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        cursor = params.cursor if params else None
        return await _forwarded(
            "resources/templates/list", lambda: client.list_resource_templates(cursor=cursor)
        )

    async def read_resource(
        ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        return await _forwarded("resources/read", lambda: client.read_resource(params.uri))

    async def list_prompts(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        cursor = params.cursor if params else None
        return await _forwarded("prompts/list", lambda: client.list_prompts(cursor=cursor))

    async def get_prompt(
        ctx: ServerRequestContext[Any, Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        return await _forwarded(
            "prompts/get", lambda: client.get_prompt(params.name, params.arguments)
        )

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
    """Serve stdin/stdout until the client closes it, forwarding to ``url``."""
    async with upstream(url, token) as client:
        server = bridge_server(client)
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())
