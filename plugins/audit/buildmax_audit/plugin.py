"""The audit plugin's hook implementations (entry point ``audit``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click
from buildmax_hookspecs import App, AuditAction, AuditEvent, Migration, Transaction, hookimpl

from buildmax.background import start_background, stop_background
from buildmax.migrations import create_tables

from .chain import Appender
from .retention import sweep_forever
from .settings import audit_settings
from .tables import RETENTION_ACTION, TABLES

_SWEEPER = "buildmax_audit.sweeper"
_APPENDER = "buildmax_audit.appender"


@hookimpl
def buildmax_migrations() -> list[Migration]:
    return [Migration("audit", 1, "audit chains and events", create_tables(*TABLES))]


@hookimpl
def buildmax_audit_record(app: App, tx: Transaction, event: AuditEvent) -> None:
    appender = app.extensions.get(_APPENDER)
    if appender is None:
        appender = app.extensions[_APPENDER] = Appender()
    appender.add(tx, event)


@hookimpl
def buildmax_audit_actions() -> list[AuditAction]:
    return [
        AuditAction(
            RETENTION_ACTION,
            "Retention removed a chain's oldest events; the last one removed is its anchor",
            frozenset({"removed", "through_seq", "anchor_hash", "retention_days"}),
            "audit_chain",
        )
    ]


@hookimpl
def buildmax_blueprints(app: App) -> list[Any]:
    from .routes import blueprint

    audit_settings(app)  # a bad [plugins.audit] table stops the app being built
    return [blueprint]


@hookimpl
def buildmax_register_commands(cli: click.Group) -> None:
    from .commands import audit_group

    cli.add_command(audit_group)


@hookimpl
def buildmax_startup(app: App) -> None:
    if audit_settings(app).retention_days > 0:
        start_background(app, _SWEEPER, sweep_forever(app))


@hookimpl
async def buildmax_shutdown(app: App) -> None:
    await stop_background(app, _SWEEPER)


@hookimpl
async def buildmax_backup_facts(conn: Transaction) -> dict[str, Any]:
    from .backup import chain_heads_in

    return await chain_heads_in(conn)


@hookimpl
async def buildmax_backup_check(app: App, facts: Mapping[str, Any]) -> list[str]:
    from .backup import check_heads

    return await check_heads(app, facts)


@hookimpl
def buildmax_restore_replay(path: str, facts: Mapping[str, Any]) -> list[AuditEvent]:
    from .backup import events_after

    return events_after(path, facts)
