"""The tasks plugin's hook implementations (entry point ``tasks``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
from buildmax_hookspecs import (
    Actor,
    AgentTool,
    Attention,
    AuditAction,
    Gauge,
    Migration,
    Restoration,
    TaskQueue,
    Transaction,
    hookimpl,
)
from sqlalchemy.schema import CreateIndex

from buildmax.background import start_background, stop_background
from buildmax.migrations import add_columns, create_tables

from . import diagnostics
from .attempt_tokens import TOKEN_KIND, attempt_token_reminter
from .membership import member_changed
from .queue import SqlTaskQueue
from .reaper import reap_forever
from .search import TASK_SEARCH
from .search import create_index as create_search_index
from .settings import task_settings
from .tables import (
    TABLES,
    TABLES_2,
    TASKS_BY_PROJECT_STATE,
    TASKS_BY_SOURCE,
    TASKS_BY_SPACE,
    tasks,
)

if TYPE_CHECKING:
    from buildmax.app import BuildMax

_REAPER = "buildmax_tasks.reaper"


@hookimpl
def buildmax_migrations() -> list[Migration]:
    return [
        Migration(
            "tasks",
            1,
            "projects, policies, agents, tasks, dependencies, attempts, submissions, "
            "reservations, holds, decisions",
            create_tables(*TABLES),
        ),
        Migration("tasks", 2, "the artifacts a submission names", create_tables(*TABLES_2)),
        Migration("tasks", 3, "the task list's indexes", _index_task_lists),
        Migration(
            "tasks",
            4,
            "task search: a full-text index of each task's title and criteria",
            create_search_index,
        ),
        Migration(
            "tasks", 5, "task search keeps each task's row whole", TASK_SEARCH.keep_rows_whole
        ),
        Migration("tasks", 6, "a task's source record and its links", _source_and_links),
    ]


async def _source_and_links(tx: Transaction) -> None:
    await add_columns(tasks, "source_system", "source_id", "links")(tx)
    await tx.execute(CreateIndex(TASKS_BY_SOURCE, if_not_exists=True))


async def _index_task_lists(tx: Transaction) -> None:
    # A database created at version 1 since they were declared has them.
    for index in (TASKS_BY_SPACE, TASKS_BY_PROJECT_STATE):
        await tx.execute(CreateIndex(index, if_not_exists=True))


@hookimpl
def buildmax_blueprints(app: BuildMax) -> list[Any]:
    from .routes import blueprints

    task_settings(app)  # a bad [plugins.tasks] table stops the app being built
    return blueprints()


@hookimpl
def buildmax_services(app: BuildMax) -> dict[type, Any]:
    return {TaskQueue: SqlTaskQueue(app)}


@hookimpl
def buildmax_register_commands(cli: click.Group) -> None:
    from .commands import register

    register(cli)


@hookimpl
def buildmax_startup(app: BuildMax) -> None:
    from .routes import tasks_state

    tasks_state(app)  # inconsistent stages stop start-up here
    app.idempotency.register_reminter(TOKEN_KIND, attempt_token_reminter(app))
    interval = task_settings(app).reap_interval_seconds
    start_background(app, _REAPER, reap_forever(app, interval))


@hookimpl
async def buildmax_shutdown(app: BuildMax) -> None:
    await stop_background(app, _REAPER)


@hookimpl
async def buildmax_gauges(app: BuildMax, conn: Transaction) -> list[Gauge]:
    return await diagnostics.gauges(app, conn)


@hookimpl
async def buildmax_attention(
    app: BuildMax, conn: Transaction, now: int, space_pk: int | None
) -> list[Attention]:
    return await diagnostics.attention(app, conn, now, space_pk)


@hookimpl
async def buildmax_member_changed(
    app: BuildMax, tx: Transaction, space_id: str, principal_id: str, role: str | None, actor: Actor
) -> None:
    await member_changed(app, tx, space_id, principal_id, role, actor)


@hookimpl
def buildmax_audit_targets() -> dict[str, str]:
    return {
        "project": "/v1/spaces/{space}/projects/{id}",
        "task": "/v1/spaces/{space}/tasks/{id}",
        "attempt": "/v1/spaces/{space}/attempts/{id}",
        "agent": "/v1/spaces/{space}/agents/{id}",
    }


def _action(name: str, description: str, target: str, *keys: str) -> AuditAction:
    # Any change may be an admin or owner overriding an attempt's owner.
    return AuditAction(name, description, frozenset((*keys, "override_reason")), target)


@hookimpl
def buildmax_audit_actions() -> list[AuditAction]:
    attempt_keys = ("task_id", "generation", "reason")
    return [
        _action("project.created", "A project was created", "project", "name"),
        _action("project.updated", "A project was edited", "project", "fields", "revision"),
        _action(
            "policy.revised",
            "A project's workflow policy got a new revision",
            "project",
            "revision",
            "approvals_required",
            "human_review_required",
            "integration",
        ),
        _action(
            "task.created",
            "A task was created",
            "task",
            "project_id",
            "kind",
            "priority",
            "prerequisites",
            "source",
            "state",
        ),
        _action("task.revised", "A task got a new revision", "task", "revision", "fields"),
        _action("task.links.set", "A task's links to other tasks were replaced", "task", "links"),
        _action("task.dependency.added", "A prerequisite was added", "task", "prerequisite_id"),
        _action("task.dependency.removed", "A prerequisite was removed", "task", "prerequisite_id"),
        _action(
            "task.claimed",
            "A task was claimed: a new attempt with a lease",
            "task",
            "attempt_id",
            "generation",
            "lease_expires_at",
            "agent_revision_id",
            "skipped",
        ),
        _action("task.done", "A task was completed", "task"),
        _action("task.failed", "A task failed", "task", "reason"),
        _action("task.canceled", "A task was canceled", "task", "reason"),
        _action("task.retried", "A task was retried", "task", "previous_state", "state"),
        _action(
            "task.reopened",
            "A stage asked for changes: the task is claimable again",
            "task",
            "stage",
            "finding_ids",
            "reason",
        ),
        _action(
            "task.stage_entered", "A task entered a workflow stage", "task", "stage", "work_ids"
        ),
        _action(
            "attempt.renewed",
            "An attempt's lease was renewed",
            "attempt",
            "generation",
            "lease_expires_at",
        ),
        _action(
            "attempt.checkpointed", "An attempt recorded a checkpoint", "attempt", "generation"
        ),
        _action("attempt.released", "An attempt was released", "attempt", *attempt_keys),
        _action("attempt.failed", "An attempt failed", "attempt", *attempt_keys),
        _action("attempt.canceled", "An attempt was canceled", "attempt", *attempt_keys),
        _action(
            "attempt.expired",
            "An attempt's lease lapsed (or a restore ended it) and it was retired",
            "attempt",
            "task_id",
            "generation",
            "charged",
            "reason",
        ),
        _action(
            "attempt.submitted",
            "An attempt handed in its work",
            "attempt",
            "task_id",
            "generation",
            "submission_id",
        ),
        _action(
            "hold.created",
            "A hold was placed",
            "hold",
            "scope_type",
            "scope_id",
            "strength",
            "reason",
        ),
        _action("hold.lifted", "A hold was lifted", "hold"),
        _action(
            "decision.opened",
            "A decision was asked",
            "decision",
            "task_id",
            "answerable_by",
            "option_count",
        ),
        _action("decision.answered", "A decision was answered", "decision", "task_id", "answer"),
        _action("agent.created", "An agent was defined", "agent", "name"),
        _action("agent.revised", "An agent got a new revision", "agent", "revision", "plugins"),
    ]


@hookimpl
async def buildmax_restored(app: BuildMax, tx: Transaction, restoration: Restoration) -> list[str]:
    from .restore import enter_epoch

    return await enter_epoch(app, tx, restoration)


@hookimpl
def buildmax_agent_tools() -> tuple[AgentTool, ...]:
    from .tools import TOOLS

    return TOOLS
