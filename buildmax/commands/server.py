"""Commands that run on the server's machine: serve, db, admin, plugins."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ..config import Config, ConfigError, load_config

if TYPE_CHECKING:
    from ..app import BuildMax

T = TypeVar("T")


def load_settings(config_path: str | None, **overrides: Any) -> Config:
    """The server's settings (file, environment, then ``overrides``); a
    configuration error becomes a clean CLI error."""
    try:
        return load_config(config_path, **overrides)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


def _run(factory: Callable[[], Awaitable[T]]) -> T:
    try:
        return asyncio.run(factory())  # type: ignore[arg-type]
    except Exception as exc:
        from ..database import DatabaseError
        from ..migrations import MigrationError
        from ..plugins import PluginLoadError

        if isinstance(exc, (DatabaseError, MigrationError, PluginLoadError, ConfigError)):
            raise click.ClickException(str(exc)) from None
        raise


config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    envvar="BUILDMAX_CONFIG",
    help="TOML configuration file.",
)
data_dir_option = click.option(
    "--data-dir", type=click.Path(file_okay=False), help="Data directory (SQLite database, blobs)."
)
database_option = click.option(
    "--database-url", help="postgresql://... to use PostgreSQL instead of SQLite."
)


async def _open_app(settings: Config) -> Any:
    from ..app import create_app

    app = create_app(settings)
    await app.db.connect()
    return app


async def _require_current_schema(app: BuildMax, plugins: Collection[str] | None) -> None:
    from ..migrations import MigrationError, migration_status

    statuses = await migration_status(app.db, app.migrations())
    checked = [s for s in statuses if s.loaded and (plugins is None or s.plugin in plugins)]
    ahead = [s.plugin for s in checked if s.state == "ahead"]
    if ahead:
        raise MigrationError(
            f"the database schema is newer than this code for {', '.join(ahead)}: "
            "run the BuildMax version that migrated it"
        )
    behind = [s.plugin for s in checked if s.state == "pending"]
    if behind:
        raise MigrationError(
            f"the database schema is not current for {', '.join(behind)}: "
            "run `buildmax db migrate` first"
        )


def refuse_missing_database(settings: Config) -> None:
    """Refuse, creating nothing, to open an embedded (SQLite) database that
    does not exist (or is an empty file): the message names the file looked
    for and how to name the server's database."""
    if settings.engine != "sqlite":
        return  # connecting to PostgreSQL never creates a database
    path = Path(settings.effective_database_url.removeprefix("sqlite:///")).absolute()
    if path.is_file() and path.stat().st_size > 0:
        return
    how = (
        "--database-url (or BUILDMAX_DATABASE_URL)"
        if settings.database_url
        else "--data-dir (or BUILDMAX_DATA_DIR, or data_dir in the configuration file)"
    )
    raise click.ClickException(
        f"no BuildMax database in {path.parent} (looked for {path.name}): name the "
        f"server's database with {how}; a new deployment creates its database with "
        "`buildmax db migrate` or `buildmax serve`"
    )


def with_app(
    settings: Config,
    work: Callable[[Any], Awaitable[T]],
    *,
    current_schema: bool = True,
    schema_of: Collection[str] | None = None,
    create: bool = False,
) -> T:
    """Run ``work(app)`` with a connected (not serving) app, then close it.

    With ``current_schema`` (the default), a database whose schema is not
    the code's (pending migrations, or newer) is refused with a message
    saying what to run; ``schema_of`` limits that check to the plugins the
    command reads (``"kernel"`` for the kernel's tables). Only a command
    that may ``create`` the database (``db migrate``) opens one that does
    not exist; every other command is refused, creating nothing."""
    if not create:
        refuse_missing_database(settings)

    async def go() -> T:
        app = await _open_app(settings)
        try:
            if current_schema:
                await _require_current_schema(app, schema_of)
            return await work(app)
        finally:
            from ..app import close_blob_store

            await close_blob_store(app)
            await app.db.close()

    return _run(go)


def _settings_to_env(settings: Config, config_path: str | None) -> None:
    """Hand the resolved settings to Hypercorn's worker processes (the file
    too, for its ``[plugins.<name>]`` tables)."""
    import dataclasses

    if config_path:
        os.environ["BUILDMAX_CONFIG"] = os.path.abspath(config_path)
    for field in dataclasses.fields(Config):
        value = getattr(settings, field.name)
        if field.name == "plugins" or value is None:
            continue
        os.environ["BUILDMAX_" + field.name.upper()] = (
            ("1" if value else "0") if isinstance(value, bool) else str(value)
        )


async def _prepare(settings: Config) -> str | None:
    """Migrate (SQLite) or check (PostgreSQL); bootstrap an admin on a fresh database.

    Returns the one-time admin token when one was minted."""
    from ..bootstrap import AlreadyBootstrapped, bootstrap_admin
    from ..migrations import MigrationError, migrate, migration_status, refuse_if_ahead
    from ..principals import count_admins

    app = await _open_app(settings)
    try:
        migrations = app.migrations()
        statuses = await migration_status(app.db, migrations)
        refuse_if_ahead(statuses)
        if settings.engine == "sqlite":
            await migrate(app.db, migrations, app.clock)
        elif any(s.pending for s in statuses):
            raise MigrationError("the database has pending migrations; run `buildmax db migrate`")
        async with app.db.read() as conn:
            admins = await count_admins(conn)
        if admins == 0:
            try:
                return (await bootstrap_admin(app)).secret
            except AlreadyBootstrapped:  # another server process was first
                return None
        return None
    finally:
        await app.db.close()


@click.command()
@config_option
@data_dir_option
@database_option
@click.option("--host", help="Address to listen on (default 127.0.0.1).")
@click.option("--port", type=int, help="Port to listen on (default 8420).")
@click.option("--workers", type=int, help="Server processes (PostgreSQL only for more than 1).")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    help="Log lines as text (default) or one JSON object each, for log shippers.",
)
def serve(
    config_path: str | None,
    data_dir: str | None,
    database_url: str | None,
    host: str | None,
    port: int | None,
    workers: int | None,
    log_format: str | None,
) -> None:
    """Run the server (Hypercorn with uvloop).

    On an empty data directory it creates the database, bootstraps the
    first admin and prints a one-time admin token. On SIGTERM the server
    drains: /readyz answers 503 at once, event streams end, requests in
    flight finish (up to shutdown_grace_seconds), then it exits.
    """
    settings = load_settings(
        config_path,
        data_dir=data_dir,
        database_url=database_url,
        host=host,
        port=port,
        workers=workers,
        log_format=log_format,
    )
    if settings.engine == "sqlite" and settings.workers > 1:
        raise click.ClickException(
            "SQLite runs in one server process; for --workers > 1 use PostgreSQL "
            "(--database-url postgresql://...)"
        )
    token = _run(lambda: _prepare(settings))
    if token:
        click.echo(
            "\n  A first admin was created. Its API token (shown once, keep it safe):\n\n"
            f"      {token}\n\n"
            f"  Use it with:  buildmax login --url http://{settings.host}:{settings.port} "
            "--token <token>\n",
            err=True,
        )
    _settings_to_env(settings, config_path)
    click.echo(
        f"BuildMax serving on http://{settings.host}:{settings.port} "
        f"({settings.engine}, {settings.workers} worker(s))",
        err=True,
    )
    from ..serving import ListenError
    from ..serving import serve as serve_forever

    try:
        status = serve_forever(settings)
    except ListenError as exc:
        raise click.ClickException(f"{exc} (another server on that port? --port)") from None
    sys.exit(status)


@click.group()
def db() -> None:
    """Database schema: apply and inspect migrations."""


@db.command("migrate")
@config_option
@data_dir_option
@database_option
def db_migrate(config_path: str | None, data_dir: str | None, database_url: str | None) -> None:
    """Apply every pending migration of the loaded plugins (a no-op when current)."""
    from ..migrations import migrate

    settings = load_settings(config_path, data_dir=data_dir, database_url=database_url)

    applied = with_app(
        settings,
        lambda app: migrate(app.db, app.migrations(), app.clock),
        current_schema=False,
        create=True,
    )
    if not applied:
        click.echo("Nothing to migrate: the database is current.")
    for migration in applied:
        click.echo(f"applied {migration.plugin} {migration.version}: {migration.name}")


@db.command("status")
@config_option
@data_dir_option
@database_option
def db_status(config_path: str | None, data_dir: str | None, database_url: str | None) -> None:
    """Show each plugin's migrations: current, pending, ahead, or not loaded."""
    from ..migrations import migration_status

    settings = load_settings(config_path, data_dir=data_dir, database_url=database_url)

    statuses = with_app(
        settings, lambda app: migration_status(app.db, app.migrations()), current_schema=False
    )
    click.echo(f"{'plugin':<24} {'database':>8} {'code':>6}  state")
    for s in statuses:
        code = "-" if s.code_version is None else str(s.code_version)
        click.echo(f"{s.plugin:<24} {s.db_version:>8} {code:>6}  {s.state}")
    if any(s.ahead for s in statuses):
        sys.exit(2)


@click.group()
def admin() -> None:
    """Administration on the server's machine."""


@admin.command("bootstrap")
@config_option
@data_dir_option
@database_option
@click.option("--name", default="admin", show_default=True, help="Name of the first admin.")
@click.option(
    "--password",
    prompt=False,
    hide_input=True,
    default=None,
    help="Optional password for signing in (you are prompted if you pass '-').",
)
def admin_bootstrap(
    config_path: str | None,
    data_dir: str | None,
    database_url: str | None,
    name: str,
    password: str | None,
) -> None:
    """Create the first admin and print its API token (once).

    Refused when an enabled admin exists already."""
    from ..bootstrap import AlreadyBootstrapped, bootstrap_admin
    from ..migrations import migrate

    settings = load_settings(config_path, data_dir=data_dir, database_url=database_url)
    if password == "-":
        password = click.prompt("Password", hide_input=True, confirmation_prompt=True)
    if password is not None:
        from ..passwords import check_password_rules

        problem = check_password_rules(password)
        if problem:
            raise click.BadParameter(problem, param_hint="--password")

    async def go() -> str:
        app = await _open_app(settings)
        try:
            if settings.engine == "sqlite":
                await migrate(app.db, app.migrations(), app.clock)
            return (await bootstrap_admin(app, name=name, password=password)).secret
        finally:
            await app.db.close()

    try:
        token = _run(go)
    except AlreadyBootstrapped as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(token)


@click.command()
@click.option("--requirements", is_flag=True, help="Print name==version lines for pinning.")
def plugins(requirements: bool) -> None:
    """The server's Python plugins: name, version, source, hooks implemented."""
    from .. import essentials
    from ..plugins import create_plugins

    settings = load_settings(None)
    infos = create_plugins(essential=essentials, allow=settings.plugin_allow_list).infos()
    if requirements:
        from importlib.metadata import entry_points

        dists = {ep.name: ep.dist for ep in entry_points(group="buildmax")}
        pins = {
            f"{dist.name}=={dist.version}"
            for info in infos
            if info.loaded and (dist := dists.get(info.name)) is not None
        }
        for pin in sorted(pins):
            click.echo(pin)
        return
    for info in infos:
        state = "loaded" if info.loaded else f"FAILED: {info.error}"
        click.echo(f"{info.name} {info.version or '-'}  [{info.source}]  {state}")
        if info.hooks:
            click.echo("    hooks: " + ", ".join(info.hooks))


def register(cli: click.Group) -> None:
    """Add these commands to the root group."""
    for command in (serve, db, admin, plugins):
        cli.add_command(command)
