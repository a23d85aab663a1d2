"""Who calls through ``/mcp``: what the route hands the SDK's handlers, in
the ASGI scope of the request (a module without the SDK, so the route and
the plugin load without it)."""

from __future__ import annotations

from dataclasses import dataclass

from buildmax.auth import Caller

#: The ASGI scope key carrying a call's :class:`CallContext` to the handlers.
CONTEXT_SCOPE = "buildmax.mcp.context"


@dataclass(frozen=True)
class CallContext:
    """Who calls, and through which MCP request."""

    caller: Caller
    request_id: str
