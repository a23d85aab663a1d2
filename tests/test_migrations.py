"""Migrations: applied once, refused when the database is ahead."""

from __future__ import annotations

import sqlalchemy as sa
from click.testing import CliRunner

from buildmax.app import create_app
from buildmax.migrations import MigrationError, migrate
from buildmax.schema import schema_migrations


async def test_a_second_migrate_is_a_no_op(app):
    rows_before = await _records(app)
    assert await migrate(app.db, app.migrations(), app.clock) == []
    assert await _records(app) == rows_before


async def _records(app):
    async with app.db.read() as conn:
        return [dict(r) for r in await conn.fetch_all(sa.select(schema_migrations))]


async def test_a_database_with_an_unknown_newer_migration_is_refused(app, buildmax_settings):
    async with app.db.write() as tx:
        await tx.execute(
            schema_migrations.insert().values(
                plugin="kernel", version=2, name="from the future", applied_at=0
            )
        )
    message = await start_error(create_app(buildmax_settings, auto_migrate=True))
    assert "kernel (database at 2, code knows 1)" in message
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
