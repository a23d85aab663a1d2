"""A journey's deployment: its own database and real ``buildmax serve``
processes, started, killed and restarted like an operator would.

Every journey gets a fresh database: a SQLite data directory of its own, or
a PostgreSQL database cloned from a migrated template (or an empty one when
the journey migrates it itself). Server processes log to files the
evidence bundle keeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from buildmax.database import DatabaseError, servers

from .journey import ServerPlan

#: Seconds a server process has to answer ``/readyz``.
READY_TIMEOUT = 60.0

#: The one-time admin token ``buildmax serve`` prints on a fresh database.
_BOOTSTRAP_TOKEN = re.compile(r"^\s+(bmx_[A-Za-z0-9_\-]+)\s*$", re.MULTILINE)

#: How a server process is started: this interpreter's ``buildmax serve``.
SERVE = (sys.executable, "-m", "buildmax", "serve")

#: Environment of every server process: the test-only fault plugin loads
#: only under it, and reads its switches from the journey's faults directory.
QUALIFICATION_ENV = "BUILDMAX_QUALIFICATION"
FAULTS_DIR_ENV = "BUILDMAX_FAULTS_DIR"


class InfrastructureError(RuntimeError):
    """Something the journey needs is missing or broken: a server that does
    not start, a database that cannot be reached, a tool not installed."""


def free_port() -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise InfrastructureError(f"cannot write {value!r} to a config file")


def config_text(settings: Mapping[str, Any], plugins: Mapping[str, Mapping[str, Any]]) -> str:
    """A server config file: top-level settings, then ``[plugins.<name>]`` tables."""
    lines = [f"{key} = {_toml_value(value)}" for key, value in settings.items()]
    for name, table in plugins.items():
        lines += ["", f"[plugins.{name}]"]
        lines += [f"{key} = {_toml_value(value)}" for key, value in table.items()]
    return "\n".join(lines) + "\n"


@dataclass
class ServerProcess:
    """One ``buildmax serve`` process of the deployment."""

    index: int
    port: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    #: Killed by the journey (an injected fault) since its last start.
    killed: bool = False
    #: Its last start answered ``/readyz`` (a start that failed is the step's failure).
    ready: bool = False

    @property
    def url(self) -> str:
        """Where it listens."""
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self.process is not None and self.process.poll() is None


@dataclass
class Deployment:
    """The database, config file and server processes of one journey."""

    engine: str
    workdir: Path
    plan: ServerPlan
    pg_server_url: str
    template: str | None = None
    database_url: str = ""
    database_name: str | None = None
    config_path: Path = field(init=False)
    servers: list[ServerProcess] = field(default_factory=list)
    admin_token: str | None = None
    #: The version the running server reports (its OpenAPI document's).
    server_version: str | None = None

    def __post_init__(self) -> None:
        self.config_path = self.workdir / "buildmax.toml"

    @property
    def data_dir(self) -> Path:
        """The SQLite database's directory (and every engine's file blob store)."""
        return self.workdir / "data"

    @property
    def faults_dir(self) -> Path:
        """Where fault switches are armed (files the fault plugin looks for)."""
        return self.workdir / "faults"

    @property
    def url(self) -> str:
        """The first server's URL."""
        return self.servers[0].url

    async def prepare(self) -> None:
        """Create the database and write the config file (no process yet)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.faults_dir.mkdir(exist_ok=True)
        settings: dict[str, Any] = {"data_dir": str(self.data_dir), "log_level": "info"}
        if self.engine == "postgres":
            self.database_name = f"bmq_{uuid.uuid4().hex[:16]}"
            template = self.template if self.plan.database == "template" else None
            try:
                self.database_url = await servers.create_database(
                    self.pg_server_url, self.database_name, template
                )
            except DatabaseError as exc:
                self.database_name = None
                raise InfrastructureError(f"PostgreSQL: {exc}") from exc
            settings["database_url"] = self.database_url
        else:
            self.database_url = f"sqlite:///{self.data_dir / 'buildmax.db'}"
        if self.plan.blob_faults:
            settings["blob_store_url"] = "faulty+" + (self.data_dir / "blobs").as_uri()
        settings.update(self.plan.settings)
        self.config_path.write_text(config_text(settings, self.plan.plugins), "utf-8")
        self.servers = [
            ServerProcess(i, free_port(), self.workdir / f"server-{i}.log")
            for i in range(self.plan.processes)
        ]

    def environment(self) -> dict[str, str]:
        """What points the CLI and the servers at this deployment."""
        return {
            "BUILDMAX_CONFIG": str(self.config_path),
            QUALIFICATION_ENV: "1",
            FAULTS_DIR_ENV: str(self.faults_dir),
        }

    async def start(self, index: int | None = None) -> None:
        """Start one server process (``index``) or all, and wait until each
        answers ``/readyz``."""
        for server in self.servers if index is None else [self.servers[index]]:
            await self._start(server)

    async def _start(self, server: ServerProcess) -> None:
        if server.running:
            return
        env = {**os.environ, **self.environment()}
        with server.log_path.open("ab") as log:
            log.write(f"--- start {server.starts + 1} of server {server.index} ---\n".encode())
            log.flush()
            server.process = await asyncio.to_thread(
                subprocess.Popen,
                [*SERVE, "--config", str(self.config_path), "--port", str(server.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.workdir,
                start_new_session=True,
            )
        server.starts += 1
        server.killed = server.ready = False
        await self._wait_ready(server)
        server.ready = True
        if self.admin_token is None:
            found = _BOOTSTRAP_TOKEN.search(server.log_path.read_text("utf-8", "replace"))
            self.admin_token = found.group(1) if found else None

    async def _wait_ready(self, server: ServerProcess) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        async with httpx.AsyncClient(timeout=2.0) as http:
            while time.monotonic() < deadline:
                if server.process is None or server.process.poll() is not None:
                    status = server.process.returncode if server.process else None
                    raise InfrastructureError(
                        f"server {server.index} exited with status {status} "
                        f"before it was ready: {self._tail(server)}"
                    )
                try:
                    if (await http.get(server.url + "/readyz")).status_code == 200:
                        if self.server_version is None:
                            api = (await http.get(server.url + "/v1/openapi.json")).json()
                            self.server_version = str(api["info"]["version"])
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
        raise InfrastructureError(
            f"server {server.index} not ready after {READY_TIMEOUT:g} s: {self._tail(server)}"
        )

    @staticmethod
    def _tail(server: ServerProcess) -> str:
        try:
            lines = server.log_path.read_text("utf-8", "replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return lines[-1] if lines else "(empty log)"

    def kill(self, index: int = 0) -> None:
        """SIGKILL a server process (and the workers it started): no
        shutdown, no chance to finish anything."""
        server = self.servers[index]
        if server.process is None:
            return
        # A process that already died on its own stays an unexpected exit.
        server.killed = server.killed or server.process.poll() is None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait()
        with server.log_path.open("ab") as log:
            log.write(f"--- server {server.index} killed (SIGKILL) ---\n".encode())

    async def stop(self) -> None:
        """Stop every process gracefully (SIGTERM, then SIGKILL after 15 s)."""
        for server in self.servers:
            if not server.running or server.process is None:
                continue
            os.killpg(server.process.pid, signal.SIGTERM)
            try:
                await asyncio.to_thread(server.process.wait, 15)
            except subprocess.TimeoutExpired:
                self.kill(server.index)

    def unexpected_exits(self) -> list[tuple[int, int | None]]:
        """``(index, exit status)`` of every server that was up and is gone
        although the journey did not kill it."""
        return [
            (s.index, s.process.returncode if s.process else None)
            for s in self.servers
            if s.ready and not s.running and not s.killed
        ]

    def exit_statuses(self) -> list[int | None]:
        """Each server's last exit status (``None``: never started or still running)."""
        return [s.process.poll() if s.process else None for s in self.servers]

    def log(self) -> str:
        """Every server process's log, one after the other."""
        parts = []
        for server in self.servers:
            try:
                parts.append(server.log_path.read_text("utf-8", "replace"))
            except OSError:
                continue
        return "".join(parts)

    async def discard(self) -> None:
        """Drop the journey's PostgreSQL database (the SQLite file stays with
        the journey's scratch directory)."""
        if self.database_name is not None:
            await servers.drop_database(self.pg_server_url, self.database_name)
            self.database_name = None
