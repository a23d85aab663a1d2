"""The marketplace plugin's tables (every name starts with ``market_``).

``market_plugins`` is the catalog's list of plugin names (who first
published each, whether it is archived); ``market_releases`` holds each
published release: its PEP 440 version, the sha256 and size of the exact
bytes uploaded, where the blob store keeps them, and its capability report.
A release is never deleted or changed, only yanked (with a reason) or
marked eligible for unattended use by a system admin.
"""

from __future__ import annotations

import sqlalchemy as sa

from buildmax.tables import Id, Millis, one_of

from .materialize import REASONS

metadata = sa.MetaData()

#: Kernel tables referenced by foreign key (declared here only for DDL).
_principals = sa.Table("principals", metadata, sa.Column("id", Id, primary_key=True))
_spaces = sa.Table("spaces", metadata, sa.Column("id", Id, primary_key=True))

CURATION_MODES = ("open", "curated")
ORIGINS = ("curated", "automatic")

plugins = sa.Table(
    "market_plugins",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("name", sa.Text, nullable=False, unique=True),
    sa.Column("description", sa.Text, nullable=False, server_default=""),
    sa.Column("publisher_id", Id, sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("created_at", Millis, nullable=False),
    sa.Column("archived_at", Millis, nullable=True),
    sa.Column("archived_by", Id, sa.ForeignKey("principals.id"), nullable=True),
    sa.Column("archive_reason", sa.Text, nullable=True),
)

releases = sa.Table(
    "market_releases",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("plugin_id", Id, sa.ForeignKey("market_plugins.id"), nullable=False),
    # Normalised PEP 440 version (``1.2.0``), unique per plugin.
    sa.Column("version", sa.Text, nullable=False),
    sa.Column("sha256", sa.Text, nullable=False),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("blob_key", sa.Text, nullable=False),
    sa.Column("description", sa.Text, nullable=False, server_default=""),
    # Canonical JSON of the capability report.
    sa.Column("report", sa.Text, nullable=False),
    # 1 when it contributes hooks or MCP servers (it starts processes).
    sa.Column("executable", sa.Integer, nullable=False),
    sa.Column("published_by", Id, sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("published_at", Millis, nullable=False),
    sa.Column("yanked_at", Millis, nullable=True),
    sa.Column("yanked_by", Id, sa.ForeignKey("principals.id"), nullable=True),
    sa.Column("yank_reason", sa.Text, nullable=True),
    sa.Column("eligible_at", Millis, nullable=True),
    sa.Column("eligible_by", Id, sa.ForeignKey("principals.id"), nullable=True),
    sa.UniqueConstraint("plugin_id", "version", name="market_release_version"),
)

#: One row per space and plugin: the exact release its runs may load.
activations = sa.Table(
    "market_activations",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    sa.Column("plugin_id", Id, sa.ForeignKey("market_plugins.id"), nullable=False),
    sa.Column("release_id", Id, sa.ForeignKey("market_releases.id"), nullable=False),
    sa.Column("enabled", sa.Integer, nullable=False),
    sa.Column("origin", sa.Text, nullable=False),
    sa.Column("activated_by", Id, sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("activated_at", Millis, nullable=False),
    sa.Column("updated_by", Id, sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("updated_at", Millis, nullable=False),
    sa.UniqueConstraint("space_id", "plugin_id", name="market_activation_space_plugin"),
    sa.CheckConstraint("origin IN ('curated', 'automatic')", name="market_activation_origin"),
)

#: A space's curation mode; a space without a row is ``open``.
curation = sa.Table(
    "market_curation",
    metadata,
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), primary_key=True),
    sa.Column("mode", sa.Text, nullable=False),
    sa.Column("updated_by", Id, sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("updated_at", Millis, nullable=False),
    sa.CheckConstraint("mode IN ('open', 'curated')", name="market_curation_mode"),
)

#: Materializations a worker reported it could not finish: the attempt (its
#: public id, tasks plugin), the space and the reason's code; the words of
#: the error stay on the worker (and in the attempt's failure reason).
materialization_failures = sa.Table(
    "market_materialization_failures",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    sa.Column("attempt_id", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("reported_by", Id, sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("created_at", Millis, nullable=False),
    sa.CheckConstraint(one_of("reason", tuple(REASONS)), name="market_failure_reason"),
)
sa.Index(
    "market_materialization_failures_space",
    materialization_failures.c.space_id,
    materialization_failures.c.created_at,
)
sa.Index("market_materialization_failures_age", materialization_failures.c.created_at)

#: Created by migration 1.
TABLES = [plugins, releases, activations, curation]
#: Created by migration 2.
TABLES_2 = [materialization_failures]
