"""The reviews plugin's hook implementations (entry point ``reviews``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click
import sqlalchemy as sa
from buildmax_hookspecs import (
    Actor,
    AgentTool,
    App,
    AttemptRef,
    Attention,
    AuditAction,
    Gauge,
    Migration,
    StageSpec,
    SubmissionRef,
    TaskRef,
    Transaction,
    Verdict,
    hookimpl,
)

from buildmax.migrations import create_tables

from . import diagnostics, workflow
from .settings import review_settings
from .tables import TABLES, TABLES_2, activities, reviews, waiting


@hookimpl
def buildmax_migrations() -> list[Migration]:
    return [
        Migration(
            "reviews",
            1,
            "review activities, reviews, findings, integrations",
            create_tables(*TABLES),
        ),
        Migration("reviews", 2, "review work waiting for its review", _create_waiting),
    ]


_later = activities.alias("later")
#: Review work recorded before ``review_waiting`` existed that still waits:
#: nothing recorded on it, no slot of its submission asked for changes or
#: rejected, and no later submission of its subject.
_STILL_WAITING = sa.select(activities.c.id, activities.c.space_id, activities.c.created_at).where(
    activities.c.kind == "review",
    ~sa.exists(sa.select(reviews.c.id).where(reviews.c.activity_id == activities.c.id)),
    ~sa.exists(
        sa.select(reviews.c.id).where(
            reviews.c.submission_id == activities.c.submission_id,
            reviews.c.decision.in_(("request_changes", "reject")),
        )
    ),
    ~sa.exists(
        sa.select(_later.c.id).where(
            _later.c.subject_task_id == activities.c.subject_task_id,
            _later.c.submission_id != activities.c.submission_id,
            _later.c.id > activities.c.id,
        )
    ),
)


async def _create_waiting(tx: Transaction) -> None:
    await create_tables(*TABLES_2)(tx)
    await tx.execute(
        waiting.insert().from_select(["activity_id", "space_id", "created_at"], _STILL_WAITING)
    )


@hookimpl
def buildmax_blueprints(app: App) -> list[Any]:
    from .routes import blueprint

    review_settings(app)  # a bad [plugins.reviews] table stops the app being built
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
async def buildmax_gauges(app: App, conn: Transaction) -> list[Gauge]:
    return await diagnostics.gauges(app, conn)


@hookimpl
async def buildmax_attention(
    app: App, conn: Transaction, now: int, space_pk: int | None
) -> list[Attention]:
    return await diagnostics.attention(app, conn, now, space_pk)


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


@hookimpl
def buildmax_agent_tools() -> tuple[AgentTool, ...]:
    from .tools import TOOLS

    return TOOLS
