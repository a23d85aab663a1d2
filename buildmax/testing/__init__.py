"""pytest fixtures for BuildMax and its plugins (a ``pytest11`` plugin).

A plugin's tests get an app on a fresh database, a client and principals in
a few lines::

    async def test_ping(client, admin):
        response = await client.get("/v1/ping", headers=admin.headers)
        assert response.status_code == 200

The engine is SQLite unless ``BUILDMAX_TEST_DATABASE_URL`` names a
PostgreSQL server: then every test gets its own database, cloned from a
template migrated once per session, and dropped afterwards. When nothing
answers at that URL and PostgreSQL's server binaries are installed, the
session runs on a throwaway cluster instead (a free local port, a temporary
directory deleted at the end); without binaries the run stops with a
one-line explanation. PostgreSQL tests never skip.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import secrets
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from ..app import BuildMax, create_app
from ..clock import ManualClock, SystemClock
from ..config import Config
from ..database import servers
from ..principals import create_principal
from ..spaces import create_space
from ..tokens import issue_token
from .http import call
from .postgres import (
    PG_PROBE_TIMEOUT,
    TEST_DATABASE_ENV,
    ClonePool,
    PgCluster,
    PgServerChoice,
    PgUnavailable,
    choose_pg_server,
    find_pg_bindir,
    pg_create_database,
    pg_drop_database,
    probe_pg_server,
    redact_url,
)
from .processes import ServerProcess, _wait_until_listening, free_port, start_server
from .support import (
    MIN_WATCHED_DISTINCT,
    MIN_WATCHED_SECRET,
    AuditRecorder,
    LogWatch,
    PrincipalHandle,
    SecretWatch,
    SpaceHandle,
)


def _say(config: pytest.Config, line: str) -> None:
    """Print ``line`` on the terminal now, past output capturing."""
    capture = config.pluginmanager.getplugin("capturemanager")
    reporter = config.pluginmanager.getplugin("terminalreporter")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        if reporter is not None:
            reporter.write_line(line)
        else:
            print(line, file=sys.stderr, flush=True)


@pytest.fixture(scope="session")
def buildmax_engine() -> str:
    """``"postgresql"`` when ``BUILDMAX_TEST_DATABASE_URL`` is set, else ``"sqlite"``."""
    return "postgresql" if os.environ.get(TEST_DATABASE_ENV) else "sqlite"


@pytest.fixture(scope="session")
def buildmax_pg_server(
    buildmax_engine: str, request: pytest.FixtureRequest
) -> Iterator[str | None]:
    """URL of the PostgreSQL server the session's databases are made on: the
    configured one, or a throwaway cluster when nothing answers there
    (``None`` on SQLite)."""
    if buildmax_engine != "postgresql":
        yield None
        return
    url = os.environ[TEST_DATABASE_ENV]
    try:
        choice = choose_pg_server(url)
        cluster = None
        if choice.bindir is not None:
            parts = urlsplit(url)
            cluster = PgCluster.start(
                choice.bindir,
                user=parts.username or "postgres",
                dbname=parts.path.lstrip("/") or "postgres",
            )
    except PgUnavailable as exc:
        pytest.exit(f"PostgreSQL tests cannot run: {exc}", returncode=pytest.ExitCode.TESTS_FAILED)
    if cluster is None:
        yield choice.url
        return
    atexit.register(cluster.stop)
    try:
        _say(
            request.config,
            f"buildmax: {choice.reason}; testing on a throwaway PostgreSQL cluster on "
            f"127.0.0.1:{cluster.port} ({choice.bindir}, {cluster.root})",
        )
        yield cluster.url
    finally:
        cluster.stop()
        atexit.unregister(cluster.stop)


@pytest.fixture(scope="session")
def buildmax_pg_template(
    buildmax_engine: str, buildmax_pg_server: str | None
) -> Iterator[str | None]:
    """A PostgreSQL database migrated once, cloned by every test."""
    if buildmax_engine != "postgresql":
        yield None
        return
    assert buildmax_pg_server is not None
    server = buildmax_pg_server
    name = f"bmx_tpl_{os.getpid()}_{secrets.token_hex(4)}"
    url = pg_create_database(server, name)
    try:

        async def migrate_template() -> None:
            from ..migrations import migrate

            app = create_app(Config(database_url=url))
            await app.db.connect()
            try:
                await migrate(app.db, app.migrations(), SystemClock())
            finally:
                await app.db.close()

        asyncio.run(migrate_template())
        yield name
    finally:
        pg_drop_database(server, name)


@pytest.fixture(scope="session")
def buildmax_pg_clones(
    buildmax_pg_server: str | None, buildmax_pg_template: str | None
) -> Iterator[ClonePool | None]:
    """The session's pool of template clones (``None`` on SQLite)."""
    if buildmax_pg_server is None or buildmax_pg_template is None:
        yield None
        return
    pool = ClonePool(buildmax_pg_server, buildmax_pg_template)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def buildmax_database_url(
    buildmax_engine: str,
    buildmax_pg_server: str | None,
    buildmax_pg_clones: ClonePool | None,
    tmp_path: Path,
) -> Iterator[str]:
    """A fresh, migrated database for one test (SQLite file or PostgreSQL clone)."""
    if buildmax_engine == "sqlite":
        yield f"sqlite:///{tmp_path / 'buildmax.db'}"
        return
    assert buildmax_pg_server is not None and buildmax_pg_clones is not None
    name = buildmax_pg_clones.take()
    try:
        yield servers.database_url(buildmax_pg_server, name)
    finally:
        buildmax_pg_clones.give_back(name)


@pytest.fixture
def buildmax_settings(buildmax_database_url: str, tmp_path: Path) -> Config:
    """Settings of the test app: its own data directory and database."""
    url = buildmax_database_url if buildmax_database_url.startswith("postgresql") else ""
    return Config(data_dir=str(tmp_path / "data"), database_url=url)


def without_plugins(settings: Config, *names: str) -> Config:
    """``settings`` loading every installed plugin except ``names`` (what
    ``BUILDMAX_LOAD_PLUGINS`` does for an operator)."""
    from importlib.metadata import entry_points

    from ..plugins import ENTRY_POINT_GROUP

    kept = sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)} - set(names))
    return settings.replace(load_plugins=",".join(kept))


@pytest.fixture
async def buildmax_restore_target(
    buildmax_engine: str, buildmax_pg_server: str | None, tmp_path: Path
) -> AsyncIterator[Config]:
    """An empty target for a restore: a new data directory, and on
    PostgreSQL a new database as well (dropped after the test)."""
    settings = Config(data_dir=str(tmp_path / "restored"))
    if buildmax_engine == "sqlite":
        yield settings
        return
    assert buildmax_pg_server is not None
    name = f"bmx_restore_{secrets.token_hex(6)}"
    url = await asyncio.to_thread(pg_create_database, buildmax_pg_server, name)
    try:
        yield settings.replace(database_url=url)
    finally:
        await asyncio.to_thread(pg_drop_database, buildmax_pg_server, name)


@pytest.fixture
def clock() -> ManualClock:
    """A clock that moves only when the test says so (starts at real now)."""
    return ManualClock(SystemClock().now_ms())


@pytest.fixture
def secret_watch(monkeypatch: pytest.MonkeyPatch) -> SecretWatch:
    """The secrets of this test (see :class:`SecretWatch`)."""
    watch = SecretWatch()
    watch.install(monkeypatch)
    return watch


@pytest.fixture
async def app(
    buildmax_settings: Config, clock: ManualClock, secret_watch: SecretWatch
) -> AsyncIterator[BuildMax]:
    """A started app (migrated, plugins loaded) on the test's database.

    When the test ends, no audit table and no line the server logged (at any
    level) may hold a secret the test's server minted or was sent: every
    test that changes something checks it."""
    application = create_app(buildmax_settings, clock=clock, auto_migrate=True)
    with LogWatch().watching() as logged:
        async with application.test_app():
            yield application
            leaked = await secret_watch.found_in_audit_tables(application)
            assert leaked == [], f"the audit trail holds secrets: {leaked}"
        leaked = [found for line in logged.lines for found in secret_watch.found_in(line)]
        assert leaked == [], f"the server's log holds secrets: {leaked}"


@pytest.fixture
def client(app: BuildMax) -> Any:
    """An ASGI test client of ``app``."""
    return app.test_client()


@pytest.fixture
def make_principal(app: BuildMax) -> Callable[..., Awaitable[PrincipalHandle]]:
    """``await make_principal(kind="agent", system_role=None, name=None)``."""

    async def make(
        kind: str = "agent", *, system_role: str | None = None, name: str | None = None
    ) -> PrincipalHandle:
        name = name or f"{kind}-{secrets.token_hex(4)}"
        async with app.db.write() as tx:
            now = app.clock.now_ms()
            row = await create_principal(tx, kind=kind, name=name, system_role=system_role, now=now)
            issued = await issue_token(tx, principal_pk=row["id"], now=now, name="test")
        return PrincipalHandle(row["id"], row["public_id"], name, kind, issued.secret)

    return make


@pytest.fixture
async def admin(make_principal: Callable[..., Awaitable[PrincipalHandle]]) -> PrincipalHandle:
    """A system admin with a token."""
    return await make_principal("human", system_role="admin", name="admin")


@pytest.fixture
def make_space(app: BuildMax) -> Callable[..., Awaitable[SpaceHandle]]:
    """``await make_space(owner, slug=None)``: a space owned by ``owner``."""

    async def make(owner: PrincipalHandle, slug: str | None = None) -> SpaceHandle:
        slug = slug or f"space-{secrets.token_hex(4)}"
        async with app.db.write() as tx:
            now = app.clock.now_ms()
            row = await create_space(
                tx, slug=slug, name=slug, owner_pk=owner.pk, created_by=owner.pk, now=now
            )
        return SpaceHandle(row["id"], row["public_id"], slug)

    return make


@contextlib.asynccontextmanager
async def serving(app: BuildMax) -> AsyncIterator[str]:
    """Serve a started ``app`` with Hypercorn on a free local port, for the
    block; yields its base URL."""
    from hypercorn.asyncio import serve
    from hypercorn.config import Config as HypercornConfig

    port = free_port()
    config = HypercornConfig()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.graceful_timeout = 1
    stop = asyncio.Event()

    # The app is already started: serve its ASGI interface without running
    # its lifespan a second time.
    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            message = await receive()
            while message is not None:
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
                message = await receive()
            return
        await app(scope, receive, send)

    task = asyncio.create_task(serve(asgi, config, shutdown_trigger=stop.wait))
    base = f"http://127.0.0.1:{port}"
    await _wait_until_listening("127.0.0.1", port)
    try:
        yield base
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, timeout=10)


@pytest.fixture
async def live_server(app: BuildMax) -> AsyncIterator[str]:
    """``app`` served by Hypercorn on a free local port; yields its base URL."""
    async with serving(app) as base:
        yield base


@pytest.fixture
def audit_log(app: BuildMax) -> Iterator[AuditRecorder]:
    """Every audit event the app records during the test (committed or not:
    pair with database assertions to check commit)."""
    from buildmax_hookspecs import hookimpl

    recorder = AuditRecorder()

    class Plugin:
        @hookimpl
        def buildmax_audit_record(self, tx: Any, event: Any) -> None:
            recorder.events.append(event)

    plugin = Plugin()
    app.plugins.pm.register(plugin, name="test-audit-recorder")
    try:
        yield recorder
    finally:
        app.plugins.pm.unregister(plugin)


__all__ = [
    "MIN_WATCHED_DISTINCT",
    "MIN_WATCHED_SECRET",
    "PG_PROBE_TIMEOUT",
    "TEST_DATABASE_ENV",
    "AuditRecorder",
    "ClonePool",
    "PgCluster",
    "PgServerChoice",
    "PgUnavailable",
    "PrincipalHandle",
    "SecretWatch",
    "ServerProcess",
    "SpaceHandle",
    "call",
    "choose_pg_server",
    "find_pg_bindir",
    "free_port",
    "pg_create_database",
    "pg_drop_database",
    "probe_pg_server",
    "redact_url",
    "serving",
    "start_server",
    "without_plugins",
]
