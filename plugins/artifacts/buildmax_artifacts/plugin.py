"""The artifacts plugin's hook implementations (entry point ``artifacts``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import click
from buildmax_hookspecs import (
    AgentTool,
    App,
    AttemptRef,
    AuditAction,
    BlobRef,
    Gauge,
    Migration,
    Restoration,
    SubmissionRef,
    TaskRef,
    Transaction,
    Verdict,
    hookimpl,
)

from buildmax.background import start_background, stop_background
from buildmax.migrations import create_tables

from . import diagnostics
from .evidence import submission_check
from .settings import artifact_settings
from .tables import TABLES

if TYPE_CHECKING:
    from buildmax.app import BuildMax

_MAINTENANCE = "buildmax_artifacts.maintenance"


@hookimpl
def buildmax_migrations() -> list[Migration]:
    return [Migration("artifacts", 1, "artifacts, quotas, uploads", create_tables(*TABLES))]


@hookimpl
def buildmax_blueprints(app: App) -> list[Any]:
    from .routes import blueprint

    artifact_settings(app)  # a bad [plugins.artifacts] table stops the app being built
    return [blueprint]


@hookimpl
def buildmax_audit_actions() -> list[AuditAction]:
    return [
        AuditAction(
            "artifact.uploaded",
            "An artifact was uploaded (its name, type, size and digest; never its bytes)",
            frozenset(
                {
                    "name",
                    "media_type",
                    "size",
                    "sha256",
                    "task_id",
                    "attempt_id",
                    "generation",
                    "override_reason",
                }
            ),
            "artifact",
        ),
        AuditAction(
            "artifact.deleted", "An artifact was deleted (a tombstone)", frozenset(), "artifact"
        ),
        AuditAction(
            "artifact.expired",
            "Retention tombstoned an unpinned artifact",
            frozenset({"retention_days"}),
            "artifact",
        ),
        AuditAction(
            "artifact.pinned",
            "An artifact was pinned (kept past retention)",
            frozenset(),
            "artifact",
        ),
        AuditAction("artifact.unpinned", "An artifact's pin was removed", frozenset(), "artifact"),
        AuditAction(
            "artifact.blob_collected",
            "The collector removed bytes no live artifact referenced (deleted, expired or "
            "never finalized)",
            frozenset({"sha256", "size"}),
        ),
        AuditAction(
            "artifact.lost",
            "The collector found an artifact's bytes gone and tombstoned it",
            frozenset(),
            "artifact",
        ),
    ]


@hookimpl
async def buildmax_submission_check(
    tx: Transaction, task: TaskRef, attempt: AttemptRef, submission: SubmissionRef
) -> Verdict | None:
    return await submission_check(tx, task, attempt, submission)


@hookimpl
async def buildmax_gauges(app: BuildMax, conn: Transaction) -> list[Gauge]:
    return await diagnostics.gauges(app, conn)


@hookimpl
def buildmax_startup(app: BuildMax) -> None:
    from .retention import maintain_forever

    start_background(app, _MAINTENANCE, maintain_forever(app))


@hookimpl
async def buildmax_shutdown(app: App) -> None:
    await stop_background(app, _MAINTENANCE)


@hookimpl
def buildmax_register_commands(cli: click.Group) -> None:
    from .commands import artifacts_group

    cli.add_command(artifacts_group)


@hookimpl
def buildmax_audit_targets() -> dict[str, str]:
    return {"artifact": "/v1/spaces/{space}/artifacts/{id}"}


@hookimpl
def buildmax_backup_blobs(conn: Transaction) -> AsyncIterator[BlobRef]:
    from .backup import live_blobs

    return live_blobs(conn)


@hookimpl
async def buildmax_restored(app: App, tx: Transaction, restoration: Restoration) -> list[str]:
    from .backup import restored

    return await restored(app, tx, restoration)


@hookimpl
def buildmax_agent_tools() -> tuple[AgentTool, ...]:
    from .tools import TOOLS

    return TOOLS
