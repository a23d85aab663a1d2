"""``buildmax attempt``: act on a claimed attempt."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ..client import TasksClient
from .options import generation_option, json_object, json_value, lease_option, override_option
from .remote import SpaceRemote, in_space

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
    "--progress", callback=json_value, metavar="JSON", help="Progress to record (JSON or text)."
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
@click.argument("data", callback=json_value, metavar="DATA")
@generation_option
@in_space
def attempt_checkpoint(r: SpaceRemote, attempt: str, data: Any, generation: int) -> None:
    """Record DATA (JSON or text) as a checkpoint of ATTEMPT (the owner)."""
    r.show(r.tasks.checkpoint(r.space, attempt, generation, data), ("attempt_id", "number"))


def _ending_command(
    name: str,
    end: Callable[..., dict[str, Any]],
    *,
    reason_required: bool,
    reason_help: str,
    help: str,
) -> click.Command:
    """Attempt command NAME, which ends ATTEMPT with the :class:`TasksClient`
    call ``end`` and shows the ended attempt."""

    @attempt_group.command(name, help=help)
    @click.argument("attempt")
    @generation_option
    @click.option("--reason", required=reason_required, help=reason_help)
    @override_option
    @in_space
    def end_attempt(
        r: SpaceRemote,
        attempt: str,
        generation: int,
        reason: str | None,
        override_reason: str | None,
    ) -> None:
        ended = end(r.tasks, r.space, attempt, generation, reason, override_reason=override_reason)
        r.show(ended, ATTEMPT_FIELDS)

    return end_attempt


attempt_release = _ending_command(
    "release",
    TasksClient.release,
    reason_required=False,
    reason_help="Why.",
    help="Give ATTEMPT's task back to the queue (the owner); not charged.",
)
attempt_fail = _ending_command(
    "fail",
    TasksClient.fail,
    reason_required=True,
    reason_help="What went wrong.",
    help="""Fail ATTEMPT (the owner): charged against the task's attempts, and the
    task fails once they are spent.""",
)


@attempt_group.command("submit")
@click.argument("attempt")
@generation_option
@click.option("--summary", required=True, help="What was done.")
@click.option(
    "--candidate",
    callback=json_object,
    metavar="JSON",
    help="Where the work is: a JSON object such as a commit and branch.",
)
@click.option(
    "--evidence",
    callback=json_object,
    metavar="JSON",
    help="Proof: a JSON object such as check results.",
)
@click.option(
    "--artifact",
    "artifacts",
    multiple=True,
    metavar="ARTIFACT",
    help="An artifact handed in as evidence (of this attempt or its task); repeatable.",
)
@in_space
def attempt_submit(
    r: SpaceRemote,
    attempt: str,
    generation: int,
    summary: str,
    candidate: dict[str, Any] | None,
    evidence: dict[str, Any] | None,
    artifacts: tuple[str, ...],
) -> None:
    """Hand in ATTEMPT's work (the owner).

    The task is done, or waits in the workflow's first stage.

    \b
    Example:
      buildmax attempt submit at_... --generation 1 --summary "Fixed the form" \\
          --candidate '{"commit": "3f2a9c1", "branch": "fix-login"}' --artifact af_...
    """
    submitted = r.tasks.submit(
        r.space,
        attempt,
        generation,
        summary,
        candidate=candidate,
        evidence=evidence,
        artifacts=artifacts or None,
    )
    r.show(submitted, SUBMIT_FIELDS)


attempt_cancel = _ending_command(
    "cancel",
    TasksClient.cancel_attempt,
    reason_required=True,
    reason_help="Why.",
    help="""End ATTEMPT for good (the owner, or a space admin with
    --override-reason); its task is ready again.""",
)
