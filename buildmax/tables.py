"""The kernel's own tables: migrations, identity, spaces, receipts, events.

Column types are limited to what both engines return unchanged (Integer,
BigInteger, Text, String, LargeBinary): JSON is stored as Text and booleans
as nullable timestamps, so a row reads the same on SQLite and PostgreSQL.
Timestamps are UTC epoch milliseconds (BigInteger).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

metadata = sa.MetaData()

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Millis = sa.BigInteger


def row_field(column: sa.Column[Any]) -> str:
    """The field a typed row reads ``column`` into: ``pk`` for the numeric
    key ``id``, ``id`` for ``public_id``, ``<name>_pk`` for another numeric
    key (``task_id``, or ``created_by`` by its foreign key); text columns and
    plain values keep their names (``token_id`` holds a public id)."""
    if column.name == "id":
        return "pk"
    if column.name == "public_id":
        return "id"
    if isinstance(column.type, sa.Text):
        return column.name
    if column.name.endswith("_id"):
        return column.name.removesuffix("_id") + "_pk"
    if column.foreign_keys:
        return column.name + "_pk"
    return column.name


def keyed(table: sa.Table) -> list[sa.Label[Any]]:
    """Every column of ``table`` labelled with its :func:`row_field`: select
    them to read rows straight into a dataclass of those fields."""
    return [column.label(row_field(column)) for column in table.c]


def keyed_insert(table: sa.Table) -> sa.Insert:
    """``INSERT`` of every column of ``table`` but its key, each value bound
    by its :func:`row_field` (``task_pk``, ``id``, ...), returning the new
    key: the values of a typed row, less ``pk``, are its parameters."""
    return (
        table.insert()
        .values({c.name: sa.bindparam(row_field(c)) for c in table.c if c.name != "id"})
        .returning(table.c.id)
    )


def bound_insert(table: sa.Table, *columns: str) -> sa.Insert:
    """``INSERT`` of ``columns`` of ``table``, each value bound by the
    column's own name. Built once (at import), it is compiled once; an
    insert built per call pays for its construction and cache key each time."""
    return table.insert().values(
        {name: sa.bindparam(name, type_=table.c[name].type) for name in columns}
    )


def one_of(column: str, values: tuple[str, ...]) -> str:
    """A CHECK condition: ``column`` holds one of ``values`` (``state IN ('a', 'b')``)."""
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


schema_migrations = sa.Table(
    "schema_migrations",
    metadata,
    sa.Column("plugin", sa.Text, primary_key=True),
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("applied_at", Millis, nullable=False),
)

principals = sa.Table(
    "principals",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("public_id", sa.Text, nullable=False, unique=True),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("name", sa.Text, nullable=False, unique=True),
    sa.Column("display_name", sa.Text, nullable=False, server_default=""),
    sa.Column("system_role", sa.Text, nullable=True),
    sa.Column("password_hash", sa.Text, nullable=True),
    sa.Column("created_at", Millis, nullable=False),
    sa.Column("disabled_at", Millis, nullable=True),
    sa.CheckConstraint("kind IN ('human', 'agent', 'service')", name="principal_kind"),
    sa.CheckConstraint(
        "system_role IS NULL OR system_role IN ('admin', 'operator')", name="principal_role"
    ),
)

tokens = sa.Table(
    "tokens",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("public_id", sa.Text, nullable=False, unique=True),
    sa.Column("principal_id", Id, sa.ForeignKey("principals.id"), nullable=False),
    # SHA-256 (hex) of the secret; the secret itself is never stored.
    sa.Column("verifier", sa.Text, nullable=False, unique=True),
    sa.Column("name", sa.Text, nullable=False, server_default=""),
    sa.Column("origin", sa.Text, nullable=False, server_default="api"),
    sa.Column("scope_type", sa.Text, nullable=True),
    sa.Column("scope_id", sa.Text, nullable=True),
    sa.Column("created_at", Millis, nullable=False),
    sa.Column("expires_at", Millis, nullable=True),
    sa.Column("revoked_at", Millis, nullable=True),
    sa.Column("last_used_at", Millis, nullable=True),
)
sa.Index("tokens_principal", tokens.c.principal_id)
sa.Index("tokens_scope", tokens.c.scope_type, tokens.c.scope_id)

spaces = sa.Table(
    "spaces",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("public_id", sa.Text, nullable=False, unique=True),
    sa.Column("slug", sa.Text, nullable=False, unique=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("created_at", Millis, nullable=False),
    sa.Column("created_by", Id, sa.ForeignKey("principals.id"), nullable=True),
    # Last event sequence number. On SQLite a publisher takes it (the write
    # lock orders them); on PostgreSQL only the event sequencer does (see
    # events.py), under this row's lock.
    sa.Column("event_seq", sa.BigInteger, nullable=False, server_default="0"),
)

space_members = sa.Table(
    "space_members",
    metadata,
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), primary_key=True),
    sa.Column("principal_id", Id, sa.ForeignKey("principals.id"), primary_key=True),
    sa.Column("role", sa.Text, nullable=False),
    sa.Column("created_at", Millis, nullable=False),
    sa.CheckConstraint("role IN ('owner', 'admin', 'member', 'viewer')", name="member_role"),
)
sa.Index("space_members_principal", space_members.c.principal_id)

idempotency_receipts = sa.Table(
    "idempotency_receipts",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("principal_id", Id, sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("method", sa.Text, nullable=False),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("key", sa.Text, nullable=False),
    sa.Column("fingerprint", sa.Text, nullable=False),
    sa.Column("status", sa.Integer, nullable=False),
    # The response body as JSON, with any secret removed (see idempotency.py).
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("created_at", Millis, nullable=False),
    sa.Column("expires_at", Millis, nullable=False),
    sa.UniqueConstraint("principal_id", "method", "path", "key", name="receipt_key"),
)
sa.Index("idempotency_receipts_expiry", idempotency_receipts.c.expires_at)

events = sa.Table(
    "events",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False),
    sa.Column("type", sa.Text, nullable=False),
    sa.Column("data", sa.Text, nullable=False),
    sa.Column("created_at", Millis, nullable=False),
    sa.UniqueConstraint("space_id", "seq", name="event_space_seq"),
)

#: PostgreSQL: events committed but not yet numbered. A transaction adds
#: its events here without a lock; the sequencer (events.py) moves them to
#: ``events`` with the space's next sequence numbers, in one statement.
event_outbox = sa.Table(
    "event_outbox",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    sa.Column("type", sa.Text, nullable=False),
    sa.Column("data", sa.Text, nullable=False),
    sa.Column("created_at", Millis, nullable=False),
)

sign_in_failures = sa.Table(
    "sign_in_failures",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("address", sa.Text, nullable=False),
    sa.Column("at", Millis, nullable=False),
)
sa.Index("sign_in_failures_name", sign_in_failures.c.name, sign_in_failures.c.at)
sa.Index("sign_in_failures_address", sign_in_failures.c.address, sign_in_failures.c.at)

#: One row per ``buildmax backup create``: its freshness for diagnostics,
#: and, while it runs, the lease under which no collector deletes a blob.
backup_runs = sa.Table(
    "backup_runs",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("started_at", Millis, nullable=False),
    # Renewed while the backup copies; a run whose lease lapsed (its process
    # died) holds nothing back.
    sa.Column("lease_expires_at", Millis, nullable=False),
    sa.Column("finished_at", Millis, nullable=True),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("path", sa.Text, nullable=False),
    sa.Column("manifest_sha256", sa.Text, nullable=True),
    sa.Column("bytes", sa.BigInteger, nullable=True),
    sa.Column("error", sa.Text, nullable=True),
    sa.CheckConstraint(one_of("state", ("running", "succeeded", "failed")), name="backup_state"),
)
sa.Index("backup_runs_started", backup_runs.c.started_at)

#: Tables created by the kernel's first migration, in dependency order.
KERNEL_TABLES = [
    principals,
    tokens,
    spaces,
    space_members,
    idempotency_receipts,
    events,
    sign_in_failures,
]
