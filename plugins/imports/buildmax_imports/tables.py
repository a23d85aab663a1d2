"""The imports plugin's tables (every name starts with ``import_``).

``import_imports`` holds one row per previewed file: where it goes (a
space, a project by the tasks plugin's public id), what it was read with,
the file's digest and where its bytes are kept, the preview's identity,
what it assumed of the space's earlier imports (``earlier``, JSON by
source id), what it found (``summary``) and how many of its chunks are
applied. ``import_chunks``
holds each applied chunk's report. ``import_mappings`` is the stable
mapping of a space's source records to their tasks: the task, the digest
of the record as last applied, what of it was applied and the task's
revision after it (a task whose revision moved since was changed here).
"""

from __future__ import annotations

import sqlalchemy as sa

from buildmax.tables import Id, Millis, one_of

metadata = sa.MetaData()

#: Kernel tables referenced by foreign key (declared here only for DDL).
_spaces = sa.Table("spaces", metadata, sa.Column("id", Id, primary_key=True))
_principals = sa.Table("principals", metadata, sa.Column("id", Id, primary_key=True))

#: An import's states: previewed, some chunks applied, every chunk applied.
STATES = ("previewed", "applying", "applied")

imports = sa.Table(
    "import_imports",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("public_id", sa.Text, nullable=False, unique=True),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    sa.Column("project_id", sa.Text, nullable=False),
    sa.Column("format", sa.Text, nullable=False),
    sa.Column("file_name", sa.Text, nullable=True),
    sa.Column("file_sha256", sa.Text, nullable=False),
    sa.Column("file_size", sa.BigInteger, nullable=False),
    sa.Column("blob_key", sa.Text, nullable=False),
    sa.Column("identity", sa.Text, nullable=False),
    sa.Column("service_revision", sa.Text, nullable=False),
    sa.Column("chunk_size", sa.Integer, nullable=False),
    sa.Column("chunk_count", sa.Integer, nullable=False),
    sa.Column("chunks_applied", sa.Integer, nullable=False, server_default="0"),
    sa.Column("state", sa.Text, nullable=False),
    # What the preview counted (JSON): records per action, problems, refused edges.
    sa.Column("counts", sa.Text, nullable=False),
    # What the preview assumed of earlier imports (JSON, by source id).
    sa.Column("earlier", sa.Text, nullable=False),
    # What the preview found (JSON): its chunks, the file's problems, the
    # edges left out; shown without planning the file again.
    sa.Column("summary", sa.Text, nullable=False),
    sa.Column("created_by", Id, sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("created_at", Millis, nullable=False),
    sa.Column("updated_at", Millis, nullable=False),
    sa.CheckConstraint(one_of("state", STATES), name="import_state"),
)
sa.Index("import_imports_space", imports.c.space_id, imports.c.id)

chunks = sa.Table(
    "import_chunks",
    metadata,
    sa.Column("import_id", Id, sa.ForeignKey("import_imports.id"), primary_key=True),
    sa.Column("number", sa.Integer, primary_key=True),
    sa.Column("applied_at", Millis, nullable=False),
    sa.Column("applied_by", Id, sa.ForeignKey("principals.id"), nullable=False),
    # What each record of the chunk became (JSON).
    sa.Column("report", sa.Text, nullable=False),
)

mappings = sa.Table(
    "import_mappings",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    sa.Column("system", sa.Text, nullable=False),
    sa.Column("source_id", sa.Text, nullable=False),
    sa.Column("task_id", sa.Text, nullable=False),
    sa.Column("digest", sa.Text, nullable=False),
    sa.Column("revision", sa.Integer, nullable=False),
    # What was applied of the record (JSON): its state, and its
    # prerequisites and links by source id. A later import adds only what
    # is new since, so what a person took away stays away.
    sa.Column("applied", sa.Text, nullable=False),
    sa.Column("import_id", Id, sa.ForeignKey("import_imports.id"), nullable=False),
    sa.Column("updated_at", Millis, nullable=False),
    sa.UniqueConstraint("space_id", "system", "source_id", name="import_mappings_source"),
)

TABLES = (imports, chunks, mappings)
