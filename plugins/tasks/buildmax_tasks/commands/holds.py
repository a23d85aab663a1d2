"""``buildmax hold``: suspend or stop the space, a project or a task."""

from __future__ import annotations

import click

from ..tables import HOLD_STRENGTHS
from .remote import SpaceRemote, in_space

HOLD_COLUMNS = ("id", "strength", "scope.type", "scope.id", "reason", "created_at", "lifted_at")


@click.group("hold")
def hold_group() -> None:
    """Suspend or stop the space, a project or a task (space admins)."""


@hold_group.command("place")
@click.argument("strength", type=click.Choice(HOLD_STRENGTHS))
@click.option("--reason", required=True, help="Why (shown to whoever is refused).")
@click.option("--project", metavar="PROJECT", help="Hold this project only.")
@click.option("--task", metavar="TASK", help="Hold this task only.")
@in_space
def hold_place(
    r: SpaceRemote, strength: str, reason: str, project: str | None, task: str | None
) -> None:
    """Place a STRENGTH hold on the space, or on --project or --task.

    suspended refuses new claims and lets active attempts finish; stopped
    also refuses lease renewals (submissions are still accepted).

    \b
    Examples:
      buildmax hold place stopped --reason "deploy freeze"
      buildmax hold place suspended --project shop --reason "waiting for the API"
    """
    if project is not None and task is not None:
        raise click.UsageError("give --project or --task, not both")
    scope = "project" if project is not None else "task" if task is not None else "space"
    r.show(r.tasks.place_hold(r.space, scope, strength, reason, project or task), HOLD_COLUMNS)


@hold_group.command("lift")
@click.argument("hold")
@in_space
def hold_lift(r: SpaceRemote, hold: str) -> None:
    """Lift HOLD: its scope is claimable again."""
    r.show(r.tasks.lift_hold(r.space, hold), HOLD_COLUMNS)


@hold_group.command("list")
@click.option("--all", "include_lifted", is_flag=True, help="Include lifted holds.")
@in_space
def hold_list(r: SpaceRemote, include_lifted: bool) -> None:
    """List live holds, newest first."""
    r.show_all(r.tasks.list_holds(r.space, include_lifted), HOLD_COLUMNS)
