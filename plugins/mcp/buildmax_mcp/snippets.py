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


@dataclass(frozen=True)
class JsonClient:
    """A client configured with a JSON file: where it is, the key holding
    its servers, how it refers to an environment variable (``{}`` stands
    for the name), whether a server says its ``type``, and the key of an
    HTTP server's URL."""

    where: str
    servers: str
    reference: str
    typed: bool = False
    url_key: str = "url"

    def __call__(self, name: str, url: str, stdio: bool) -> Snippet:
        token = self.reference.format(TOKEN_ENV)
        server: dict[str, Any] = (
            {"command": "buildmax", "args": _stdio_args(url), "env": {TOKEN_ENV: token}}
            if stdio
            else {self.url_key: endpoint_url(url), "headers": {"Authorization": f"Bearer {token}"}}
        )
        if self.typed:
            server = {"type": "stdio" if stdio else "http", **server}
        return Snippet(self.where, _json({self.servers: {name: server}}))


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


#: The clients ``buildmax mcp config --client`` knows, by name.
CLIENTS: dict[str, Callable[[str, str, bool], Snippet]] = {
    # Claude Code expands ${VAR} in .mcp.json.
    "claude-code": JsonClient(
        ".mcp.json in the project (or claude mcp add-json)", "mcpServers", "${{{}}}", typed=True
    ),
    "codex": _codex,
    # Cursor and VS Code expand ${env:VAR}; Gemini CLI expands $VAR.
    "cursor": JsonClient(".cursor/mcp.json", "mcpServers", "${{env:{}}}"),
    "gemini": JsonClient(
        "~/.gemini/settings.json (or .gemini/settings.json)",
        "mcpServers",
        "${}",
        url_key="httpUrl",
    ),
    "vscode": JsonClient(".vscode/mcp.json", "servers", "${{env:{}}}", typed=True),
}


def snippet(client: str, url: str, *, stdio: bool = False, name: str = "buildmax") -> Snippet:
    """The configuration of ``client`` for the server at ``url``."""
    return CLIENTS[client](name, url.rstrip("/"), stdio)
