"""The lessons plugin's hook implementations (entry point ``lessons``)."""

from __future__ import annotations

from typing import Any

import click
from buildmax_hookspecs import (
    Actor,
    AgentRevisionRef,
    AgentTool,
    App,
    AttemptRef,
    AuditAction,
    Migration,
    SubmissionRef,
    TaskRef,
    Transaction,
    Verdict,
    hookimpl,
)

from buildmax.migrations import create_tables

from . import carried, offers
from .tables import SEARCH, TABLES


async def _create(tx: Transaction) -> None:
    await create_tables(*TABLES)(tx)
    await SEARCH.create(tx)


@hookimpl
def buildmax_migrations() -> list[Migration]:
    return [
        Migration("lessons", 1, "lessons, their revisions and votes, and their search", _create),
        Migration("lessons", 2, "lesson search keeps each lesson's row whole", _whole_rows),
    ]


async def _whole_rows(tx: Transaction) -> None:
    from .reindex import rebuild

    if tx.dialect == "postgresql":
        await SEARCH.keep_rows_whole(tx)
        await rebuild(tx)  # rows written before are stored again, whole


@hookimpl
def buildmax_blueprints(app: App) -> list[Any]:
    from .routes import blueprint

    return [blueprint]


@hookimpl
def buildmax_register_commands(cli: click.Group) -> None:
    from .commands import lesson_group
    from .reindex import reindex_command

    lesson_group.add_command(reindex_command)
    cli.add_command(lesson_group)


@hookimpl
def buildmax_submission_extensions() -> list[str]:
    return [carried.EXTENSION]


@hookimpl
async def buildmax_submission_check(
    app: App, tx: Transaction, task: TaskRef, submission: SubmissionRef
) -> Verdict | None:
    return await carried.check(app, tx, task, submission)


@hookimpl
async def buildmax_attempt_submitted(
    app: App,
    tx: Transaction,
    task: TaskRef,
    attempt: AttemptRef,
    submission: SubmissionRef,
    actor: Actor,
) -> None:
    await carried.record(app, tx, task, attempt, submission, actor)


@hookimpl
async def buildmax_run_environment(
    app: App, tx: Transaction, task: TaskRef, agent_revision: AgentRevisionRef | None
) -> dict[str, Any] | None:
    return await offers.offered(app, tx, task)


@hookimpl
def buildmax_audit_targets() -> dict[str, str]:
    return {"lesson": "/v1/spaces/{space}/lessons/{id}"}


@hookimpl
def buildmax_audit_actions() -> list[AuditAction]:
    return [
        AuditAction(
            "lesson.created",
            "A lesson was published (its project, or null for the common collection; its kind; "
            "the submission and task that carried it, if one did)",
            frozenset({"project_id", "kind", "revision", "submission_id", "task_id"}),
            "lesson",
        ),
        AuditAction(
            "lesson.corrected",
            "A lesson was corrected: a new revision (its number, the reason, the fields changed)",
            frozenset({"revision", "reason", "changed"}),
            "lesson",
        ),
        AuditAction(
            "lesson.superseded",
            "A lesson was superseded by another (the replacement, the reason)",
            frozenset({"by", "reason"}),
            "lesson",
        ),
        AuditAction(
            "lesson.voted",
            "A principal voted on a lesson's usefulness (the revision, the vote)",
            frozenset({"revision", "vote"}),
            "lesson",
        ),
    ]


@hookimpl
def buildmax_agent_tools() -> tuple[AgentTool, ...]:
    from .tools import TOOLS

    return TOOLS
