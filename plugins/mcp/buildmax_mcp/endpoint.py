"""``POST /mcp``: the Model Context Protocol over streamable HTTP, served
by the same server process and the same Hypercorn as the HTTP API.

The route authenticates the bearer token as every route does (a scoped
token too: what it may do is the tool's route's to say), then hands the
request to the SDK's transport, with who calls riding in the ASGI scope to
the tool handlers (which bound the calls in flight per token). Every tool
call is then a request of its own to the tool's route, marked
``mcp/<this request's id>``: its answer, its log line and its audit
events carry that request id.
"""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

from quart import Blueprint, Response, g, request
from werkzeug.datastructures import Headers

from buildmax.apidoc import api
from buildmax.auth import Caller
from buildmax.bodies import raw_body
from buildmax.current import current_buildmax
from buildmax.problems import problem_for_status

from .context import CONTEXT_SCOPE, CallContext
from .lifecycle import started

if TYPE_CHECKING:
    from .server import McpServer

blueprint = Blueprint("mcp", __name__)

#: The request id prefix of the calls made through MCP.
MCP_MARK = "mcp/"


@blueprint.post("/mcp")
@api(
    "The Model Context Protocol endpoint (streamable HTTP, stateless, JSON answers)",
    scopes=["attempt"],
    not_idempotent="each tool call is a request of its own to its route, which takes "
    "the call's idempotency_key argument",
    relays=True,
    tags=["mcp"],
)
async def endpoint(caller: Caller) -> Response:
    """A JSON-RPC message from an MCP client: ``tools/list``, ``tools/call``,
    resources and prompts. A tool call's failure is a tool error (its
    ``isError`` result names the problem's slug and detail); this route
    itself answers 401 without a valid token."""
    app = current_buildmax()
    served = await started(app)
    body = await raw_body()
    context = CallContext(caller=caller, request_id=MCP_MARK + g.request_id)
    return await _serve(served, body, context)


async def _serve(served: McpServer, body: bytes, context: CallContext) -> Response:
    """Run the SDK's transport on this request and answer what it sent."""
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": request.http_version,
        "method": request.method,
        "scheme": request.scheme,
        "path": request.path,
        "raw_path": request.path.encode(),
        "query_string": request.query_string,
        "root_path": "",
        "headers": [
            (name.lower().encode("latin-1"), value.encode("latin-1"))
            for name, value in request.headers.items()
        ],
        "server": None,
        "client": None,
        CONTEXT_SCOPE: context,
    }
    delivered = False

    async def receive() -> MutableMapping[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        # Nothing more arrives; a client that goes away cancels this handler.
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    status: int = 500
    headers: list[tuple[bytes, bytes]] = []
    chunks: list[bytes] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status, headers = message["status"], list(message.get("headers", []))
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await served.manager.handle_request(scope, receive, send)
    answered = Headers(
        [(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers]
    )
    body = b"".join(chunks)
    if status >= 400 and not answered.get("Content-Type", "").startswith("application/json"):
        # The transport's plain-text refusals (a POST that is not JSON) are
        # problems like every other refusal of this server; its JSON-RPC
        # errors stay as the protocol has them.
        raise problem_for_status(status, body.decode("utf-8", "replace")[:500] or None)
    return Response(body, status=status, headers=answered)
