"""The imports plugin's hook implementations (entry point ``imports``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import click
from buildmax_hookspecs import AuditAction, BlobRef, Importer, Migration, Transaction, hookimpl

from buildmax.app import BuildMax
from buildmax.migrations import create_tables

from . import beads, csvfile, github
from .sources import importers
from .tables import TABLES


@hookimpl
def buildmax_importers() -> list[Importer]:
    return [beads.IMPORTER, csvfile.IMPORTER, github.IMPORTER]


@hookimpl
def buildmax_startup(app: BuildMax) -> None:
    # Two plugins offering one importer name stop the server here.
    importers(app.hooks)


@hookimpl
def buildmax_migrations() -> list[Migration]:
    return [
        Migration(
            "imports",
            1,
            "imports, their applied chunks, and the mapping of source records to tasks",
            create_tables(*TABLES),
        )
    ]


@hookimpl
def buildmax_blueprints(app: BuildMax) -> list[Any]:
    from .routes import blueprint

    return [blueprint]


@hookimpl
def buildmax_register_commands(cli: click.Group) -> None:
    from .commands import import_group

    cli.add_command(import_group)


@hookimpl
def buildmax_backup_blobs(conn: Transaction) -> AsyncIterator[BlobRef]:
    from .backup import kept_files

    return kept_files(conn)


@hookimpl
def buildmax_audit_targets() -> dict[str, str]:
    return {"import": "/v1/spaces/{space}/imports/{id}"}


@hookimpl
def buildmax_audit_actions() -> list[AuditAction]:
    return [
        AuditAction(
            "import.previewed",
            "A file was previewed for import (its project, format, digest, the preview's "
            "identity, chunks and counts)",
            frozenset(
                {
                    "project_id",
                    "format",
                    "file_sha256",
                    "identity",
                    "chunks",
                    "records",
                    "create",
                    "update",
                    "unchanged",
                    "conflict",
                    "problems",
                    "refused",
                }
            ),
            "import",
        ),
        AuditAction(
            "import.chunk.applied",
            "A chunk of an import was applied (its number, of how many, and its counts)",
            frozenset({"chunk", "of", "create", "update", "unchanged", "conflict"}),
            "import",
        ),
    ]
