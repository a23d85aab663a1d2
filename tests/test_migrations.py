"""Migrations: applied once, refused when the database is ahead."""

from __future__ import annotations

import asyncio

import sqlalchemy as sa
from buildmax_hookspecs import SYSTEM_ACTOR
from click.testing import CliRunner

from buildmax.app import create_app
from buildmax.migrations import MigrationError, migrate
from buildmax.tables import schema_migrations


async def test_a_second_migrate_is_a_no_op(app):
    rows_before = await _records(app)
    assert await migrate(app.db, app.migrations(), app.clock) == []
    assert await _records(app) == rows_before


async def _records(app):
    async with app.db.read() as conn:
        return [dict(r) for r in await conn.fetch_all(sa.select(schema_migrations))]


async def test_a_database_with_an_unknown_newer_migration_is_refused(app, buildmax_settings):
    head = max(m.version for m in app.migrations() if m.plugin == "kernel")
    async with app.db.write() as tx:
        await tx.execute(
            schema_migrations.insert().values(
                plugin="kernel", version=head + 1, name="from the future", applied_at=0
            )
        )
    message = await start_error(create_app(buildmax_settings, auto_migrate=True))
    assert f"kernel (database at {head + 1}, code knows {head})" in message
    assert "newer BuildMax release" in message
    assert await migrate_refused(app)


async def migrate_refused(app) -> bool:
    try:
        await migrate(app.db, app.migrations(), app.clock)
    except MigrationError:
        return True
    return False


async def test_pending_migrations_refuse_start_without_auto_migrate(buildmax_settings, app):
    async with app.db.write() as tx:
        await tx.execute(
            sa.delete(schema_migrations).where(schema_migrations.c.plugin == "testplugin")
        )
    message = await start_error(create_app(buildmax_settings, auto_migrate=False))
    assert "pending migrations: testplugin (1)" in message
    assert "buildmax db migrate" in message


async def start_error(app) -> str:
    """The message start-up failed with (Quart's test app wraps it)."""
    try:
        async with app.test_app():
            pass
    except Exception as exc:
        return str(exc)
    raise AssertionError("start-up should have been refused")


def test_db_migrate_and_status_commands(tmp_path, buildmax_database_url):
    from buildmax import cli as cli_module

    cli_module._register_commands()
    runner = CliRunner()
    args = ["--data-dir", str(tmp_path / "d")]
    if buildmax_database_url.startswith("postgresql"):
        args = ["--database-url", buildmax_database_url]
    if not buildmax_database_url.startswith("postgresql"):
        # status reads: it refuses a database that does not exist, creating nothing
        before = runner.invoke(cli_module.cli, ["db", "status", *args])
        assert before.exit_code == 1, before.output
        assert "no BuildMax database in" in before.output and "--data-dir" in before.output
        assert not (tmp_path / "d").exists()
    first = runner.invoke(cli_module.cli, ["db", "migrate", *args])
    assert first.exit_code == 0, first.output
    second = runner.invoke(cli_module.cli, ["db", "migrate", *args])
    assert second.exit_code == 0, second.output
    assert "Nothing to migrate" in second.output
    status = runner.invoke(cli_module.cli, ["db", "status", *args])
    assert status.exit_code == 0, status.output
    lines = {line.split()[0]: line.split()[-1] for line in status.output.splitlines()[1:]}
    assert lines["kernel"] == "current"
    assert lines["testplugin"] == "current"


async def test_the_kernel_migrates_before_any_plugin(app):
    """Plugins' tables refer to the kernel's (spaces, principals): a plugin
    whose namespace sorts before 'kernel' must still come after it."""
    from buildmax_hookspecs import Migration

    from buildmax.migrations import create_tables, migration_status

    table = sa.Table(
        "aaa_items",
        sa.MetaData(),
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("space_id", sa.Integer, sa.ForeignKey("spaces.id"), nullable=False),
    )
    early = Migration("aaa", 1, "items", create_tables(table))
    statuses = await migration_status(app.db, [*app.migrations(), early])
    order = [s.plugin for s in statuses]
    assert order[:2] == ["kernel", "aaa"]
    assert order == ["kernel", "aaa", *sorted(order[2:])]


async def test_concurrent_migrations_of_a_fresh_database_all_succeed(buildmax_engine, tmp_path):
    """Several servers starting at once on an empty database. Catches: the
    migrations table created without a lock, or the per-plugin lock removed."""
    import os
    import secrets

    from buildmax.config import Config
    from buildmax.migrations import migration_status
    from buildmax.testing import TEST_DATABASE_ENV, pg_create_database, pg_drop_database

    name = None
    if buildmax_engine == "postgresql":
        server = os.environ[TEST_DATABASE_ENV]
        name = f"bmx_fresh_{secrets.token_hex(6)}"
        settings = Config(database_url=await asyncio.to_thread(pg_create_database, server, name))
    else:
        settings = Config(data_dir=str(tmp_path / "fresh"))
    settings = settings.replace(load_plugins="testplugin")
    apps = [create_app(settings) for _ in range(4)]
    try:
        for each in apps:
            await each.db.connect()
        barrier = asyncio.Barrier(len(apps))

        async def go(each):
            await barrier.wait()
            return await migrate(each.db, each.migrations(), each.clock)

        results = await asyncio.gather(*(go(each) for each in apps), return_exceptions=True)
        assert [r for r in results if isinstance(r, BaseException)] == []
        # Every migration of the kernel and the test plugin, once each.
        assert sum(len(r) for r in results) == len(apps[0].migrations())
        statuses = await migration_status(apps[0].db, apps[0].migrations())
        assert {s.plugin: s.state for s in statuses} == {
            "kernel": "current",
            "testplugin": "current",
        }
    finally:
        for each in apps:
            await each.db.close()
        if name is not None:
            await asyncio.to_thread(pg_drop_database, os.environ[TEST_DATABASE_ENV], name)


async def test_commands_refuse_a_schema_that_is_not_the_codes_naming_what_to_run(
    app, buildmax_settings
):
    """A command reading only some plugins' tables works while another
    plugin waits for a migration (export the trail before migrating); one
    that needs them all is refused; a newer schema is refused as newer."""
    from buildmax import cli as cli_module

    cli_module._register_commands()
    args = ["--data-dir", buildmax_settings.data_dir]
    if buildmax_settings.database_url:
        args += ["--database-url", buildmax_settings.database_url]

    def run(*command: str):
        return CliRunner().invoke(cli_module.cli, [*command, *args])

    async with app.db.write() as tx:
        await tx.execute(
            sa.delete(schema_migrations).where(schema_migrations.c.plugin == "testplugin")
        )
        # One event to verify: a trail with none fails verification, saying so.
        await app.audit.record(
            tx,
            SYSTEM_ACTOR,
            "principal.created",
            target_type="principal",
            target_id="pr_verified",
            details={"kind": "agent", "name": "verified", "system_role": None},
        )
    verified = await asyncio.to_thread(run, "audit", "verify")
    assert verified.exit_code == 0, verified.output
    refused = await asyncio.to_thread(run, "artifacts", "gc", "--dry-run")
    assert refused.exit_code == 1
    assert (
        "not current for testplugin" in refused.output and "buildmax db migrate" in refused.output
    )
    async with app.db.write() as tx:
        await tx.execute(
            schema_migrations.insert().values(
                plugin="audit", version=99, name="from the future", applied_at=0
            )
        )
    newer = await asyncio.to_thread(run, "audit", "verify")
    assert newer.exit_code == 1 and "newer than this code for audit" in newer.output


async def test_reading_the_migration_status_creates_no_table(
    buildmax_engine, buildmax_pg_server, tmp_path
):
    """``db status``, the readiness probe and every reading command ask for
    the status: on an empty database it reports every plugin pending and
    creates nothing (not even ``schema_migrations``)."""
    import uuid

    from buildmax.database import open_database, servers
    from buildmax.migrations import migration_status

    name = f"bmx_empty_{uuid.uuid4().hex[:12]}"
    if buildmax_engine == "postgresql":
        url = await servers.create_database(buildmax_pg_server, name)
        query = "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
    else:
        url = f"sqlite:///{tmp_path / name}.db"
        query = "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
    db = open_database(url)
    await db.connect()
    try:
        statuses = await migration_status(db, [])
        async with db.read() as conn:
            tables = await conn.fetch_val(sa.text(query))
    finally:
        await db.close()
        if buildmax_engine == "postgresql":
            await servers.drop_database(buildmax_pg_server, name)
    assert statuses == []
    assert tables == 0
