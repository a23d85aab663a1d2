"""The reviews plugin's hook implementations (entry point ``reviews``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click
from buildmax_hookspecs import (
    Actor,
    App,
    AttemptRef,
    AuditAction,
    Migration,
    StageSpec,
    SubmissionRef,
    TaskRef,
    Transaction,
    Verdict,
    hookimpl,
)

from buildmax.migrations import create_tables

from . import workflow
from .tables import TABLES


@hookimpl
def buildmax_migrations() -> list[Migration]:
    return [
        Migration(
            "reviews",
            1,
            "review activities, reviews, findings, integrations",
            create_tables(*TABLES),
        )
    ]


@hookimpl
def buildmax_blueprints(app: App) -> list[Any]:
    from .routes import blueprint

    return [blueprint]


@hookimpl
def buildmax_register_commands(cli: click.Group) -> None:
    from .commands import review_group

    cli.add_command(review_group)


@hookimpl
def buildmax_workflow_stages() -> list[StageSpec]:
    return list(workflow.STAGES)


@hookimpl
async def buildmax_stage_entered(
    app: App, tx: Transaction, subject: TaskRef, stage: str, work: Sequence[TaskRef], actor: Actor
) -> None:
    await workflow.stage_entered(app, tx, subject, stage, work, actor)


@hookimpl
async def buildmax_claim_check(
    app: App, tx: Transaction, task: TaskRef, principal: Actor
) -> Verdict | None:
    return await workflow.claim_check(app, tx, task, principal)


@hookimpl
async def buildmax_attempt_submitted(
    app: App,
    tx: Transaction,
    task: TaskRef,
    attempt: AttemptRef,
    submission: SubmissionRef,
    actor: Actor,
) -> Verdict | None:
    return await workflow.attempt_submitted(app, tx, task, attempt, submission, actor)


@hookimpl
def buildmax_audit_targets() -> dict[str, str]:
    return {
        "review": "/v1/spaces/{space}/reviews/{id}",
        "integration": "/v1/spaces/{space}/reviews/{id}",
        "finding": "/v1/spaces/{space}/findings/{id}",
    }


@hookimpl
def buildmax_audit_actions() -> list[AuditAction]:
    return [
        AuditAction(
            "review.recorded",
            "A review was recorded on a submission (its decision, whether its author is human, "
            "its findings' ids)",
            frozenset(
                {"task_id", "subject_id", "submission_id", "decision", "human", "finding_ids"}
            ),
            "review",
        ),
        AuditAction(
            "integration.recorded",
            "An integration was recorded (its target, outcome and refs)",
            frozenset(
                {"task_id", "subject_id", "submission_id", "target", "outcome", "before", "after"}
            ),
            "integration",
        ),
        AuditAction(
            "finding.resolved",
            "A review finding was marked resolved",
            frozenset({"subject_id", "review_id"}),
            "finding",
        ),
    ]
