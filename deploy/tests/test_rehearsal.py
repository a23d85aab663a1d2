"""The compose topology of deploy/compose/compose.yaml, rehearsed from real
processes (no container engine): PostgreSQL, `buildmax db migrate`, the
first admin, two `buildmax serve` replicas on the compose file's settings,
the local S3 server of the artifact tests, and Debian's nginx with
deploy/nginx/buildmax.conf in front.

The scripted agent and reviewer of examples/ work through nginx, with a
16 MiB artifact in every submission, while one replica is stopped. The
client retries, so the loops would finish even after a SIGKILL: what only
draining gives is asserted from nginx's logs and the replica itself (no
failed request, no repeated one, the last event of every stream, /readyz
saying 503 before the process exits), and the same run with a SIGKILL shows
each of those checks failing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from buildmax_s3.testing import CREDENTIALS, S3Server

from buildmax.client import BuildMaxError, Client
from buildmax.config import Config
from buildmax.testing import (
    ServerProcess,
    free_port,
    pg_create_database,
    pg_drop_database,
    start_server,
)

pytestmark = [pytest.mark.rehearsal, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
PG_SERVER = os.environ.get(
    "BUILDMAX_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
TASKS = 6
#: The largest artifact the server accepts by default ([plugins.artifacts] max_bytes).
ARTIFACT_BYTES = 16 * 2**20
#: How long the requests held open across the stop take.
HOLD_SECONDS = 3
#: A line of nginx's access log (conftest's LOG_FORMAT).
ACCESS = re.compile(r'^(\S+) (\S+) (\S+) (\d{3}) "([^"]*)" "([^"]*)" "([^"]*)"$')


@dataclass
class Topology:
    """The running processes and where their logs are."""

    root: Path
    env: dict[str, str]
    replicas: list[ServerProcess]
    nginx: subprocess.Popen[bytes]
    url: str
    tls_url: str
    token: str

    @property
    def access_log(self) -> list[tuple[str, ...]]:
        """nginx's access log, one tuple per request (see :data:`LOG_FORMAT`)."""
        lines = (self.root / "nginx" / "access.log").read_text().splitlines()
        return [m.groups() for m in map(ACCESS.match, lines) if m]

    @property
    def error_log(self) -> str:
        """nginx's error log."""
        return (self.root / "nginx" / "error.log").read_text()


def _wait_ready(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited with {process.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not become ready:\n{log.read_text()}")


def _port(server: ServerProcess) -> int:
    """The port a server listens on (nginx's upstream)."""
    return int(server.url.rsplit(":", 1)[1])


def _command(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "buildmax", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"buildmax {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


def _server_config(
    root: Path, bucket: str, s3: S3Server, replaced: Callable[[str, str, str], str]
) -> Path:
    """The compose file's server configuration, with this machine's
    addresses in place of the compose network's."""
    text = (DEPLOY / "compose" / "buildmax.toml").read_text()
    text = replaced(text, 'host = "0.0.0.0"', 'host = "127.0.0.1"')
    text = replaced(text, 'trusted_proxies = "172.30.84.10"', 'trusted_proxies = "127.0.0.1"')
    text = replaced(text, '"s3://buildmax/blobs"', f'"s3://{bucket}/blobs"')
    text = replaced(text, '"http://minio:9000"', f'"{s3.endpoint_url}"')
    path = root / "buildmax.toml"
    path.write_text(text)
    return path


@pytest.fixture
def topology(
    tmp_path: Path,
    s3_server: S3Server,
    nginx_config: Callable[[Path, list[int], int, int], Path],
    shipped_text: Callable[[str, str, str], str],
    nginx_binary: str,
) -> Iterator[Topology]:
    """compose.yaml's services as processes on this machine, in its order:
    the database and the bucket, the migration, the first admin, two
    servers, nginx."""
    database = f"bmx_rehearsal_{uuid.uuid4().hex[:12]}"
    database_url = pg_create_database(PG_SERVER, database)
    bucket = f"buildmax-{uuid.uuid4().hex[:12]}"
    s3_server.client().create_bucket(Bucket=bucket)
    # What compose gives every BuildMax container.
    server_env = CREDENTIALS | {
        "BUILDMAX_CONFIG": str(_server_config(tmp_path, bucket, s3_server, shipped_text)),
        "BUILDMAX_DATABASE_URL": database_url,
    }
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUILDMAX_")} | server_env
    replicas: list[ServerProcess] = []
    nginx: subprocess.Popen[bytes] | None = None
    try:
        _command(env, "db", "migrate")
        token = _command(env, "admin", "bootstrap").strip().splitlines()[-1]
        replicas = [
            start_server(
                Config(data_dir=str(tmp_path / name)),
                tmp_path / f"{name}.log",
                extra_env=server_env,
            )
            for name in ("buildmax-1", "buildmax-2")
        ]
        http_port, https_port = free_port(), free_port()
        config = nginx_config(tmp_path, [_port(r) for r in replicas], http_port, https_port)
        with open(tmp_path / "nginx" / "stderr.log", "wb") as output:
            nginx = subprocess.Popen(
                [
                    nginx_binary,
                    "-p",
                    str(tmp_path / "nginx"),
                    "-c",
                    str(config),
                    "-g",
                    "daemon off;",
                ],
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        url = f"http://127.0.0.1:{http_port}"
        _wait_ready(url, nginx, tmp_path / "nginx" / "error.log")
        yield Topology(
            tmp_path, env, replicas, nginx, url, f"https://127.0.0.1:{https_port}", token
        )
    finally:
        if nginx is not None:
            nginx.terminate()
            nginx.wait(10)
        for replica in replicas:
            replica.stop()
        pg_drop_database(PG_SERVER, database)


# -- the work ------------------------------------------------------------------


@dataclass
class Stream:
    """An event stream through nginx, read on a thread."""

    url: str
    token: str
    lines: list[str] = field(default_factory=list)
    ended: bool = False
    error: str | None = None

    def __post_init__(self) -> None:
        self._client = httpx.Client(timeout=httpx.Timeout(10, read=120))
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        try:
            with self._client.stream(
                "GET", self.url, headers={"Authorization": f"Bearer {self.token}"}
            ) as response:
                for line in response.iter_lines():
                    self.lines.append(line)
        except (httpx.HTTPError, RuntimeError) as exc:  # closed by close()
            self.error = repr(exc)
        self.ended = True

    def events(self) -> list[str]:
        """The event names received, in order."""
        return [line.removeprefix("event: ") for line in self.lines if line.startswith("event: ")]

    def saw(self, text: str, within: float) -> bool:
        """Whether a line holding ``text`` arrives within ``within`` seconds."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines):
                return True
            time.sleep(0.05)
        return False

    def close(self) -> None:
        """Stop reading."""
        self._client.close()
        self._thread.join(10)


@dataclass
class Observed:
    """What one rehearsal saw."""

    agent: dict[str, Any]
    agent_exit: int
    reviewer_exits: list[int]
    held: list[int | str]
    readyz_while_stopping: list[int]
    stopped_exit: int
    ended_streams: list[list[str]]
    live_after: bool
    failed_requests: list[tuple[str, ...]]
    repeated_keys: list[str]
    upstream_failures: list[str]


def _api(topology: Topology, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=topology.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def _arrange(topology: Topology) -> dict[str, str]:
    """A space with an agent, a reviewer, a project, an agent definition
    and :data:`TASKS` tasks for it; spaces for the held requests."""
    tokens: dict[str, str] = {}
    with _api(topology, topology.token) as admin:

        def made(response: httpx.Response) -> dict[str, Any]:
            assert response.status_code == 201, response.text
            return dict(response.json())

        made(admin.post("/v1/spaces", json={"slug": "work"}))
        for name in ("coder", "reviewer"):
            principal = made(admin.post("/v1/principals", json={"kind": "agent", "name": name}))
            tokens[name] = made(
                admin.post("/v1/tokens", json={"name": name, "principal_id": principal["id"]})
            )["token"]
            put = admin.put(f"/v1/spaces/work/members/{principal['id']}", json={"role": "member"})
            assert put.status_code in (200, 201), put.text
        made(
            admin.post(
                "/v1/spaces/work/projects",
                json={
                    "name": "app",
                    "repository_url": "https://git.test/app.git",
                    "target_branch": "main",
                },
            )
        )
        made(admin.post("/v1/spaces/work/agents", json={"name": "coder"}))
        for n in range(TASKS):
            made(
                admin.post(
                    "/v1/spaces/work/tasks",
                    json={"project": "app", "title": f"task {n}", "agent": "coder"},
                )
            )
        for n in range(6):
            made(admin.post("/v1/spaces", json={"slug": f"held-{n}"}))
    return tokens


def _run_example(topology: Topology, script: str, token: str, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUILDMAX_")}
    return subprocess.Popen(
        [
            sys.executable,
            str(REPO / "examples" / script),
            "--url",
            topology.url,
            "--token",
            token,
            "--space",
            "work",
            *args,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _held_request(topology: Topology, space: str, results: list[int | str]) -> threading.Thread:
    """A request held open for :data:`HOLD_SECONDS`, sent by the Python
    client as an agent's would be: it retries a 502 (the same
    Idempotency-Key again, which nginx's log shows)."""

    def run() -> None:
        with Client(topology.url, topology.token) as client:
            try:
                client.request(
                    "POST",
                    f"/v1/spaces/{space}/testplugin/slow-increment",
                    params={"hold": HOLD_SECONDS},
                )
                results.append(200)
            except BuildMaxError as exc:
                results.append(repr(exc))

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def rehearse(topology: Topology, stop: signal.Signals) -> Observed:
    """Run the loops through nginx and stop the first replica with ``stop``
    while they run, with requests and event streams in flight."""
    tokens = _arrange(topology)
    stopped = topology.replicas[0]
    artifact = topology.root / "big.bin"
    artifact.write_bytes(os.urandom(ARTIFACT_BYTES))
    events_url = f"{topology.url}/v1/spaces/work/events"
    streams = [Stream(events_url, topology.token) for _ in range(4)]
    with _api(topology, topology.token) as admin:
        # Live through nginx, from whichever replica holds each stream.
        probe = admin.post(
            "/v1/spaces/work/tasks", json={"project": "app", "title": "probe before"}
        ).json()["id"]
        assert all(s.saw(probe, within=10) for s in streams), [s.lines for s in streams]

    agent = _run_example(
        topology,
        "agent_loop.py",
        tokens["coder"],
        "--agent",
        "coder",
        "--workdir",
        str(topology.root / "work"),
        "--until-empty",
        "--attach",
        str(artifact),
        "--json",
    )
    reviewer_exits: list[int] = []
    reviewing = threading.Event()

    def review() -> None:
        while True:
            last = reviewing.is_set()
            done = _run_example(topology, "reviewer_loop.py", tokens["reviewer"], "--until-empty")
            done.communicate(timeout=300)
            reviewer_exits.append(done.returncode)
            if last:
                return
            time.sleep(0.5)

    reviewer = threading.Thread(target=review)
    reviewer.start()

    # Stop the replica once work is under way, with requests held open.
    deadline = time.monotonic() + 120
    while not any(line[2].endswith("/submit") for line in topology.access_log):
        assert time.monotonic() < deadline, "the agent submitted nothing in 2 minutes"
        assert agent.poll() is None, agent.communicate()
        time.sleep(0.1)
    held: list[int | str] = []
    holders = [_held_request(topology, f"held-{n}", held) for n in range(6)]
    time.sleep(0.5)
    stopped.process.send_signal(stop)
    readyz: list[int] = []
    while stopped.process.poll() is None:
        try:
            response = httpx.get(stopped.url + "/readyz", timeout=1)
            readyz.append(response.status_code)
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    stopped_exit = stopped.process.wait()

    out, err = agent.communicate(timeout=300)
    assert out, err
    reviewing.set()
    reviewer.join(300)
    for holder in holders:
        holder.join(30)
    time.sleep(0.5)  # nginx writes a stream's log line when it ends
    # The streams the stopped replica held have ended; the others still
    # deliver, live.
    ended = [s.events() for s in streams if s.ended]
    with _api(topology, topology.token) as admin:
        after = admin.post(
            "/v1/spaces/work/tasks", json={"project": "app", "title": "probe after"}
        ).json()["id"]
    open_streams = [s for s in streams if not s.ended]
    live_after = bool(open_streams) and all(s.saw(after, within=10) for s in open_streams)
    for stream in streams:
        stream.close()

    stopped_address = f"127.0.0.1:{_port(stopped)}"
    access = topology.access_log
    keys = [line[6] for line in access if line[6] not in ("", "-")]
    failures = [
        line
        for line in topology.error_log.splitlines()
        if stopped_address in line
        and re.search(r"prematurely closed|reset by peer|while reading response|timed out", line)
    ]
    return Observed(
        agent=json.loads(out),
        agent_exit=agent.returncode,
        reviewer_exits=reviewer_exits,
        held=held,
        readyz_while_stopping=readyz,
        stopped_exit=stopped_exit,
        ended_streams=ended,
        live_after=live_after,
        failed_requests=[line for line in access if int(line[3]) >= 500],
        repeated_keys=sorted({k for k in keys if keys.count(k) > 1}),
        upstream_failures=failures,
    )


def drain_failures(seen: Observed) -> dict[str, str]:
    """What only a drain gives that this run did not have, by check."""
    failed: dict[str, str] = {}
    if seen.failed_requests:
        failed["no failed request"] = f"nginx answered {seen.failed_requests}"
    if seen.upstream_failures:
        failed["no request cut off"] = "\n".join(seen.upstream_failures)
    if seen.repeated_keys:
        failed["no client retry"] = f"requests sent again: {seen.repeated_keys}"
    if not seen.ended_streams or any(
        events[-1:] != ["server-closing"] for events in seen.ended_streams
    ):
        failed["last event"] = f"the stopped replica's streams got {seen.ended_streams}"
    if 503 not in seen.readyz_while_stopping:
        failed["readyz 503"] = f"/readyz while stopping: {seen.readyz_while_stopping}"
    if any(status != 200 for status in seen.held):
        failed["held requests finish"] = f"requests in flight got {seen.held}"
    return failed


def test_a_replica_stopped_mid_run_drains_and_the_loops_finish(topology: Topology) -> None:
    seen = rehearse(topology, signal.SIGTERM)

    assert seen.agent_exit == 0, seen.agent
    assert len(seen.agent["submitted"]) == TASKS
    assert all(len(done["attached"]) == 1 for done in seen.agent["submitted"])
    assert seen.reviewer_exits and set(seen.reviewer_exits) == {0}
    assert seen.stopped_exit == 0
    assert seen.live_after, "the streams of the other replica stopped delivering"
    assert drain_failures(seen) == {}
    # The uploads were the largest artifact the server takes, whole.
    with _api(topology, topology.token) as admin:
        listed = admin.get("/v1/spaces/work/artifacts", params={"limit": 200}).json()["items"]
    assert sorted(a["size"] for a in listed if a["size"] > 1024) == [ARTIFACT_BYTES] * TASKS
    # The backup service's command, on this topology: the database and
    # every blob of the bucket, while the other server runs.
    backup = (DEPLOY / "compose" / "compose.yaml").read_text()
    assert "buildmax backup create --keep 7" in backup
    target = topology.root / "backups"
    said = _command(
        topology.env | {"BUILDMAX_BACKUP_DIR": str(target)}, "backup", "create", "--keep", "7"
    )
    assert [p.name for p in target.iterdir() if p.is_dir() and p.name != "blobs"], said
    # The same file in every attempt is one blob (content-addressed).
    assert sum(f.stat().st_size for f in target.rglob("*") if f.is_file()) > ARTIFACT_BYTES
    # TLS through the example's other server block.
    assert httpx.get(topology.tls_url + "/readyz", verify=False).status_code == 200
    # /metrics is not passed through.
    assert httpx.get(topology.url + "/metrics").status_code == 404


def test_a_replica_killed_mid_run_fails_the_checks_only_a_drain_passes(
    topology: Topology,
) -> None:
    seen = rehearse(topology, signal.SIGKILL)

    failed = drain_failures(seen)
    assert {
        "no failed request",
        "no request cut off",
        "no client retry",
        "last event",
        "readyz 503",
    } <= set(failed), failed
