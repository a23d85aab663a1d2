"""When the MCP server of an app starts and stops.

Importing the MCP SDK and building the tool catalog take about a second
of CPU, which every server process, every command that builds an app and
every test would pay at start. So at start-up only the cheap checks of
the plugins' tools run (:func:`check_tools`: a duplicate name, a route
nobody declared stop the server starting); the SDK and the catalog are
loaded by the first request to ``/mcp``, once per process.
"""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING

from buildmax_hookspecs import AgentTool

if TYPE_CHECKING:
    from buildmax.app import BuildMax

    from .server import McpServer

_LOCK = "mcp.starting"
_PATH_PARAMETER = re.compile(r"\{([^{}]+)\}")
_RULE_PARAMETER = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")


class ToolDeclarationError(Exception):
    """A plugin offered a tool that cannot be served (a duplicate name, a
    route nobody declared, an argument named twice)."""


def check_tools(app: BuildMax) -> None:
    """Refuse, at start-up, tools whose name another plugin offers or whose
    route is not declared (:class:`ToolDeclarationError`)."""
    from buildmax.declaration import route_doc

    declared = {
        (method, _RULE_PARAMETER.sub(r"{\1}", rule.rule))
        for rule in app.url_map.iter_rules()
        if route_doc(app.view_functions.get(rule.endpoint)) is not None
        for method in rule.methods or ()
    }
    owner: dict[str, str] = {}
    for plugin, offered in app.hooks.agent_tools():
        for spec in offered:
            where = f"tool {spec.name!r} of plugin {plugin!r}"
            if not isinstance(spec, AgentTool):
                raise ToolDeclarationError(f"plugin {plugin!r} offered {spec!r}, not an AgentTool")
            if spec.name in owner:
                raise ToolDeclarationError(f"{where}: plugin {owner[spec.name]!r} offers it too")
            owner[spec.name] = plugin
            if (spec.method.upper(), spec.path) not in declared:
                raise ToolDeclarationError(
                    f"{where}: {spec.method} {spec.path} is not a declared route"
                )


async def started(app: BuildMax) -> McpServer:
    """The app's MCP server, started by the first caller."""
    from .server import mcp_server_or_none, start

    found = mcp_server_or_none(app)
    if found is not None:
        return found
    lock = app.extensions.setdefault(_LOCK, asyncio.Lock())
    async with lock:
        return mcp_server_or_none(app) or await start(app)


async def stop(app: BuildMax) -> None:
    """Stop the app's MCP server, if it was started."""
    if app.extensions.get(_LOCK) is not None:
        from .server import stop as stop_server

        await stop_server(app)
