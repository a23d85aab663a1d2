"""The PostgreSQL server a test session runs on: choosing it (or starting a
throwaway cluster), the migrated template, and the pool of per-test clones."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import platform
import queue
import secrets
import shlex
import shutil
import ssl
import subprocess
import tempfile
import threading
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from ..database import DatabaseError, servers
from .processes import free_port

TEST_DATABASE_ENV = "BUILDMAX_TEST_DATABASE_URL"


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
