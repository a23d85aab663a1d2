"""Options and parameter types the tasks plugin's commands share."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click
from buildmax_hookspecs import TASK_KINDS

from buildmax.commands.identity import SPACE_ENV, space_option

__all__ = ["SPACE_ENV", "json_object", "json_value", "space_option"]


def json_value(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """A JSON value; text that is not JSON is taken as a string."""
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError:
        return value


def json_object(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """A JSON object."""
    parsed = json_value(ctx, param, value)
    if parsed is not None and not isinstance(parsed, dict):
        raise click.BadParameter('must be a JSON object, e.g. \'{"commit": "3f2a9c1"}\'')
    return parsed


generation_option = click.option(
    "--generation",
    type=int,
    required=True,
    help="The attempt's generation, as the claim answered; a stale one is refused.",
)
override_option = click.option(
    "--override-reason",
    metavar="TEXT",
    help="Act on another principal's attempt (space admins); audited.",
)
lease_option = click.option(
    "--lease",
    "lease_seconds",
    type=click.IntRange(min=1),
    metavar="SECONDS",
    help="Lease length [default: the server's, 10 minutes unless configured].",
)


def filter_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give ``command`` the task filters --project, --kind, --label and --agent."""
    for option in reversed(
        (
            click.option("--project", metavar="PROJECT", help="Only this project (id or name)."),
            click.option("--kind", type=click.Choice(TASK_KINDS), help="Only this kind."),
            click.option("--label", metavar="LABEL", help="Only tasks with this label."),
            click.option("--agent", metavar="AGENT", help="Only tasks assigned this agent."),
        )
    ):
        command = option(command)
    return command
