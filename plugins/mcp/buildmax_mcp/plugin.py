"""The MCP plugin's hook implementations (entry point ``mcp``)."""

from __future__ import annotations

from typing import Any

import click
from buildmax_hookspecs import hookimpl

from buildmax.app import BuildMax

from . import lifecycle
from .settings import mcp_settings


@hookimpl
def buildmax_blueprints(app: BuildMax) -> list[Any]:
    from .endpoint import blueprint

    mcp_settings(app)  # a bad [plugins.mcp] table stops the app being built
    return [blueprint]


@hookimpl
def buildmax_startup(app: BuildMax) -> None:
    lifecycle.check_tools(app)  # the SDK itself loads with the first /mcp request


@hookimpl
async def buildmax_shutdown(app: BuildMax) -> None:
    await lifecycle.stop(app)


@hookimpl
def buildmax_register_commands(cli: click.Group) -> None:
    from .commands import mcp_group

    cli.add_command(mcp_group)
