"""Configuration for the common MCP clients, pointing them at a BuildMax
server. Every form refers to the token through the ``BUILDMAX_TOKEN``
environment variable, in the client's own syntax: none embeds it or passes
it as a command-line argument."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from buildmax.client import TOKEN_ENV


@dataclass(frozen=True)
class Snippet:
    """What to put where, for one client and transport."""

    where: str
    text: str


def endpoint_url(url: str) -> str:
    """The ``/mcp`` endpoint of the server at ``url`` (given with or without it)."""
    base = url.rstrip("/")
    return base if base.endswith("/mcp") else base + "/mcp"


def _json(value: Any) -> str:
    return json.dumps(value, indent=2) + "\n"


def _stdio_args(url: str) -> list[str]:
    return ["mcp", "stdio", "--url", url]


def _claude_code(name: str, url: str, stdio: bool) -> Snippet:
    # Claude Code expands ${VAR} in .mcp.json.
    server: dict[str, Any] = (
        {
            "type": "stdio",
            "command": "buildmax",
            "args": _stdio_args(url),
            "env": {TOKEN_ENV: "${" + TOKEN_ENV + "}"},
        }
        if stdio
        else {
            "type": "http",
            "url": endpoint_url(url),
            "headers": {"Authorization": "Bearer ${" + TOKEN_ENV + "}"},
        }
    )
    return Snippet(
        ".mcp.json in the project (or claude mcp add-json)", _json({"mcpServers": {name: server}})
    )


def _cursor(name: str, url: str, stdio: bool) -> Snippet:
    # Cursor expands ${env:VAR} in mcp.json.
    server: dict[str, Any] = (
        {
            "command": "buildmax",
            "args": _stdio_args(url),
            "env": {TOKEN_ENV: "${env:" + TOKEN_ENV + "}"},
        }
        if stdio
        else {
            "url": endpoint_url(url),
            "headers": {"Authorization": "Bearer ${env:" + TOKEN_ENV + "}"},
        }
    )
    return Snippet(".cursor/mcp.json", _json({"mcpServers": {name: server}}))


def _vscode(name: str, url: str, stdio: bool) -> Snippet:
    server: dict[str, Any] = (
        {
            "type": "stdio",
            "command": "buildmax",
            "args": _stdio_args(url),
            "env": {TOKEN_ENV: "${env:" + TOKEN_ENV + "}"},
        }
        if stdio
        else {
            "type": "http",
            "url": endpoint_url(url),
            "headers": {"Authorization": "Bearer ${env:" + TOKEN_ENV + "}"},
        }
    )
    return Snippet(".vscode/mcp.json", _json({"servers": {name: server}}))


def _codex(name: str, url: str, stdio: bool) -> Snippet:
    # Codex reads the bearer token from the variable it names; a stdio
    # server gets the variables env_vars lists.
    if stdio:
        lines = [
            f"[mcp_servers.{name}]",
            'command = "buildmax"',
            "args = " + json.dumps(_stdio_args(url)),
            f'env_vars = ["{TOKEN_ENV}"]',
        ]
    else:
        lines = [
            f"[mcp_servers.{name}]",
            f"url = {json.dumps(endpoint_url(url))}",
            f'bearer_token_env_var = "{TOKEN_ENV}"',
        ]
    return Snippet("~/.codex/config.toml", "\n".join(lines) + "\n")


def _gemini(name: str, url: str, stdio: bool) -> Snippet:
    # Gemini CLI expands $VAR in settings.json.
    server: dict[str, Any] = (
        {"command": "buildmax", "args": _stdio_args(url), "env": {TOKEN_ENV: "$" + TOKEN_ENV}}
        if stdio
        else {"httpUrl": endpoint_url(url), "headers": {"Authorization": "Bearer $" + TOKEN_ENV}}
    )
    return Snippet(
        "~/.gemini/settings.json (or .gemini/settings.json)", _json({"mcpServers": {name: server}})
    )


#: The clients ``buildmax mcp config --client`` knows, by name.
CLIENTS: dict[str, Callable[[str, str, bool], Snippet]] = {
    "claude-code": _claude_code,
    "codex": _codex,
    "cursor": _cursor,
    "gemini": _gemini,
    "vscode": _vscode,
}


def snippet(client: str, url: str, *, stdio: bool = False, name: str = "buildmax") -> Snippet:
    """The configuration of ``client`` for the server at ``url``."""
    return CLIENTS[client](name, url.rstrip("/"), stdio)
