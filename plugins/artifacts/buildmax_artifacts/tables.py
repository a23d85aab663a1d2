"""The artifacts plugin's tables (every name starts with ``artifact_``).

``artifact_artifacts`` holds finalized artifacts only: a row is written
after its bytes are durably stored and their digest checked. Deleting one
leaves a tombstone (who and when); an artifact whose bytes the collector
found gone is tombstoned as lost. ``artifact_quotas`` counts, per scope
(``deployment`` and ``space:<public id>``), the bytes stored and the bytes
reserved by uploads in flight; ``artifact_uploads`` names each reservation,
so one left by a crashed server can be released.
"""

from __future__ import annotations

import sqlalchemy as sa

from buildmax.tables import Id, Millis

metadata = sa.MetaData()

#: Kernel tables referenced by foreign key (declared here only for DDL).
_spaces = sa.Table("spaces", metadata, sa.Column("id", Id, primary_key=True))
_principals = sa.Table("principals", metadata, sa.Column("id", Id, primary_key=True))

artifacts = sa.Table(
    "artifact_artifacts",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("public_id", sa.Text, nullable=False, unique=True),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("media_type", sa.Text, nullable=False),
    sa.Column("size", sa.BigInteger, nullable=False),
    sa.Column("sha256", sa.Text, nullable=False),
    sa.Column("blob_key", sa.Text, nullable=False),
    # Public ids of the task and attempt it belongs to (tasks plugin), if any.
    sa.Column("task_id", sa.Text, nullable=True),
    sa.Column("attempt_id", sa.Text, nullable=True),
    sa.Column("pinned", sa.Integer, nullable=False, server_default="0"),
    sa.Column("created_at", Millis, nullable=False),
    sa.Column("created_by", Id, sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("deleted_at", Millis, nullable=True),
    sa.Column("deleted_by", Id, sa.ForeignKey("principals.id"), nullable=True),
    # Set (with deleted_at) when the collector found the bytes gone.
    sa.Column("lost_at", Millis, nullable=True),
    sa.Index("artifact_space_live", "space_id", "deleted_at", "id"),
    sa.Index("artifact_blob", "blob_key"),
)

quotas = sa.Table(
    "artifact_quotas",
    metadata,
    sa.Column("scope", sa.Text, primary_key=True),
    sa.Column("used", sa.BigInteger, nullable=False),
    sa.Column("reserved", sa.BigInteger, nullable=False),
)

uploads = sa.Table(
    "artifact_uploads",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("public_id", sa.Text, nullable=False, unique=True),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
    sa.Column("created_at", Millis, nullable=False),
    sa.Column("created_by", Id, sa.ForeignKey("principals.id"), nullable=False),
)

TABLES = (artifacts, quotas, uploads)
