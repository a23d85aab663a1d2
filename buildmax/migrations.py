"""Schema migrations, contributed per plugin through ``buildmax_migrations``.

The kernel records every applied ``(plugin, version)`` in
``schema_migrations``. ``migrate`` applies pending migrations in order, each
in its own write transaction; it refuses to touch a database whose recorded
migrations of a *loaded* plugin are ahead of that plugin's code. Records of
plugins that are not loaded are reported, never refused, so a plugin can be
disabled after its migrations ran.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field

import sqlalchemy as sa
from buildmax_hookspecs import Migration, Transaction
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.dialects.sqlite.base import SQLiteDialect
from sqlalchemy.schema import CreateColumn, CreateIndex, CreateTable

from .clock import Clock
from .database import Database
from .database.locks import lock
from .tables import schema_migrations

#: The kernel's migration namespace, applied before every plugin's.
KERNEL = "kernel"


class MigrationError(Exception):
    """The migrations cannot be applied or the database is ahead of the code."""


@dataclass
class PluginMigrationStatus:
    """How one migration namespace stands."""

    plugin: str
    code_version: int | None
    db_version: int
    pending: list[Migration] = field(default_factory=list)

    @property
    def loaded(self) -> bool:
        """False when the database has records of a plugin that is not loaded."""
        return self.code_version is not None

    @property
    def ahead(self) -> bool:
        """True when the database ran migrations this code does not know."""
        return self.code_version is not None and self.db_version > self.code_version

    @property
    def state(self) -> str:
        """``current``, ``pending``, ``ahead`` or ``not loaded``."""
        if not self.loaded:
            return "not loaded"
        if self.ahead:
            return "ahead"
        return "pending" if self.pending else "current"


def create_tables(*tables: sa.Table) -> Callable[[Transaction], Awaitable[None]]:
    """An ``apply`` function creating ``tables`` and their indexes."""

    async def apply(tx: Transaction) -> None:
        for table in tables:
            await tx.execute(CreateTable(table))
            for index in sorted(table.indexes, key=lambda i: str(i.name)):
                await tx.execute(CreateIndex(index))

    return apply


def add_columns(table: sa.Table, *names: str) -> Callable[[Transaction], Awaitable[None]]:
    """An ``apply`` function adding the columns ``names`` of ``table`` as
    it declares them (type, nullability, server default: a column that may
    not be null needs one), each that the database does not have yet: a
    database whose table was created since they were declared has them."""

    async def apply(tx: Transaction) -> None:
        present = await _columns(tx, table.name)
        dialect = SQLiteDialect() if tx.dialect == "sqlite" else PGDialect()  # type: ignore[no-untyped-call]
        for name in names:
            if name not in present:
                spec = CreateColumn(table.c[name]).compile(dialect=dialect)
                await tx.execute(sa.text(f"ALTER TABLE {table.name} ADD COLUMN {spec}"))

    return apply


async def _columns(tx: Transaction, table: str) -> set[str]:
    if tx.dialect == "sqlite":
        query = sa.text("SELECT name FROM pragma_table_info(:table)")
    else:
        query = sa.text(
            "SELECT column_name AS name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = :table"
        )
    return {row["name"] for row in await tx.fetch_all(query, {"table": table})}


def group_migrations(migrations: Iterable[Migration]) -> dict[str, list[Migration]]:
    """Migrations by plugin, ordered, checked to be numbered 1..n without gaps."""
    grouped: dict[str, list[Migration]] = defaultdict(list)
    for migration in migrations:
        grouped[migration.plugin].append(migration)
    for plugin, items in grouped.items():
        items.sort(key=lambda m: m.version)
        versions = [m.version for m in items]
        if versions != list(range(1, len(items) + 1)):
            raise MigrationError(
                f"plugin {plugin!r}: migrations must be numbered 1..{len(items)}, got {versions}"
            )
    return dict(grouped)


async def _ensure_table(db: Database) -> None:
    async with db.read() as conn:
        if await _table_exists(conn):
            return
    async with db.write() as tx:
        # Two processes migrating a fresh PostgreSQL database at once would
        # both try to create it (IF NOT EXISTS is not safe under concurrency).
        await lock(tx, "migrate", "schema_migrations")
        await tx.execute(CreateTable(schema_migrations, if_not_exists=True))


async def _table_exists(conn: Transaction) -> bool:
    """Whether ``schema_migrations`` exists (the engines' catalogs differ)."""
    if conn.dialect == "postgresql":
        query = sa.select(sa.func.to_regclass("schema_migrations").is_not(None))
    else:
        query = (
            sa.select(sa.literal_column("count(*) > 0"))
            .select_from(sa.text("sqlite_master"))
            .where(sa.text("type = 'table' AND name = 'schema_migrations'"))
        )
    return bool(await conn.fetch_val(query))


async def _applied(tx: Transaction) -> dict[str, int]:
    rows = await tx.fetch_all(
        sa.select(
            schema_migrations.c.plugin, sa.func.max(schema_migrations.c.version).label("v")
        ).group_by(schema_migrations.c.plugin)
    )
    return {row["plugin"]: int(row["v"]) for row in rows}


async def migration_status(
    db: Database, migrations: Iterable[Migration]
) -> list[PluginMigrationStatus]:
    """Every namespace known to the code or the database, sorted by name."""
    grouped = group_migrations(migrations)
    async with db.read() as conn:
        # Reading the status creates nothing: no table yet means nothing applied.
        applied = await _applied(conn) if await _table_exists(conn) else {}
    result = []
    # The kernel's tables come first: plugins' tables refer to them.
    for plugin in sorted(set(grouped) | set(applied), key=lambda name: (name != KERNEL, name)):
        code = grouped.get(plugin)
        db_version = applied.get(plugin, 0)
        pending = [m for m in code or [] if m.version > db_version]
        result.append(
            PluginMigrationStatus(
                plugin, len(code) if code is not None else None, db_version, pending
            )
        )
    return result


def refuse_if_ahead(statuses: Sequence[PluginMigrationStatus]) -> None:
    """Raise when a loaded plugin's recorded migrations are ahead of its code."""
    ahead = [s for s in statuses if s.ahead]
    if ahead:
        names = ", ".join(
            f"{s.plugin} (database at {s.db_version}, code knows {s.code_version})" for s in ahead
        )
        raise MigrationError(
            f"the database has migrations this code does not know: {names}. "
            "Run the newer BuildMax release, or restore a backup taken before it ran."
        )


async def migrate(db: Database, migrations: Iterable[Migration], clock: Clock) -> list[Migration]:
    """Apply every pending migration; return the ones applied (empty = no-op)."""
    await _ensure_table(db)
    statuses = await migration_status(db, migrations)
    refuse_if_ahead(statuses)
    applied: list[Migration] = []
    for status in statuses:
        for migration in status.pending:
            async with db.write() as tx:
                # Two servers starting at once must not both apply it.
                await lock(tx, "migrate", migration.plugin)
                done = await tx.fetch_val(
                    sa.select(schema_migrations.c.version).where(
                        schema_migrations.c.plugin == migration.plugin,
                        schema_migrations.c.version == migration.version,
                    )
                )
                if done is not None:
                    continue
                await migration.apply(tx)
                await tx.execute(
                    schema_migrations.insert().values(
                        plugin=migration.plugin,
                        version=migration.version,
                        name=migration.name,
                        applied_at=clock.now_ms(),
                    )
                )
            applied.append(migration)
    return applied
