"""pytest fixtures for BuildMax and its plugins (a ``pytest11`` plugin).

A plugin's tests get an app on a fresh database, a client and principals in
a few lines::

    async def test_ping(client, admin):
        response = await client.get("/v1/ping", headers=admin.headers)
        assert response.status_code == 200

The engine is SQLite unless ``BUILDMAX_TEST_DATABASE_URL`` names a
PostgreSQL server: then every test gets its own database, cloned from a
template migrated once per session, and dropped afterwards. An unreachable
PostgreSQL fails the tests loudly; it never skips them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from .app import BuildMax, create_app
from .clock import ManualClock, SystemClock
from .config import Config
from .principals import create_principal
from .spaces import create_space
from .tokens import issue_token

TEST_DATABASE_ENV = "BUILDMAX_TEST_DATABASE_URL"


@dataclass(frozen=True)
class PrincipalHandle:
    """A principal made for a test, with a working token."""

    pk: int
    id: str
    name: str
    kind: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        """``Authorization`` header for this principal's token."""
        return {"Authorization": f"Bearer {self.token}"}


@dataclass(frozen=True)
class SpaceHandle:
    """A space made for a test."""

    pk: int
    id: str
    slug: str


def _with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + name))


async def _pg_admin(url: str, statements: list[str]) -> None:
    import asyncpg

    try:
        conn = await asyncpg.connect(url.replace("postgresql://", "postgres://", 1), timeout=10)
    except Exception as exc:
        raise RuntimeError(
            f"{TEST_DATABASE_ENV}={url}: cannot reach PostgreSQL ({exc}). Start it or unset the "
            "variable to test on SQLite; PostgreSQL tests never skip."
        ) from exc
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


def pg_create_database(server_url: str, name: str, template: str | None = None) -> str:
    """Create database ``name`` (optionally from ``template``); its URL."""
    suffix = f" TEMPLATE {template}" if template else ""
    asyncio.run(_pg_admin(server_url, [f'CREATE DATABASE "{name}"{suffix}']))
    return _with_database(server_url, name)


def pg_drop_database(server_url: str, name: str) -> None:
    """Drop database ``name``, disconnecting whoever is still on it."""
    asyncio.run(_pg_admin(server_url, [f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)']))


@pytest.fixture(scope="session")
def buildmax_engine() -> str:
    """``"postgresql"`` when ``BUILDMAX_TEST_DATABASE_URL`` is set, else ``"sqlite"``."""
    return "postgresql" if os.environ.get(TEST_DATABASE_ENV) else "sqlite"


@pytest.fixture(scope="session")
def buildmax_pg_template(buildmax_engine: str) -> Iterator[str | None]:
    """A PostgreSQL database migrated once, cloned by every test."""
    if buildmax_engine != "postgresql":
        yield None
        return
    server = os.environ[TEST_DATABASE_ENV]
    name = f"bmx_tpl_{os.getpid()}_{secrets.token_hex(4)}"
    url = pg_create_database(server, name)
    try:

        async def migrate_template() -> None:
            from .migrations import migrate

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


@pytest.fixture
def buildmax_database_url(
    buildmax_engine: str, buildmax_pg_template: str | None, tmp_path: Path
) -> Iterator[str]:
    """A fresh, migrated database for one test (SQLite file or PostgreSQL clone)."""
    if buildmax_engine == "sqlite":
        yield f"sqlite:///{tmp_path / 'buildmax.db'}"
        return
    server = os.environ[TEST_DATABASE_ENV]
    name = f"bmx_t_{os.getpid()}_{secrets.token_hex(6)}"
    url = pg_create_database(server, name, template=buildmax_pg_template)
    try:
        yield url
    finally:
        pg_drop_database(server, name)


@pytest.fixture
def buildmax_settings(buildmax_database_url: str, tmp_path: Path) -> Config:
    """Settings of the test app: its own data directory and database."""
    url = buildmax_database_url if buildmax_database_url.startswith("postgresql") else ""
    return Config(data_dir=str(tmp_path / "data"), database_url=url)


@pytest.fixture
def clock() -> ManualClock:
    """A clock that moves only when the test says so (starts at real now)."""
    return ManualClock(SystemClock().now_ms())


@pytest.fixture
async def app(buildmax_settings: Config, clock: ManualClock) -> AsyncIterator[BuildMax]:
    """A started app (migrated, plugins loaded) on the test's database."""
    application = create_app(buildmax_settings, clock=clock, auto_migrate=True)
    async with application.test_app():
        yield application


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


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
async def live_server(app: BuildMax) -> AsyncIterator[str]:
    """``app`` served by Hypercorn on a free local port; yields its base URL."""
    from hypercorn.asyncio import serve
    from hypercorn.config import Config as HypercornConfig

    port = free_port()
    config = HypercornConfig()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.graceful_timeout = 1
    stop = asyncio.Event()

    # The app is already started by the ``app`` fixture: serve its ASGI
    # interface without running its lifespan a second time.
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


async def _wait_until_listening(host: str, port: int, within: float = 15) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            _reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        await writer.wait_closed()
        return
    raise TimeoutError(f"nothing listens on {host}:{port}")


@dataclass
class ServerProcess:
    """A ``buildmax serve`` child process."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        """Everything the server printed so far."""
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM, then wait; the exit code."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)


def start_server(
    settings: Config, log_path: Path, *, extra_env: dict[str, str] | None = None
) -> ServerProcess:
    """Start ``buildmax serve`` on a free port with ``settings``; wait for ``/readyz``."""
    import httpx

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUILDMAX_")}
    env.update(extra_env or {})
    args = [
        sys.executable,
        "-m",
        "buildmax",
        "serve",
        "--port",
        str(port),
        "--data-dir",
        settings.data_dir,
    ]
    if settings.database_url:
        args += ["--database-url", settings.database_url]
    log_file = open(log_path, "wb")  # noqa: SIM115 - handed to the child
    process = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    log_file.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    server = ServerProcess(url, process, log_path)
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{server.log()}")
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop()
    raise TimeoutError(f"server did not become ready:\n{server.log()}")


class AuditRecorder:
    """A plugin that keeps every audit event handed to ``buildmax_audit_record``."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def actions(self) -> list[str]:
        """The recorded actions, in order."""
        return [event.action for event in self.events]


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
