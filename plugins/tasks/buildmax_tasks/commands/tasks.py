"""``buildmax task``: create, find, edit and claim tasks."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import click
from buildmax_hookspecs import TASK_KINDS, TASK_PRIORITIES

from buildmax.commands.identity import render_table
from buildmax.commands.server import (
    config_option,
    data_dir_option,
    database_option,
    load_settings,
    with_app,
)

from ..client import MARK_END, MARK_START
from ..tables import TASK_STATES
from .attempts import ATTEMPT_COLUMNS
from .options import filter_options, lease_option, override_option
from .remote import SpaceRemote, in_space

TASK_COLUMNS = ("id", "state", "parked", "kind", "priority", "labels", "title")
TASK_FIELDS = (
    "id",
    "project_id",
    "title",
    "kind",
    "state",
    "parked",
    "held_by",
    "pending_decisions",
    "priority",
    "labels",
    "agent_id",
    "resources",
    "revision",
    "generation",
    "attempts_used",
    "max_attempts",
    "current_attempt_id",
    "stage",
    "subject_task_id",
    "finding_ids",
    "outcome_reason",
    "body",
    "criteria",
    "created_at",
    "updated_at",
)
LINK_COLUMNS = ("id", "state", "title")
CLAIM_FIELDS = (
    "task.id",
    "task.title",
    "attempt.id",
    "attempt.generation",
    "attempt.lease_expires_at",
    "token",
)
TOKEN_HINT = (
    "The attempt token is shown only this once: store it now. It acts on this attempt "
    "only and ends with it, e.g. `buildmax attempt renew {attempt} --generation {generation} "
    "--token TOKEN`; your own token works too."
)


@click.group("task")
def task_group() -> None:
    """Create, find, edit and claim tasks."""


@task_group.command("create")
@click.argument("title")
@click.option("--project", required=True, metavar="PROJECT", help="Its project (id or name).")
@click.option("--body", help="What to do.")
@click.option("--criteria", help="Acceptance criteria: when it is done.")
@click.option("--kind", type=click.Choice(TASK_KINDS), help="What kind of work [default: code].")
@click.option("--priority", type=click.IntRange(*TASK_PRIORITIES), help="Higher is claimed first.")
@click.option("--label", "labels", multiple=True, metavar="LABEL", help="A label (repeatable).")
@click.option("--agent", metavar="AGENT", help="The agent definition to run it with.")
@click.option(
    "--max-attempts",
    type=click.IntRange(1, 100),
    help="Failed attempts before the task fails [default: 3].",
)
@click.option(
    "--resource",
    "resources",
    multiple=True,
    metavar="RESOURCE",
    help="A resource it needs exclusively, e.g. repo:<url>@<branch> (repeatable).",
)
@click.option(
    "--depends-on",
    "prerequisites",
    multiple=True,
    metavar="TASK",
    help="A prerequisite task (repeatable); the task stays open until they are done.",
)
@in_space
def task_create(
    r: SpaceRemote,
    title: str,
    project: str,
    body: str | None,
    criteria: str | None,
    kind: str | None,
    priority: int | None,
    labels: tuple[str, ...],
    agent: str | None,
    max_attempts: int | None,
    resources: tuple[str, ...],
    prerequisites: tuple[str, ...],
) -> None:
    """Create a task titled TITLE (members).

    \b
    Example:
      buildmax task create "Fix the login form" --project shop --label frontend \\
          --criteria "Tests pass; no console errors" --depends-on ta_...
    """
    made = r.tasks.create_task(
        r.space,
        project,
        title,
        body,
        criteria,
        kind=kind,
        priority=priority,
        labels=labels or None,
        agent=agent,
        max_attempts=max_attempts,
        resources=resources or None,
        prerequisites=prerequisites or None,
    )
    r.show(made, TASK_FIELDS)


@task_group.command("list")
@click.option("--state", type=click.Choice(TASK_STATES), help="Only tasks in this state.")
@click.option(
    "--search",
    metavar="TEXT",
    help='Search titles and criteria for every word (stemmed) and "quoted phrase" of TEXT.',
)
@filter_options
@in_space
def task_list(
    r: SpaceRemote,
    state: str | None,
    search: str | None,
    project: str | None,
    kind: str | None,
    label: str | None,
    agent: str | None,
) -> None:
    """List tasks, newest first; with --search, the most relevant first,
    each with the words that matched (in bold on a terminal, else between
    [ and ]).

    \b
    Examples:
      buildmax task list --state ready --project shop --label frontend
      buildmax task list --search 'login "flaky test"'
    """
    filters = dict(state=state, kind=kind, label=label, project=project, agent=agent)
    if search is None:
        r.show_all(r.tasks.list_tasks(r.space, **filters), TASK_COLUMNS)
        return
    found = r.tasks.search_tasks(r.space, search, **filters)
    if not r.as_json:
        bold = sys.stdout.isatty()
        found = [{**item, "match": marked(item["match"]["snippet"], bold)} for item in found]
    r.show_all(found, (*TASK_COLUMNS, "match"))


def marked(snippet: str, bold: bool) -> str:
    """A search's snippet on one line, its matched words in bold (``bold``:
    for a terminal) or between ``[`` and ``]``."""
    if bold:
        shown = _MARKED.sub(lambda m: click.style(m.group(1), bold=True), snippet)
    else:
        shown = snippet.replace(MARK_START, "[").replace(MARK_END, "]")
    return " ".join(shown.replace(MARK_START, "").replace(MARK_END, "").split())


#: A matched word of a snippet.
_MARKED = re.compile(f"{MARK_START}([^{MARK_END}]*){MARK_END}")


@task_group.command("ready")
@filter_options
@in_space
def task_ready(
    r: SpaceRemote, project: str | None, kind: str | None, label: str | None, agent: str | None
) -> None:
    """List the ready queue in claim order: priority, then age.

    Held tasks and tasks waiting for a decision are left out.
    """
    found = r.tasks.list_ready(r.space, kind=kind, label=label, project=project, agent=agent)
    r.show_all(found, TASK_COLUMNS)


@task_group.command("show")
@click.argument("task")
@in_space
def task_show(r: SpaceRemote, task: str) -> None:
    """Show TASK: its state, why it is parked, its stage and current attempt."""
    r.show(r.tasks.get_task(r.space, task), TASK_FIELDS)


@task_group.command("edit")
@click.argument("task")
@click.option("--title", help="A new title.")
@click.option("--body", help="A new body.")
@click.option("--criteria", help="New acceptance criteria.")
@click.option("--priority", type=click.IntRange(*TASK_PRIORITIES), help="A new priority.")
@click.option(
    "--label", "labels", multiple=True, metavar="LABEL", help="Replace the labels (repeatable)."
)
@click.option("--agent", metavar="AGENT", help="Assign this agent definition.")
@click.option("--no-agent", is_flag=True, help="Assign no agent definition.")
@click.option("--max-attempts", type=click.IntRange(1, 100), help="A new attempt budget.")
@click.option(
    "--resource",
    "resources",
    multiple=True,
    metavar="RESOURCE",
    help="Replace the resources it needs (repeatable).",
)
@click.option(
    "--expected-revision",
    type=int,
    help="Refuse unless the task is at this revision [default: the one just read].",
)
@override_option
@in_space
def task_edit(
    r: SpaceRemote,
    task: str,
    title: str | None,
    body: str | None,
    criteria: str | None,
    priority: int | None,
    labels: tuple[str, ...],
    agent: str | None,
    no_agent: bool,
    max_attempts: int | None,
    resources: tuple[str, ...],
    expected_revision: int | None,
    override_reason: str | None,
) -> None:
    """Revise TASK (members); title, body and criteria make a new revision.

    \b
    Example:
      buildmax task edit ta_... --priority 5 --criteria "Also works on mobile"
    """
    if agent is not None and no_agent:
        raise click.UsageError("give --agent or --no-agent, not both")
    changes: dict[str, Any] = {
        name: value
        for name, value in (
            ("title", title),
            ("body", body),
            ("criteria", criteria),
            ("priority", priority),
            ("labels", list(labels) or None),
            ("agent", agent),
            ("max_attempts", max_attempts),
            ("resources", list(resources) or None),
        )
        if value is not None
    }
    if no_agent:
        changes["agent"] = None
    if not changes:
        raise click.UsageError("nothing to change: give at least one option")
    if expected_revision is None:
        expected_revision = r.tasks.get_task(r.space, task)["revision"]
    edited = r.tasks.update_task(
        r.space, task, expected_revision, override_reason=override_reason, **changes
    )
    r.show(edited, TASK_FIELDS)


@task_group.command("depend")
@click.argument("task")
@click.argument("prerequisite")
@in_space
def task_depend(r: SpaceRemote, task: str, prerequisite: str) -> None:
    """Make TASK wait for PREREQUISITE (members); a cycle is refused.

    Prints TASK's prerequisites.
    """
    links = r.tasks.add_dependency(r.space, task, prerequisite)
    if r.as_json:
        click.echo(json.dumps(links, indent=2))
    else:
        click.echo(render_table(links["prerequisites"], LINK_COLUMNS))


@task_group.command("undepend")
@click.argument("task")
@click.argument("prerequisite")
@in_space
def task_undepend(r: SpaceRemote, task: str, prerequisite: str) -> None:
    """Stop TASK waiting for PREREQUISITE (members)."""
    r.tasks.remove_dependency(r.space, task, prerequisite)
    r.done(f"{task} no longer waits for {prerequisite}.")


@task_group.command("cancel")
@click.argument("task")
@click.option("--reason", required=True, help="Why (kept with the task).")
@override_option
@in_space
def task_cancel(r: SpaceRemote, task: str, reason: str, override_reason: str | None) -> None:
    """Cancel TASK for good (members), with its active attempt."""
    r.show(r.tasks.cancel_task(r.space, task, reason, override_reason), TASK_FIELDS)


@task_group.command("retry")
@click.argument("task")
@in_space
def task_retry(r: SpaceRemote, task: str) -> None:
    """Make a failed or canceled TASK ready again with a fresh attempt budget
    (space admins)."""
    r.show(r.tasks.retry_task(r.space, task), TASK_FIELDS)


def _show_claim(r: SpaceRemote, claim: dict[str, Any]) -> None:
    attempt = claim["attempt"]
    r.show(claim, CLAIM_FIELDS)
    hint = TOKEN_HINT.format(attempt=attempt["id"], generation=attempt["generation"])
    click.echo(hint, err=True)


@task_group.command("claim")
@click.argument("task")
@lease_option
@in_space
def task_claim(r: SpaceRemote, task: str, lease_seconds: int | None) -> None:
    """Claim TASK (members): a new attempt with a lease and a token for it.

    Keep the lease alive with `buildmax attempt renew`, and finish with
    `attempt submit`, `release` or `fail`, each with the attempt's id and
    generation.

    \b
    Example:
      buildmax task claim ta_... --lease 900
    """
    _show_claim(r, r.tasks.claim(r.space, task, lease_seconds))


@task_group.command("claim-next")
@filter_options
@lease_option
@in_space
def task_claim_next(
    r: SpaceRemote,
    project: str | None,
    kind: str | None,
    label: str | None,
    agent: str | None,
    lease_seconds: int | None,
) -> None:
    """Claim the next ready task matching the filters (members).

    Candidates that cannot be claimed now (a claim check vetoes them, a
    resource is reserved) are passed over. When nothing is claimable it says
    so and exits 0 (with --json: "task": null).

    \b
    Example:
      buildmax task claim-next --project shop --kind code --lease 900
    """
    claim = r.tasks.claim_next(
        r.space, project=project, kind=kind, label=label, agent=agent, lease_seconds=lease_seconds
    )
    if claim["task"] is not None:
        _show_claim(r, claim)
    elif r.as_json:
        click.echo(json.dumps(claim, indent=2))
    else:
        click.echo(f"Nothing to claim ({claim['skipped']} passed over).")


@task_group.command("attempts")
@click.argument("task")
@in_space
def task_attempts(r: SpaceRemote, task: str) -> None:
    """List TASK's attempts by generation, ended ones included."""
    r.show_all(r.tasks.list_attempts(r.space, task), ATTEMPT_COLUMNS)


@task_group.command("reindex")
@config_option
@data_dir_option
@database_option
def task_reindex(config_path: str | None, data_dir: str | None, database_url: str | None) -> None:
    """Rebuild task search from the tasks (on the server's machine: it
    reads the database directly, like `buildmax db`).

    Empties the search index and indexes every task's title and current
    acceptance criteria again, in one transaction: searches see the old
    index until it commits. Maintenance only: the index is kept with every
    change, and never holds anything the tasks do not.
    """
    from buildmax_hookspecs import App

    from ..search import rebuild

    settings = load_settings(config_path, data_dir=data_dir, database_url=database_url)

    async def work(app: App) -> int:
        async with app.db.write() as tx:
            return await rebuild(tx)

    indexed = with_app(settings, work, schema_of=("tasks",))
    click.echo(f"Indexed {indexed} task(s) for search.")
