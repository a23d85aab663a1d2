"""``buildmax`` commands of the tasks plugin: projects, tasks, attempts,
holds, decisions and agent definitions.

Every command works in one space, named with ``--space`` or
``BUILDMAX_SPACE``, and takes the kernel's ``--url``, ``--token`` and
``--json``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import click

from buildmax.commands.identity import Remote, connected, render_record, render_table

from .client import TasksClient
from .schema import HOLD_STRENGTHS, INTEGRATION_MODES, TASK_KINDS, TASK_STATES

SPACE_ENV = "BUILDMAX_SPACE"

PROJECT_COLUMNS = ("id", "name", "revision", "policy.revision", "repository_url", "target_branch")
PROJECT_FIELDS = (
    "id",
    "name",
    "description",
    "repository_url",
    "target_branch",
    "revision",
    "policy.revision",
    "policy.approvals_required",
    "policy.human_review_required",
    "policy.integration",
    "created_at",
    "updated_at",
)
POLICY_COLUMNS = (
    "revision",
    "approvals_required",
    "human_review_required",
    "integration",
    "created_at",
)
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
ATTEMPT_COLUMNS = ("id", "generation", "state", "claimant_id", "lease_expires_at", "end_reason")
ATTEMPT_FIELDS = (
    "id",
    "task_id",
    "generation",
    "state",
    "claimant_id",
    "agent_revision_id",
    "lease_expires_at",
    "progress",
    "end_reason",
    "created_at",
    "renewed_at",
    "ended_at",
)
SUBMIT_FIELDS = ("submission.id", "task.id", "task.state", "stage", "work_ids")
HOLD_COLUMNS = ("id", "strength", "scope.type", "scope.id", "reason", "created_at", "lifted_at")
DECISION_COLUMNS = ("id", "task_id", "state", "options", "answer", "question")
DECISION_FIELDS = (
    "id",
    "task_id",
    "question",
    "options",
    "answerable_by",
    "state",
    "answer",
    "comment",
    "opened_by",
    "answered_by",
    "created_at",
    "expires_at",
    "answered_at",
)
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

TOKEN_HINT = (
    "The attempt token is shown only this once: store it now. It acts on this attempt "
    "only and ends with it, e.g. `buildmax attempt renew {attempt} --generation {generation} "
    "--token TOKEN`; your own token works too."
)


# -- output and options --------------------------------------------------------


def _text(value: Any) -> Any:
    """A list or nested value as one table cell."""
    if isinstance(value, list):
        return ", ".join(str(v.get("id", v)) if isinstance(v, dict) else str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return value


def _flat(item: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested objects as dotted keys (``policy.revision``), lists as text."""
    flat: dict[str, Any] = {}
    for key, value in item.items():
        if isinstance(value, dict) and key not in ("progress", "candidate", "evidence"):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = _text(value)
    return flat


@dataclass
class SpaceRemote(Remote):
    """A remote command's connection, bound to one space, with the tasks calls."""

    space: str
    tasks: TasksClient

    def show(self, item: dict[str, Any], fields: Sequence[str]) -> None:
        """Print one object (nested fields as ``outer.inner``, text of several
        lines indented under its first)."""
        if self.as_json:
            click.echo(json.dumps(item, indent=2))
            return
        indent = "\n" + " " * (max(len(field) for field in fields) + 2)
        flat = {
            key: value.replace("\n", indent) if isinstance(value, str) else value
            for key, value in _flat(item).items()
        }
        click.echo(render_record(flat, fields))

    def show_all(self, items: list[dict[str, Any]], columns: Sequence[str]) -> None:
        """Print a list of objects (nested fields as ``outer.inner``)."""
        if self.as_json:
            click.echo(json.dumps(items, indent=2))
        else:
            click.echo(render_table([_flat(item) for item in items], columns))


space_option = click.option(
    "--space",
    envvar=SPACE_ENV,
    required=True,
    metavar="SPACE",
    help=f"The space to work in (id or slug) [default: ${SPACE_ENV}].",
)


def in_space(command: Callable[..., None]) -> Callable[..., None]:
    """Give ``command`` --space, --url, --token and --json and call it with a
    :class:`SpaceRemote`; problems are reported as one ``error:`` line."""

    @space_option
    @connected
    @functools.wraps(command)
    def run(remote: Remote, space: str, **arguments: Any) -> None:
        bound = SpaceRemote(remote.client, remote.as_json, space, TasksClient(remote.client))
        command(bound, **arguments)

    return run


def _json_value(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """A JSON value; text that is not JSON is taken as a string."""
    if value is None:
        return None
    try:
        return json.loads(value)
    except ValueError:
        return value


def _json_object(ctx: click.Context, param: click.Parameter, value: str | None) -> Any:
    """A JSON object."""
    parsed = _json_value(ctx, param, value)
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


def _filter_options(command: Callable[..., None]) -> Callable[..., None]:
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


# -- projects ---------------------------------------------------------------------


@click.group("project")
def project_group() -> None:
    """Manage projects and their workflow policies."""


@project_group.command("create")
@click.argument("name")
@click.option("--description", help="What the project is about.")
@click.option("--repository-url", metavar="URL", help="The repository its work lands in.")
@click.option("--target-branch", metavar="BRANCH", help="The branch work is integrated into.")
@in_space
def project_create(
    r: SpaceRemote,
    name: str,
    description: str | None,
    repository_url: str | None,
    target_branch: str | None,
) -> None:
    """Create project NAME (members); the name is permanent.

    \b
    Example:
      buildmax project create shop --repository-url https://git.example/shop.git \\
          --target-branch main --space web
    """
    body = r.tasks.create_project(r.space, name, description, repository_url, target_branch)
    r.show(body, PROJECT_FIELDS)


@project_group.command("list")
@in_space
def project_list(r: SpaceRemote) -> None:
    """List the space's projects by name."""
    r.show_all(r.tasks.list_projects(r.space), PROJECT_COLUMNS)


@project_group.command("show")
@click.argument("project")
@in_space
def project_show(r: SpaceRemote, project: str) -> None:
    """Show PROJECT (id or name) and its current policy."""
    r.show(r.tasks.get_project(r.space, project), PROJECT_FIELDS)


@project_group.command("policy")
@click.argument("project")
@click.option("--approvals", type=click.IntRange(0, 10), help="Approvals a submission needs.")
@click.option("--human-review/--no-human-review", default=None, help="Whether a human must review.")
@click.option(
    "--integration",
    type=click.Choice(INTEGRATION_MODES),
    help="Integrate approved work automatically, or only when a human authorizes it.",
)
@in_space
def project_policy(
    r: SpaceRemote,
    project: str,
    approvals: int | None,
    human_review: bool | None,
    integration: str | None,
) -> None:
    """Show PROJECT's policy revisions, or set a new one (space admins).

    With any option, a new revision is made from the current one with those
    changes; it is refused if someone else changed the policy meanwhile.

    \b
    Examples:
      buildmax project policy shop
      buildmax project policy shop --approvals 2 --human-review --integration human
    """
    if approvals is None and human_review is None and integration is None:
        r.show_all(r.tasks.list_policies(r.space, project), POLICY_COLUMNS)
        return
    current = r.tasks.get_project(r.space, project)["policy"]
    body = r.tasks.set_policy(
        r.space,
        project,
        current["approvals_required"] if approvals is None else approvals,
        current["human_review_required"] if human_review is None else human_review,
        integration or current["integration"],
        expected_revision=current["revision"],
    )
    r.show(body, POLICY_COLUMNS)


# -- tasks ------------------------------------------------------------------------


@click.group("task")
def task_group() -> None:
    """Create, find, edit and claim tasks."""


@task_group.command("create")
@click.argument("title")
@click.option("--project", required=True, metavar="PROJECT", help="Its project (id or name).")
@click.option("--body", help="What to do.")
@click.option("--criteria", help="Acceptance criteria: when it is done.")
@click.option("--kind", type=click.Choice(TASK_KINDS), help="What kind of work [default: code].")
@click.option("--priority", type=click.IntRange(-1000, 1000), help="Higher is claimed first.")
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
@click.option("--search", metavar="TEXT", help="Only tasks whose title contains TEXT.")
@_filter_options
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
    """List tasks, newest first.

    \b
    Example:
      buildmax task list --state ready --project shop --label frontend
    """
    found = r.tasks.list_tasks(
        r.space, state=state, kind=kind, label=label, project=project, agent=agent, q=search
    )
    r.show_all(found, TASK_COLUMNS)


@task_group.command("ready")
@_filter_options
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
@click.option("--priority", type=click.IntRange(-1000, 1000), help="A new priority.")
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
@_filter_options
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


# -- attempts ---------------------------------------------------------------------


@click.group("attempt")
def attempt_group() -> None:
    """Act on a claimed attempt: renew its lease, checkpoint, submit, give up.

    Each command takes the attempt's id and --generation, and works with the
    claimant's token or the attempt's own token (--token).
    """


@attempt_group.command("show")
@click.argument("attempt")
@in_space
def attempt_show(r: SpaceRemote, attempt: str) -> None:
    """Show ATTEMPT with its lease and last progress."""
    r.show(r.tasks.get_attempt(r.space, attempt), ATTEMPT_FIELDS)


@attempt_group.command("renew")
@click.argument("attempt")
@generation_option
@lease_option
@click.option(
    "--progress", callback=_json_value, metavar="JSON", help="Progress to record (JSON or text)."
)
@in_space
def attempt_renew(
    r: SpaceRemote, attempt: str, generation: int, lease_seconds: int | None, progress: Any
) -> None:
    """Extend ATTEMPT's lease from now (the owner).

    \b
    Example:
      buildmax attempt renew at_... --generation 1 --progress '{"step": "tests"}'
    """
    renewed = r.tasks.renew(
        r.space, attempt, generation, lease_seconds=lease_seconds, progress=progress
    )
    r.show(renewed, ATTEMPT_FIELDS)


@attempt_group.command("checkpoint")
@click.argument("attempt")
@click.argument("data", callback=_json_value, metavar="DATA")
@generation_option
@in_space
def attempt_checkpoint(r: SpaceRemote, attempt: str, data: Any, generation: int) -> None:
    """Record DATA (JSON or text) as a checkpoint of ATTEMPT (the owner)."""
    r.show(r.tasks.checkpoint(r.space, attempt, generation, data), ("attempt_id", "number"))


@attempt_group.command("release")
@click.argument("attempt")
@generation_option
@click.option("--reason", help="Why.")
@override_option
@in_space
def attempt_release(
    r: SpaceRemote, attempt: str, generation: int, reason: str | None, override_reason: str | None
) -> None:
    """Give ATTEMPT's task back to the queue (the owner); not charged."""
    released = r.tasks.release(
        r.space, attempt, generation, reason, override_reason=override_reason
    )
    r.show(released, ATTEMPT_FIELDS)


@attempt_group.command("fail")
@click.argument("attempt")
@generation_option
@click.option("--reason", required=True, help="What went wrong.")
@override_option
@in_space
def attempt_fail(
    r: SpaceRemote, attempt: str, generation: int, reason: str, override_reason: str | None
) -> None:
    """Fail ATTEMPT (the owner): charged against the task's attempts, and the
    task fails once they are spent."""
    failed = r.tasks.fail(r.space, attempt, generation, reason, override_reason=override_reason)
    r.show(failed, ATTEMPT_FIELDS)


@attempt_group.command("submit")
@click.argument("attempt")
@generation_option
@click.option("--summary", required=True, help="What was done.")
@click.option(
    "--candidate",
    callback=_json_object,
    metavar="JSON",
    help="Where the work is: a JSON object such as a commit and branch.",
)
@click.option(
    "--evidence",
    callback=_json_object,
    metavar="JSON",
    help="Proof: a JSON object such as artifact ids and check results.",
)
@in_space
def attempt_submit(
    r: SpaceRemote,
    attempt: str,
    generation: int,
    summary: str,
    candidate: dict[str, Any] | None,
    evidence: dict[str, Any] | None,
) -> None:
    """Hand in ATTEMPT's work (the owner).

    The task is done, or waits in the workflow's first stage.

    \b
    Example:
      buildmax attempt submit at_... --generation 1 --summary "Fixed the form" \\
          --candidate '{"commit": "3f2a9c1", "branch": "fix-login"}'
    """
    submitted = r.tasks.submit(
        r.space, attempt, generation, summary, candidate=candidate, evidence=evidence
    )
    r.show(submitted, SUBMIT_FIELDS)


@attempt_group.command("cancel")
@click.argument("attempt")
@generation_option
@click.option("--reason", required=True, help="Why.")
@override_option
@in_space
def attempt_cancel(
    r: SpaceRemote, attempt: str, generation: int, reason: str, override_reason: str | None
) -> None:
    """End ATTEMPT for good (the owner, or a space admin with
    --override-reason); its task is ready again."""
    canceled = r.tasks.cancel_attempt(
        r.space, attempt, generation, reason, override_reason=override_reason
    )
    r.show(canceled, ATTEMPT_FIELDS)


# -- holds ------------------------------------------------------------------------


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


# -- decisions --------------------------------------------------------------------


@click.group("decision")
def decision_group() -> None:
    """Questions a human answers; a pending one parks its task."""


@decision_group.command("ask")
@click.argument("task")
@click.argument("question")
@click.option(
    "--option", "options", multiple=True, required=True, metavar="OPTION", help="An answer."
)
@click.option(
    "--answerable-by",
    type=click.Choice(("human", "member")),
    help="Who may answer [default: human].",
)
@click.option("--expires-in", type=click.IntRange(min=1), metavar="SECONDS", help="Expiry.")
@in_space
def decision_ask(
    r: SpaceRemote,
    task: str,
    question: str,
    options: tuple[str, ...],
    answerable_by: str | None,
    expires_in: int | None,
) -> None:
    """Ask QUESTION about TASK (members); TASK is parked until it is answered.

    \b
    Example:
      buildmax decision ask ta_... "Drop support for IE11?" --option yes --option no
    """
    asked = r.tasks.ask_decision(
        r.space, task, question, options, answerable_by=answerable_by, expires_in_seconds=expires_in
    )
    r.show(asked, DECISION_FIELDS)


@decision_group.command("list")
@click.option(
    "--state",
    type=click.Choice(("pending", "answered", "all")),
    default="pending",
    show_default=True,
    help="Which decisions.",
)
@click.option("--task", metavar="TASK", help="Only this task's decisions.")
@in_space
def decision_list(r: SpaceRemote, state: str, task: str | None) -> None:
    """List decisions, newest first: the pending ones unless --state says otherwise."""
    r.show_all(r.tasks.list_decisions(r.space, state, task), DECISION_COLUMNS)


@decision_group.command("answer")
@click.argument("decision")
@click.argument("answer")
@click.option("--comment", help="Why (kept with the answer).")
@in_space
def decision_answer(r: SpaceRemote, decision: str, answer: str, comment: str | None) -> None:
    """Answer DECISION with ANSWER, one of its options (audited).

    \b
    Example:
      buildmax decision answer dc_... yes --comment "Usage is below 0.1%"
    """
    r.show(r.tasks.answer_decision(r.space, decision, answer, comment), DECISION_FIELDS)


# -- agent definitions ------------------------------------------------------------


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


def register(cli: click.Group) -> None:
    """Add the plugin's command groups to ``cli``."""
    for group in (
        project_group,
        task_group,
        attempt_group,
        hold_group,
        decision_group,
        agent_group,
    ):
        cli.add_command(group)
