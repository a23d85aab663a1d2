"""``buildmax mcp``: the stdio bridge and client configuration."""

from __future__ import annotations

import asyncio
import re

import click

from buildmax.client import TOKEN_ENV, URL_ENV, resolve
from buildmax.commands.identity import CommandError

from .snippets import CLIENTS, snippet

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_URL_HELP = f"The BuildMax server [default: ${URL_ENV}, else the login file's]."


@click.group(name="mcp")
def mcp_group() -> None:
    """Reach BuildMax from MCP clients (Claude Code, Codex, Cursor, Gemini CLI, VS Code, ...).

    The server answers MCP at /mcp over streamable HTTP; `stdio` bridges to
    it for clients that only launch stdio servers; `config` prints a
    client's configuration.
    """


@mcp_group.command()
@click.option("--url", metavar="URL", help=_URL_HELP)
def stdio(url: str | None) -> None:
    """Serve MCP on stdin/stdout, forwarding every request to the server's /mcp.

    The token comes from $BUILDMAX_TOKEN (else the login file's, for its
    URL), never from the command line. The bridge keeps no state: the
    server answers everything. Nothing but MCP messages is written to
    stdout; errors go to stderr.
    """
    chosen, token = resolve(url, None)
    if not token:
        raise CommandError(f"no token for {chosen}: set {TOKEN_ENV} (or run `buildmax login`)")
    from .bridge import Unanswered, run_bridge  # the SDK: loaded for this command only

    try:
        asyncio.run(run_bridge(chosen, token))
    except KeyboardInterrupt:
        return
    except Unanswered as unanswered:
        raise CommandError(str(unanswered)) from None


@mcp_group.command()
@click.option(
    "--client",
    "client",
    required=True,
    type=click.Choice(sorted(CLIENTS)),
    help="The MCP client to configure.",
)
@click.option(
    "--transport",
    type=click.Choice(["http", "stdio"]),
    default="http",
    show_default=True,
    help="http: the client talks to /mcp itself; stdio: it launches `buildmax mcp stdio`.",
)
@click.option("--url", metavar="URL", help=_URL_HELP)
@click.option(
    "--name", default="buildmax", show_default=True, help="The server's name in the client."
)
def config(client: str, transport: str, url: str | None, name: str) -> None:
    """Print the configuration of an MCP client for this server.

    The token is referred to through $BUILDMAX_TOKEN in the client's own
    syntax: set that variable where the client runs. Nothing is written.
    """
    if not _NAME.match(name):
        raise click.BadParameter("letters, digits, '-' and '_' only", param_hint="--name")
    chosen, _ = resolve(url, "")
    made = snippet(client, chosen, stdio=transport == "stdio", name=name)
    click.echo(f"# {made.where}; set {TOKEN_ENV} where the client runs", err=True)
    click.echo(made.text, nl=False)
