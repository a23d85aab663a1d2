"""``buildmax decision``: questions a human answers."""

from __future__ import annotations

import click

from .remote import SpaceRemote, in_space

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
