"""``buildmax project``: projects and their workflow policies."""

from __future__ import annotations

import click

from ..tables import INTEGRATION_MODES
from .remote import SpaceRemote, in_space

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
