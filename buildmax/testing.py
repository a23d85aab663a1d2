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
import glob
import json
import os
import platform
import queue
import secrets
import shlex
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
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
from .database import DatabaseError, servers
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


def _administer(url: str, coroutine: Awaitable[Any]) -> Any:
    try:
        return asyncio.run(coroutine)  # type: ignore[arg-type]
    except DatabaseError as exc:
        raise RuntimeError(
            f"{TEST_DATABASE_ENV}={redact_url(url)}: {exc}. Start it or unset the "
            "variable to test on SQLite; PostgreSQL tests never skip."
        ) from exc


def pg_create_database(server_url: str, name: str, template: str | None = None) -> str:
    """Create database ``name`` (optionally from ``template``); its URL."""
    return _administer(server_url, servers.create_database(server_url, name, template))  # type: ignore[no-any-return]


def pg_drop_database(server_url: str, name: str) -> None:
    """Drop database ``name``, disconnecting whoever is still on it."""
    _administer(server_url, servers.drop_database(server_url, name))


# --- Which PostgreSQL server the session tests on -----------------------------
#
# The configured server when anything answers at BUILDMAX_TEST_DATABASE_URL;
# else a throwaway cluster when PostgreSQL's server binaries are installed;
# else the run stops with one line saying why. Never a skip.

PG_PROBE_TIMEOUT = 3.0
_PG_BINARIES = ("initdb", "pg_ctl", "postgres")
_PG_BIN_GLOB = "/usr/lib/postgresql/*/bin"


class PgUnavailable(Exception):
    """Nothing answers at the configured URL and no throwaway cluster is possible."""


@dataclass(frozen=True)
class PgServerChoice:
    """Where the session's PostgreSQL tests run.

    ``bindir`` is ``None`` when the configured ``url`` answers; otherwise it
    holds the binaries to start a throwaway cluster with, and ``reason`` says
    why the configured server was not used.
    """

    url: str
    bindir: Path | None = None
    reason: str = ""


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


async def _probe(url: str, within: float) -> str | None:
    import asyncpg

    dsn = url.replace("postgresql://", "postgres://", 1)
    try:
        conn = await asyncpg.connect(dsn, timeout=within)
    except ssl.SSLError:
        return None  # a server answered; the real connection reports the problem
    except ConnectionRefusedError:
        return "connection refused"
    except TimeoutError:
        return f"no answer within {within:g} s"
    except OSError as exc:
        return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
    except Exception:
        # Something answered (bad password, missing database...): use the
        # server and let the first real connection say what is wrong.
        return None
    await conn.close()
    return None


def probe_pg_server(url: str, timeout: float = PG_PROBE_TIMEOUT) -> str | None:
    """``None`` when something answers at ``url``, else why nothing does."""
    return asyncio.run(_probe(url, timeout))


def _has_server_binaries(bindir: Path) -> bool:
    return all(os.access(bindir / name, os.X_OK) for name in _PG_BINARIES)


def _version_key(bindir: Path) -> tuple[int, ...]:
    # /usr/lib/postgresql/<version>/bin: newest first
    return tuple(int(p) for p in bindir.parent.name.split(".") if p.isdigit())


def find_pg_bindir() -> Path | None:
    """PostgreSQL's server binaries (``pg_config --bindir``, else the newest
    ``/usr/lib/postgresql/*/bin``), or ``None``."""
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            out = ""
        if out and _has_server_binaries(Path(out)):
            return Path(out)
    found = [Path(p) for p in glob.glob(_PG_BIN_GLOB) if _has_server_binaries(Path(p))]
    return max(found, key=_version_key) if found else None


def choose_pg_server(url: str) -> PgServerChoice:
    """The configured server when it answers, else a throwaway cluster's
    binaries; :class:`PgUnavailable` (one line) when neither."""
    problem = probe_pg_server(url)
    if problem is None:
        return PgServerChoice(url)
    bindir = find_pg_bindir()
    if bindir is None:
        raise PgUnavailable(
            f"{TEST_DATABASE_ENV}={redact_url(url)}: nothing answers there ({problem}) and no "
            "PostgreSQL server binaries were found (pg_config --bindir, "
            f"{_PG_BIN_GLOB}) to start a throwaway cluster; start PostgreSQL there, install "
            "it, or unset the variable to test on SQLite."
        )
    return PgServerChoice(url, bindir, f"nothing answers at {redact_url(url)} ({problem})")


@dataclass
class PgCluster:
    """A throwaway PostgreSQL cluster in a temporary directory.

    Started with :meth:`start`; :meth:`stop` shuts it down and deletes the
    directory (idempotent). As root, ``initdb`` and ``pg_ctl`` (which refuse
    to run as root) run as the ``postgres`` user through ``runuser``.
    """

    bindir: Path
    root: Path
    port: int
    user: str = "postgres"
    dbname: str = "postgres"
    run_as: str | None = None

    @property
    def datadir(self) -> Path:
        """The cluster's data directory."""
        return self.root / "data"

    @property
    def logfile(self) -> Path:
        """The server's log."""
        return self.root / "server.log"

    @property
    def url(self) -> str:
        """``postgresql://`` URL of the cluster's database (trust auth)."""
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.dbname}"

    @classmethod
    def start(cls, bindir: Path, *, user: str = "postgres", dbname: str = "postgres") -> PgCluster:
        """initdb a cluster in a new temp dir, start it on a free port, create ``dbname``."""
        run_as = None
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            run_as = "postgres"
        root = Path(tempfile.mkdtemp(prefix="buildmax-pg-"))
        cluster = cls(bindir, root, free_port(), user, dbname, run_as)
        try:
            if run_as is not None:
                import pwd

                try:
                    account = pwd.getpwnam(run_as)
                except KeyError:
                    raise PgUnavailable(
                        f"running as root and there is no {run_as!r} user to run initdb/pg_ctl as"
                    ) from None
                os.chown(root, account.pw_uid, account.pw_gid)
            cluster._initdb()
            cluster._pg_ctl_start()
            if dbname != "postgres":
                admin = servers.database_url(cluster.url, "postgres")
                try:
                    asyncio.run(servers.create_database(admin, dbname))
                except DatabaseError as exc:
                    raise PgUnavailable(f"creating database {dbname!r} failed: {exc}") from None
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _command(self, program: str, *args: str) -> list[str]:
        argv = [str(self.bindir / program), *args]
        if self.run_as is None:
            return argv
        runuser = shutil.which("runuser") or next(
            (p for p in ("/usr/sbin/runuser", "/sbin/runuser") if os.path.exists(p)), None
        )
        if runuser is None:
            raise PgUnavailable("running as root and runuser is not installed to run " + program)
        return [runuser, "-u", self.run_as, "--", *argv]

    def _run(self, what: str, program: str, *args: str, timeout: float = 60) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        try:
            subprocess.run(
                self._command(program, *args),
                cwd=self.root,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=True,
            )
        except subprocess.CalledProcessError as exc:
            detail = (exc.stderr or exc.stdout or "").strip().splitlines()
            raise PgUnavailable(
                f"{what} failed (exit {exc.returncode}): "
                + (detail[-1] if detail else "no output")
                + self._log_tail()
            ) from None
        except subprocess.TimeoutExpired:
            raise PgUnavailable(f"{what} timed out after {timeout:g} s{self._log_tail()}") from None

    def _log_tail(self) -> str:
        try:
            lines = self.logfile.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return f"; server log: {lines[-1]}" if lines else ""

    def _initdb(self) -> None:
        locale = "C.UTF-8" if platform.system() == "Linux" else "C"
        self._run(
            "initdb",
            "initdb",
            "--pgdata",
            str(self.datadir),
            "--username",
            self.user,
            "--auth",
            "trust",
            "--encoding",
            "UTF8",
            "--locale",
            locale,
            "--no-sync",
        )

    def _pg_ctl_start(self) -> None:
        options = [
            f"-p {self.port}",
            "-c listen_addresses=127.0.0.1",
            "-c unix_socket_directories=" + shlex.quote(str(self.root)),
            "-c fsync=off",
            "-c synchronous_commit=off",
            "-c full_page_writes=off",
        ]
        self._run(
            "pg_ctl start",
            "pg_ctl",
            "start",
            "--pgdata",
            str(self.datadir),
            "--log",
            str(self.logfile),
            "--wait",
            "--timeout",
            "60",
            "-o",
            " ".join(options),
            timeout=90,
        )

    def stop(self) -> None:
        """Stop the server (fast, else immediate) and delete the directory; idempotent.

        A server that survives both loses its directory anyway, and PostgreSQL
        shuts itself down once it sees its lock file gone.
        """
        if not self.root.exists():
            return
        if (self.datadir / "postmaster.pid").exists():
            for mode in ("fast", "immediate"):
                with contextlib.suppress(PgUnavailable):
                    self._run(
                        "pg_ctl stop",
                        "pg_ctl",
                        "stop",
                        "--pgdata",
                        str(self.datadir),
                        "--mode",
                        mode,
                        timeout=30,
                    )
                    break
        shutil.rmtree(self.root, ignore_errors=True)


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


class ClonePool:
    """Clones of the template database made, and used ones dropped, by
    threads while the tests run.

    Cloning the migrated template takes 0.5 to 0.9 s on a shared machine
    (PostgreSQL writes and syncs every page), longer than most tests: made
    in line, the clones were more than half the ``pg`` run. ``makers``
    threads keep up to ``ready`` clones in stock, a thread drops what the
    tests hand back, and :meth:`close` drops the stock and waits for every
    drop, so the template can be dropped after it. Every test still gets a
    database nobody used before.
    """

    def __init__(
        self, server: str, template: str, *, makers: int = 2, ready: int = 3, prefix: str = "bmx_t"
    ) -> None:
        self.server = server
        self.template = template
        self.prefix = prefix
        self._stock: queue.Queue[str] = queue.Queue(maxsize=ready)
        #: Why making a clone failed (no server, no space): raised by take().
        self._failure: BaseException | None = None
        self._used: queue.Queue[str | None] = queue.Queue()
        self._closing = threading.Event()
        self._makers = [
            threading.Thread(target=self._make, name=f"bmx-clone-maker-{n}", daemon=True)
            for n in range(makers)
        ]
        self._dropper = threading.Thread(target=self._drop, name="bmx-clone-dropper", daemon=True)
        for thread in (*self._makers, self._dropper):
            thread.start()

    def _make(self) -> None:
        while not self._closing.is_set() and self._failure is None:
            name = f"{self.prefix}_{os.getpid()}_{secrets.token_hex(6)}"
            try:
                pg_create_database(self.server, name, template=self.template)
            except BaseException as exc:  # every later take() raises it
                self._failure = exc
                return
            while True:
                try:
                    self._stock.put(name, timeout=0.2)
                    break
                except queue.Full:
                    if self._closing.is_set():
                        self._used.put(name)
                        return

    def _drop(self) -> None:
        while (name := self._used.get()) is not None:
            with contextlib.suppress(RuntimeError):  # the session's end drops leftovers too
                pg_drop_database(self.server, name)

    def take(self) -> str:
        """A fresh clone's name (waits for a maker if the stock is empty)."""
        while True:
            try:
                return self._stock.get(timeout=0.2)
            except queue.Empty:
                if self._failure is not None:
                    raise self._failure from None

    def give_back(self, name: str) -> None:
        """Drop ``name`` in the background."""
        self._used.put(name)

    def close(self) -> None:
        """Stop making clones, drop the stock and wait for every drop."""
        self._closing.set()
        for maker in self._makers:
            maker.join()
        while True:
            try:
                self._used.put(self._stock.get_nowait())
            except queue.Empty:
                break
        self._used.put(None)
        self._dropper.join()


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

    from .plugins import ENTRY_POINT_GROUP

    kept = sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)} - set(names))
    return settings.replace(load_plugins=",".join(kept))


@pytest.fixture
def clock() -> ManualClock:
    """A clock that moves only when the test says so (starts at real now)."""
    return ManualClock(SystemClock().now_ms())


#: Secrets shorter than this are not looked for (they would match by chance).
MIN_WATCHED_SECRET = 8
#: Nor are secrets of fewer distinct characters: a generated password of
#: eight zeros is inside every audit chain's genesis hash (64 zeros).
MIN_WATCHED_DISTINCT = 3

#: The audit trail's tables (every plugin's tables carry its prefix).
_AUDIT_TABLES = {
    "sqlite": "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'audit\\_%' "
    "ESCAPE '\\'",
    "postgresql": "SELECT tablename AS name FROM pg_tables WHERE schemaname = current_schema() "
    "AND tablename LIKE 'audit\\_%' ESCAPE '\\'",
}


class SecretWatch:
    """Every secret a test's server minted (token secrets) or was sent
    (values of request fields marked ``metadata={"secret": True}``)."""

    def __init__(self) -> None:
        self.values: set[str] = set()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Start watching ``buildmax.tokens.new_secret`` and request bodies."""
        from . import bodies, tokens

        mint, validate = tokens.new_secret, bodies.validate

        def new_secret() -> str:
            secret = mint()
            self.values.add(secret)
            return secret

        def watched_validate(schema: Any, payload: Any) -> dict[str, Any]:
            if isinstance(payload, dict):
                for name, field in schema.fields.items():
                    value = payload.get(field.data_key or name)
                    if field.metadata.get("secret") and isinstance(value, str):
                        self.values.add(value)
            return validate(schema, payload)

        monkeypatch.setattr(tokens, "new_secret", new_secret)
        monkeypatch.setattr(bodies, "validate", watched_validate)

    async def found_in_audit_tables(self, app: BuildMax) -> list[str]:
        """``"<table>: <secret prefix>..."`` for every watched secret an
        audit table holds anywhere in a row."""
        import sqlalchemy as sa

        # As written, and as it reads inside stored JSON (quotes, backslashes
        # and control characters escaped).
        watched = [
            v
            for v in self.values
            if len(v) >= MIN_WATCHED_SECRET and len(set(v)) >= MIN_WATCHED_DISTINCT
        ]
        secrets_ = {*watched, *(json.dumps(v, ensure_ascii=False)[1:-1] for v in watched)}
        found = []
        async with app.db.read() as conn:
            names = [r["name"] for r in await conn.fetch_all(sa.text(_AUDIT_TABLES[conn.dialect]))]
            for name in names:
                for row in await conn.fetch_all(sa.text(f'SELECT * FROM "{name}"')):
                    text = " ".join(str(value) for value in row.values())
                    found += [f"{name}: {s[:6]}..." for s in secrets_ if s in text]
        return found


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

    When the test ends, no audit table may hold a secret the test's server
    minted or was sent: every test that changes something checks it."""
    application = create_app(buildmax_settings, clock=clock, auto_migrate=True)
    async with application.test_app():
        yield application
        leaked = await secret_watch.found_in_audit_tables(application)
        assert leaked == [], f"the audit trail holds secrets: {leaked}"


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

    def of(self, action: str, target_id: str | None = None) -> list[Any]:
        """The recorded events of ``action`` (about ``target_id``, when given)."""
        return [
            event
            for event in self.events
            if event.action == action and (target_id is None or event.target_id == target_id)
        ]


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
