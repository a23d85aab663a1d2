"""The marketplace plugin's hook implementations (entry point ``marketplace``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import click
from buildmax_hookspecs import (
    Actor,
    AgentRevisionRef,
    App,
    AttemptRef,
    Attention,
    AuditAction,
    BlobRef,
    Migration,
    ReleaseRef,
    Restoration,
    Transaction,
    Verdict,
    hookimpl,
)

from buildmax.migrations import create_tables

from . import diagnostics, runs
from .activation import eligibility_verdict
from .settings import marketplace_settings
from .tables import TABLES, TABLES_2

if TYPE_CHECKING:
    from buildmax.app import BuildMax

_RELEASE_KEYS = frozenset({"version", "sha256_prefix"})
_ACTIVATION_KEYS = _RELEASE_KEYS | {"plugin"}


@hookimpl
def buildmax_migrations() -> list[Migration]:
    return [
        Migration(
            "marketplace",
            1,
            "catalog plugins and releases, space activations and curation",
            create_tables(*TABLES),
        ),
        Migration(
            "marketplace",
            2,
            "materializations workers reported failed",
            create_tables(*TABLES_2),
        ),
    ]


@hookimpl
def buildmax_blueprints(app: App) -> list[Any]:
    from .routes import blueprint
    from .spaces import blueprint as space_blueprint

    marketplace_settings(app)  # a bad [plugins.marketplace] table stops the app being built
    return [blueprint, space_blueprint]


@hookimpl
def buildmax_register_commands(cli: click.Group) -> None:
    from .commands import catalog_group, run_group

    cli.add_command(catalog_group)
    cli.add_command(run_group)


@hookimpl
def buildmax_activation_policy(
    tx: Transaction, space_id: str, release: ReleaseRef, actor: Actor
) -> Verdict | None:
    return eligibility_verdict(release)


@hookimpl
async def buildmax_agent_revision(
    app: BuildMax, tx: Transaction, space_id: str, revision: AgentRevisionRef, actor: Actor
) -> Verdict | None:
    return await runs.agent_revision(app, tx, space_id, revision, actor)


@hookimpl
async def buildmax_run_environment(
    app: BuildMax, tx: Transaction, attempt: AttemptRef, agent_revision: AgentRevisionRef | None
) -> dict[str, Any]:
    return await runs.run_environment(app, tx, attempt, agent_revision)


@hookimpl
def buildmax_audit_targets() -> dict[str, str]:
    return {"catalog_plugin": "/v1/catalog/{id}"}


@hookimpl
def buildmax_audit_actions() -> list[AuditAction]:
    return [
        AuditAction(
            "catalog.release.published",
            "A release was published to the catalog (version, digest prefix, size, whether it "
            "starts processes)",
            _RELEASE_KEYS | {"size", "executable"},
            "catalog_plugin",
        ),
        AuditAction(
            "catalog.release.yanked",
            "A release was yanked (pins on it stay)",
            _RELEASE_KEYS | {"reason"},
            "catalog_plugin",
        ),
        AuditAction(
            "catalog.release.lost",
            "A restore could not put a release's package back: it is yanked",
            _RELEASE_KEYS | {"reason"},
            "catalog_plugin",
        ),
        AuditAction(
            "catalog.release.eligible",
            "A system admin marked a release eligible for unattended use",
            _RELEASE_KEYS,
            "catalog_plugin",
        ),
        AuditAction(
            "catalog.release.ineligible",
            "A system admin withdrew a release's eligibility for unattended use",
            _RELEASE_KEYS,
            "catalog_plugin",
        ),
        AuditAction(
            "activation.created",
            "A space activated a release (origin curated or automatic)",
            _ACTIVATION_KEYS | {"origin"},
            "catalog_plugin",
        ),
        AuditAction(
            "activation.pin_moved",
            "A space moved its pin to another release",
            _ACTIVATION_KEYS | {"from_version"},
            "catalog_plugin",
        ),
        AuditAction(
            "activation.suspended",
            "A space suspended an activation (runs naming it are refused)",
            _ACTIVATION_KEYS,
            "catalog_plugin",
        ),
        AuditAction(
            "activation.resumed",
            "A space resumed an activation",
            _ACTIVATION_KEYS,
            "catalog_plugin",
        ),
        AuditAction(
            "curation.changed",
            "A space's curation mode changed (open or curated)",
            frozenset({"mode", "previous"}),
            "space",
        ),
        AuditAction(
            "run.materialization_failed",
            "A worker reported that it could not materialize an attempt's pinned packages "
            "(the reason's code)",
            frozenset({"reason"}),
            "attempt",
        ),
        AuditAction(
            "catalog.plugin.archived",
            "A plugin was archived (pins on its releases stay)",
            frozenset({"reason"}),
            "catalog_plugin",
        ),
    ]


@hookimpl
async def buildmax_attention(
    app: BuildMax, conn: Transaction, now: int, space_pk: int | None
) -> list[Attention]:
    return await diagnostics.attention(app, conn, now, space_pk)


@hookimpl
def buildmax_backup_blobs(conn: Transaction) -> AsyncIterator[BlobRef]:
    from .backup import release_blobs

    return release_blobs(conn)


@hookimpl
async def buildmax_restored(app: BuildMax, tx: Transaction, restoration: Restoration) -> list[str]:
    from .backup import restored

    return await restored(app, tx, restoration)
