"""The MCP server of a BuildMax process: the SDK's low-level server with
BuildMax's tools, resources and prompt, behind the SDK's streamable HTTP
transport in stateless mode.

Stateless: every MCP request is complete in itself (no session lives in a
process between requests), so behind a proxy that spreads requests over
several server processes each one serves any request, and nothing is lost
when a process restarts. What a session would have carried (the fencing
generation, a claim's attempt) travels in tool results and arguments.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import mcp_types as types
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError

from buildmax import __version__
from buildmax.background import start_background, stop_background
from buildmax.problems import Problem, TooManyRequests

from . import calls
from .calls import UnknownTool
from .catalog import TEMPLATE_PARAMETER, Catalog, build_catalog
from .context import CONTEXT_SCOPE, CallContext
from .prompts import LOOP_PROMPT, loop_prompt
from .settings import McpSettings, mcp_settings

if TYPE_CHECKING:
    from buildmax.app import BuildMax

_KEY = "mcp.server"
_TASK = "mcp.session-manager"
#: The server's instructions to a client's model.
INSTRUCTIONS = (
    "BuildMax is a work queue for coding agents. Claim a task, keep its lease alive while "
    "you work (renew before lease_expires_at), and hand the work in with submit; every call "
    "about your attempt takes its attempt id and fencing generation from the claim's result. "
    "Work you hand in is reviewed by another agent or a person. Pass an idempotency_key to a "
    "change you may retry. Errors name a stable slug (e.g. stale-generation, lease-lapsed)."
)


@dataclass
class McpServer:
    """The MCP server of one app: its catalog, the SDK's server and its
    stateless session manager, and the calls in flight per token."""

    catalog: Catalog
    server: Server[Any]
    manager: StreamableHTTPSessionManager
    in_flight: dict[int, int] = field(default_factory=dict)


def mcp_server_or_none(app: BuildMax) -> McpServer | None:
    """The app's MCP server, if it was started (:func:`lifecycle.started`)."""
    found: McpServer | None = app.extensions.get(_KEY)
    return found


def _context(ctx: ServerRequestContext[Any, Any]) -> CallContext:
    request = ctx.request
    found = getattr(request, "scope", {}).get(CONTEXT_SCOPE)
    if not isinstance(found, CallContext):
        raise MCPError(types.INTERNAL_ERROR, "this request did not come through /mcp")
    return found


def _build(app: BuildMax) -> McpServer:
    catalog = build_catalog(app)  # a tool that cannot be served stops start-up

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=catalog.tools)

    @contextlib.contextmanager
    def in_flight(context: CallContext) -> Iterator[McpSettings]:
        """Count a call of the caller's token while it runs, or refuse it
        (:class:`TooManyRequests`) past ``max_calls_per_token``."""
        settings = mcp_settings(app)
        token = context.caller.token_pk
        if served.in_flight.get(token, 0) >= settings.max_calls_per_token:
            raise TooManyRequests(
                f"this token has {settings.max_calls_per_token} calls in flight "
                "(max_calls_per_token); retry when one has answered",
                retry_after=1,
            )
        served.in_flight[token] = served.in_flight.get(token, 0) + 1
        try:
            yield settings
        finally:
            left = served.in_flight.pop(token) - 1
            if left:
                served.in_flight[token] = left

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        context = _context(ctx)
        binding = catalog.bindings.get(params.name)
        if binding is None:
            return calls.problem_result(
                UnknownTool(f"no tool {params.name!r}: tools/list names them"), context
            )
        try:
            with in_flight(context) as settings:
                return await calls.call(
                    app,
                    binding,
                    dict(params.arguments or {}),
                    context,
                    max_upload_bytes=settings.max_upload_bytes,
                    limit_seconds=settings.call_timeout_seconds,
                )
        except TooManyRequests as refused:
            return calls.problem_result(refused, context)

    async def list_resource_templates(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(
                    name=binding.spec.name,
                    title=binding.spec.title,
                    uri_template=binding.spec.resource or "",
                    description=binding.spec.description,
                    mime_type="application/json",
                )
                for binding in catalog.resources()
            ]
        )

    async def list_resources(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(resources=[])

    async def read_resource(
        ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        context = _context(ctx)
        uri = str(params.uri)
        found = next(
            (
                (binding, arguments)
                for binding in catalog.resources()
                if (arguments := _match(binding.spec.resource or "", uri)) is not None
            ),
            None,
        )
        if found is None:
            raise MCPError(types.INVALID_PARAMS, f"no resource {uri!r}")
        binding, arguments = found
        try:
            with in_flight(context) as settings:
                made = calls.route_request(binding, arguments, 0)
                answer = await calls.fetch(
                    app, made, context, limit_seconds=settings.call_timeout_seconds
                )
        except Problem as problem:
            raise MCPError(
                types.INVALID_PARAMS, f"{problem.slug} ({problem.status}): {problem.detail}"
            ) from None
        return types.ReadResourceResult(
            contents=[
                types.TextResourceContents(
                    uri=uri, mime_type="application/json", text=json.dumps(answer)
                )
            ]
        )

    async def list_prompts(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[LOOP_PROMPT])

    async def get_prompt(
        ctx: ServerRequestContext[Any, Any], params: types.GetPromptRequestParams
    ) -> types.GetPromptResult:
        if params.name != LOOP_PROMPT.name:
            raise MCPError(types.INVALID_PARAMS, f"no prompt {params.name!r}")
        return loop_prompt(dict(params.arguments or {}), catalog)

    server: Server[Any] = Server(
        "buildmax",
        version=__version__,
        title="BuildMax",
        instructions=INSTRUCTIONS,
        # A call's input schema by name: without it the SDK lists every tool
        # on each call to check the call's Mcp-Param headers against one.
        get_tool_input_schema=catalog.input_schema,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_resource_templates,
        on_read_resource=read_resource,
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
    )
    served = McpServer(
        catalog,
        server,
        StreamableHTTPSessionManager(
            server,
            stateless=True,
            json_response=True,
            max_request_body_size=app.settings.max_body_bytes,
        ),
    )
    return served


def _match(template: str, uri: str) -> dict[str, str] | None:
    """The parameters of ``uri`` if it fits ``template`` (each one segment)."""
    names = TEMPLATE_PARAMETER.findall(template)
    pattern = (
        "^"
        + TEMPLATE_PARAMETER.sub(
            "([^/]+)", re.escape(template).replace(r"\{", "{").replace(r"\}", "}")
        )
        + "$"
    )
    found = re.match(pattern, uri)
    if found is None:
        return None
    return {name: unquote(value) for name, value in zip(names, found.groups(), strict=True)}


async def start(app: BuildMax) -> McpServer:
    """Start the app's MCP server: its session manager runs in a task of
    the app until :func:`stop`."""
    served = _build(app)
    running = asyncio.Event()

    async def run() -> None:
        async with served.manager.run():
            running.set()
            await asyncio.Event().wait()

    start_background(app, _TASK, run())
    app.extensions[_KEY] = served
    waiting = asyncio.ensure_future(running.wait())
    task = app.extensions[_TASK]
    await asyncio.wait({waiting, task}, return_when=asyncio.FIRST_COMPLETED)
    if not running.is_set():
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        task.result()  # the reason it could not start
    return served


async def stop(app: BuildMax) -> None:
    """Stop the app's MCP server."""
    app.extensions.pop(_KEY, None)
    await stop_background(app, _TASK)
