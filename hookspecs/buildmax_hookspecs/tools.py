"""Hooks for agents' tools: the operations an agent reaches as tools
(Model Context Protocol and the like) rather than as HTTP requests."""

from __future__ import annotations

from collections.abc import Iterable

from .markers import hookspec
from .records import AgentTool


@hookspec
def buildmax_agent_tools() -> Iterable[AgentTool] | None:
    """The plugin's operations an agent may call as tools.

    Called at start-up and when the first MCP request loads the tools'
    schemas, with no transaction open. Return
    :class:`AgentTool` records, one per tool, each naming one of the
    plugin's own declared routes (never another plugin's: the plugin that
    owns an operation offers its tool). A tool executes as an in-process
    request to that route with the caller's identity, so it needs no check
    of its own. Two plugins offering the same name, or a route that is not
    declared, stops the server starting; an argument named twice (path,
    query, body) or a ``fixed`` one the route does not take fails the first
    MCP request, which loads the tools' schemas.
    """
