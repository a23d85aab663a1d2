"""``buildmax review``: list, show and record reviews; resolve findings."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click

from buildmax.commands.identity import CommandError, Remote, connected, space_option

from .client import ReviewsClient, finding
from .tables import KINDS, SEVERITIES

ITEM_COLUMNS = ("task_id", "kind", "subject_id", "slot", "human_only", "task_state", "stale")
ITEM_FIELDS = (
    "task_id",
    "kind",
    "task_state",
    "subject_id",
    "submission_id",
    "slot",
    "human_only",
    "stale",
    "target",
    "decision_id",
    "review.id",
    "review.decision",
    "review.human",
    "review.reviewer_id",
    "review.summary",
    "integration.outcome",
    "integration.before",
    "integration.after",
    "integration.reason",
)
FINDING_COLUMNS = ("id", "severity", "path", "line", "resolved", "text")
_FINDING = re.compile(
    r"^(?P<severity>[a-z]+)(?:@(?P<path>[^:]+)(?::(?P<line>\d+))?)?:(?P<text>.+)$", re.S
)


@click.group("review")
def review_group() -> None:
    """Review work: list and show it, approve, request changes, reject.

    A review work item is claimed like any task (`buildmax task claim`) and
    recorded here with the claimant's token or the claim's own token. A
    human may record a review on an unheld work item directly: it is
    claimed and handed in at once.
    """


def _reviews(remote: Remote) -> ReviewsClient:
    return ReviewsClient(remote.client)


def _parse_finding(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> list[dict[str, Any]]:
    parsed = []
    for value in values:
        match = _FINDING.match(value)
        if match is None or match["severity"] not in SEVERITIES:
            raise click.BadParameter(
                f"{value!r}: write SEVERITY[@PATH[:LINE]]:TEXT, SEVERITY one of "
                f"{', '.join(SEVERITIES)}",
                ctx,
                param,
            )
        line = int(match["line"]) if match["line"] else None
        parsed.append(finding(match["severity"], match["text"].strip(), match["path"], line))
    return parsed


def _findings_file(path: Path | None) -> list[dict[str, Any]]:
    if path is None:
        return []
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CommandError(f"cannot read findings from {path}: {exc}") from None
    if not isinstance(loaded, list) or not all(isinstance(f, dict) for f in loaded):
        raise CommandError(f"{path} must hold a JSON array of finding objects")
    return loaded


finding_option = click.option(
    "--finding",
    "findings",
    multiple=True,
    callback=_parse_finding,
    metavar="SEVERITY[@PATH[:LINE]]:TEXT",
    help=f"A finding (repeatable); SEVERITY is one of {', '.join(SEVERITIES)}.",
)
findings_file_option = click.option(
    "--findings-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help='More findings, as a JSON array of {"severity", "text", "path"?, "line"?}.',
)
generation_option = click.option(
    "--generation", type=click.IntRange(min=1), help="Fence on the claim's generation."
)


@review_group.command("list")
@click.option("--kind", type=click.Choice(KINDS), help="Only review or integration work.")
@click.option("--subject", metavar="TASK", help="Only work on this subject task.")
@click.option("--pending", is_flag=True, help="Only work with nothing recorded yet.")
@space_option
@connected
def list_command(
    remote: Remote, space: str, kind: str | None, subject: str | None, pending: bool
) -> None:
    """List review and integration work, newest first (stale: the subject's
    criteria changed after it was submitted)."""
    found = _reviews(remote).list(space, kind=kind, subject=subject, pending=pending or None)
    remote.show_all(found, ITEM_COLUMNS)


@review_group.command("show")
@click.argument("ident", metavar="TASK|REVIEW|INTEGRATION")
@space_option
@connected
def show_command(remote: Remote, space: str, ident: str) -> None:
    """Show review or integration work with what was recorded and its findings."""
    item = _reviews(remote).get(space, ident)
    remote.show(item, ITEM_FIELDS)
    if item["findings"] and not remote.as_json:
        click.echo("findings:")
        remote.show_all(item["findings"], FINDING_COLUMNS)


def _record(
    remote: Remote,
    space: str,
    task: str,
    decision: str,
    summary: str,
    findings: list[dict[str, Any]],
    findings_file: Path | None,
    generation: int | None,
) -> None:
    every = [*findings, *_findings_file(findings_file)]
    item = _reviews(remote).record(
        space, task, decision, summary=summary, findings=every, generation=generation
    )
    remote.show(item, ITEM_FIELDS)


@review_group.command("approve")
@click.argument("task")
@click.option("--summary", default="", help="What you checked.")
@finding_option
@findings_file_option
@generation_option
@space_option
@connected
def approve_command(
    remote: Remote,
    space: str,
    task: str,
    summary: str,
    findings: list[dict[str, Any]],
    findings_file: Path | None,
    generation: int | None,
) -> None:
    """Approve the candidate of review work item TASK.

    \b
    Example:
      buildmax review approve ta_... --space web --summary "tests and docs read"
    """
    _record(remote, space, task, "approve", summary, findings, findings_file, generation)


@review_group.command("request-changes")
@click.argument("task")
@click.option("--summary", default="", help="The gist of what must change.")
@finding_option
@findings_file_option
@generation_option
@space_option
@connected
def request_changes_command(
    remote: Remote,
    space: str,
    task: str,
    summary: str,
    findings: list[dict[str, Any]],
    findings_file: Path | None,
    generation: int | None,
) -> None:
    """Ask for changes (at least one finding): the subject reopens with them.

    \b
    Example:
      buildmax review request-changes ta_... --space web \\
        --finding "major@src/app.py:12:the loop never ends"
    """
    _record(remote, space, task, "request_changes", summary, findings, findings_file, generation)


@review_group.command("reject")
@click.argument("task")
@click.option("--summary", required=True, help="Why the work is rejected (the subject fails).")
@finding_option
@findings_file_option
@generation_option
@space_option
@connected
def reject_command(
    remote: Remote,
    space: str,
    task: str,
    summary: str,
    findings: list[dict[str, Any]],
    findings_file: Path | None,
    generation: int | None,
) -> None:
    """Reject the work for good: the subject task fails with the summary."""
    _record(remote, space, task, "reject", summary, findings, findings_file, generation)


@review_group.command("findings")
@click.option("--subject", metavar="TASK", help="Only findings on this task.")
@click.option(
    "--state", type=click.Choice(["open", "resolved"]), help="Only open or resolved ones."
)
@space_option
@connected
def findings_command(remote: Remote, space: str, subject: str | None, state: str | None) -> None:
    """List review findings, newest first."""
    remote.show_all(_reviews(remote).findings(space, subject=subject, state=state), FINDING_COLUMNS)


@review_group.command("resolve")
@click.argument("finding_id", metavar="FINDING")
@click.option("--resolution", default="", help="How it was resolved.")
@space_option
@connected
def resolve_command(remote: Remote, space: str, finding_id: str, resolution: str) -> None:
    """Mark FINDING resolved."""
    remote.show(_reviews(remote).resolve(space, finding_id, resolution), FINDING_COLUMNS)
