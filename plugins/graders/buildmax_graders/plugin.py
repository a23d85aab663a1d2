"""The graders plugin's hook implementations (entry point ``graders``)."""

from __future__ import annotations

from typing import Any

import click
from buildmax_hookspecs import hookimpl

from .builtin import BUILTIN_GRADERS


@hookimpl
def buildmax_graders() -> dict[str, Any]:
    return dict(BUILTIN_GRADERS)


@hookimpl
def buildmax_register_commands(cli: click.Group) -> None:
    from .commands import qualify

    cli.add_command(qualify)
