"""``buildmax agent``: agent definitions and their revisions."""

from __future__ import annotations

import click

from .remote import SpaceRemote, in_space

AGENT_COLUMNS = ("id", "name", "revision.number", "revision.plugins")
AGENT_FIELDS = (
    "id",
    "name",
    "revision.number",
    "revision.plugins",
    "revision.instructions",
    "created_at",
)
AGENT_REVISION_COLUMNS = ("id", "number", "plugins", "created_at")


@click.group("agent")
def agent_group() -> None:
    """Manage agent definitions: instructions and plugin selection, in revisions."""


@agent_group.command("create")
@click.argument("name")
@click.option("--instructions", help="What the agent is told.")
@click.option(
    "--plugin", "plugins", multiple=True, metavar="PLUGIN", help="A plugin it uses (repeatable)."
)
@in_space
def agent_create(
    r: SpaceRemote, name: str, instructions: str | None, plugins: tuple[str, ...]
) -> None:
    """Define agent NAME (space admins): revision 1.

    \b
    Example:
      buildmax agent create reviewer --instructions "$(cat reviewer.md)" --plugin git
    """
    r.show(r.tasks.create_agent(r.space, name, instructions, plugins or None), AGENT_FIELDS)


@agent_group.command("revise")
@click.argument("agent")
@click.option("--instructions", help="New instructions [default: keep].")
@click.option(
    "--plugin",
    "plugins",
    multiple=True,
    metavar="PLUGIN",
    help="Replace the plugins (repeatable) [default: keep].",
)
@click.option("--no-plugins", is_flag=True, help="Use no plugins.")
@in_space
def agent_revise(
    r: SpaceRemote,
    agent: str,
    instructions: str | None,
    plugins: tuple[str, ...],
    no_plugins: bool,
) -> None:
    """Make a new current revision of AGENT (space admins).

    What is not given is kept from the current revision; a concurrent
    revision is refused.

    \b
    Example:
      buildmax agent revise reviewer --plugin git --plugin lint
    """
    if plugins and no_plugins:
        raise click.UsageError("give --plugin or --no-plugins, not both")
    if instructions is None and not plugins and not no_plugins:
        raise click.UsageError("nothing to change: give --instructions or --plugin")
    current = r.tasks.get_agent(r.space, agent)["revision"]
    revised = r.tasks.revise_agent(
        r.space,
        agent,
        current["instructions"] if instructions is None else instructions,
        [] if no_plugins else plugins or current["plugins"],
        expected_revision=current["number"],
    )
    r.show(revised, AGENT_FIELDS)


@agent_group.command("list")
@in_space
def agent_list(r: SpaceRemote) -> None:
    """List the space's agents with their current revision."""
    r.show_all(r.tasks.list_agents(r.space), AGENT_COLUMNS)


@agent_group.command("show")
@click.argument("agent")
@click.option("--revisions", is_flag=True, help="List every revision instead.")
@in_space
def agent_show(r: SpaceRemote, agent: str, revisions: bool) -> None:
    """Show AGENT (id or name) and its current revision."""
    if revisions:
        r.show_all(r.tasks.list_agent_revisions(r.space, agent), AGENT_REVISION_COLUMNS)
    else:
        r.show(r.tasks.get_agent(r.space, agent), AGENT_FIELDS)
