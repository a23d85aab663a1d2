"""The MCP plugin's hook implementations (entry point ``mcp``)."""

from __future__ import annotations

from typing import Any

import click
from buildmax_hookspecs import hookimpl

from buildmax.app import BuildMax

from .settings import mcp_settings


@hookimpl
def buildmax_blueprints(app: BuildMax) -> list[Any]:
    from .endpoint import blueprint

    mcp_settings(app)  # a bad [plugins.mcp] table stops the app being built
    return [blueprint]


@hookimpl
async def buildmax_startup(app: BuildMax) -> None:
    from . import server

    await server.start(app)


@hookimpl
async def buildmax_shutdown(app: BuildMax) -> None:
    from . import server

    await server.stop(app)


@hookimpl
def buildmax_register_commands(cli: click.Group) -> None:
    from .commands import mcp_group

    cli.add_command(mcp_group)
