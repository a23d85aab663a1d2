"""The kernel's essential internal plugin: it cannot be disabled.

It serves the kernel's routes, contributes the kernel's schema migration,
the ``file`` blob store and the kernel's audit actions, and runs the
kernel's housekeeping (expired idempotency receipts, old sign-in failures).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from buildmax_hookspecs import App, AuditAction, Migration, hookimpl

from .background import start_background, stop_background
from .blobstore import FileBlobStore
from .migrations import KERNEL, create_tables
from .tables import KERNEL_TABLES, backup_runs, event_outbox, sign_in_failures

if TYPE_CHECKING:
    from .app import BuildMax

log = logging.getLogger("buildmax.essentials")

SWEEP_INTERVAL_SECONDS = 300
_SWEEPER = "buildmax.sweeper"


@hookimpl
def buildmax_blueprints(app: App) -> list[Any]:
    from .routes import kernel_blueprints

    return kernel_blueprints()


@hookimpl
def buildmax_migrations() -> list[Migration]:
    return [
        Migration(
            KERNEL,
            1,
            "principals, tokens, spaces, members, receipts, events",
            create_tables(*KERNEL_TABLES),
        ),
        Migration(KERNEL, 2, "backup runs", create_tables(backup_runs)),
        Migration(KERNEL, 3, "event outbox", create_tables(event_outbox)),
    ]


@hookimpl
def buildmax_blob_stores() -> dict[str, Any]:
    return {"file": FileBlobStore.from_url}


def _action(name: str, description: str, *keys: str, target: str | None = None) -> AuditAction:
    return AuditAction(name, description, frozenset(keys), target)


@hookimpl
def buildmax_audit_actions() -> list[AuditAction]:
    return [
        _action("admin.bootstrapped", "The first admin was created", "name", target="principal"),
        _action(
            "principal.created",
            "A principal was created",
            "kind",
            "name",
            "system_role",
            target="principal",
        ),
        _action(
            "principal.updated",
            "A principal's display name changed",
            "display_name",
            target="principal",
        ),
        _action("principal.disabled", "A principal was disabled", target="principal"),
        _action("principal.enabled", "A principal was enabled again", target="principal"),
        _action(
            "principal.role_changed",
            "A principal's system role changed",
            "system_role",
            target="principal",
        ),
        _action("principal.password_set", "A principal's password was set", target="principal"),
        _action(
            "principal.password_cleared",
            "A restore cleared a password changed after its backup",
            target="principal",
        ),
        _action("session.created", "A human signed in", target="token"),
        _action(
            "token.created", "A token was created", "principal_id", "name", "scope", target="token"
        ),
        _action("token.revoked", "A token was revoked", "principal_id", target="token"),
        _action(
            "token.rotated",
            "A token was replaced by a twin",
            "principal_id",
            "replaces",
            target="token",
        ),
        _action(
            "system.restored",
            "The deployment was restored from a backup, in a new authority epoch",
            "manifest_sha256",
            "backup_created_at",
            "revoked_tokens",
            "kept_api_tokens",
            "lost_blobs",
            "event_id_stride",
            "generation_stride",
            "replayed_events",
        ),
        _action("space.created", "A space was created", "slug", "name", "owner_id", target="space"),
        _action("space.updated", "A space was renamed", "name", target="space"),
        _action(
            "space.member.added",
            "A member joined a space",
            "role",
            "previous_role",
            target="principal",
        ),
        _action(
            "space.member.role_changed",
            "A member's role changed",
            "role",
            "previous_role",
            target="principal",
        ),
        _action(
            "space.member.removed", "A member left a space", "previous_role", target="principal"
        ),
    ]


@hookimpl
def buildmax_audit_targets() -> dict[str, str]:
    return {
        "principal": "/v1/principals/{id}",
        "token": "/v1/tokens/{id}",
        "space": "/v1/spaces/{id}",
    }


async def _sweep_forever(app: BuildMax) -> None:
    while True:
        await asyncio.sleep(SWEEP_INTERVAL_SECONDS)
        try:
            await sweep(app)
        except Exception:
            log.exception("housekeeping sweep failed")


async def sweep(app: BuildMax) -> None:
    """Delete expired idempotency receipts and sign-in failures past their window."""
    await app.idempotency.sweep()
    horizon = app.clock.now_ms() - app.settings.sign_in_window_seconds * 1000
    async with app.db.write() as tx:
        await tx.execute(sa.delete(sign_in_failures).where(sign_in_failures.c.at < horizon))


@hookimpl
def buildmax_startup(app: BuildMax) -> None:
    start_background(app, _SWEEPER, _sweep_forever(app))


@hookimpl
async def buildmax_shutdown(app: App) -> None:
    await stop_background(app, _SWEEPER)
