"""The marketplace plugin's hook implementations (entry point ``marketplace``)."""

from __future__ import annotations

from typing import Any

from buildmax_hookspecs import AuditAction, Migration, hookimpl

from buildmax.migrations import create_tables

from .schema import TABLES
from .settings import marketplace_settings

_RELEASE_KEYS = frozenset({"version", "sha256_prefix"})


@hookimpl
def buildmax_migrations() -> list[Migration]:
    return [Migration("marketplace", 1, "catalog plugins and releases", create_tables(*TABLES))]


@hookimpl
def buildmax_blueprints(app: Any) -> list[Any]:
    from .routes import blueprint

    marketplace_settings(app)  # a bad [plugins.marketplace] table stops the app being built
    return [blueprint]


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
            "catalog.plugin.archived",
            "A plugin was archived (pins on its releases stay)",
            frozenset({"reason"}),
            "catalog_plugin",
        ),
    ]
