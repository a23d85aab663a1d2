"""Claim-next -> renew -> submit by 50 agents over HTTP, on SQLite and on PostgreSQL.

    python benchmarks/bench_claims.py [--historical 1000000] [--ready 10000]
                                      [--agents 50] [--duration 20] [--warmup 5]
                                      [--engines sqlite,postgresql] [--profile] [--json]

SQLite: one ``buildmax serve`` with its default configuration (printed) on a
fresh data directory. PostgreSQL: a fresh database on ``--pg-url`` (dropped at
the end), migrated with ``buildmax db migrate``, two ``buildmax serve``
processes on it, the agents split between them; then, in the same run,
procrastinate (``pq_workers.py``) doing claim -> finish of no-op jobs with 50
workers of concurrency 1 on the same PostgreSQL server (its own fresh
database), over the same warm-up and duration.

Each engine's data is seeded with bulk SQL straight into the database after
the server migrated it: ``--projects`` projects, ``--historical`` done tasks
spread over them and ``--ready`` ready tasks, each with its ``task_revisions``
row (number 1 = ``tasks.revision``). No attempt rows are seeded for history.

The agents are principals of kind ``agent``, members of the space, each with
its own API token and one keep-alive HTTP/1.1 connection (a small asyncio
client on uvloop in this process, so the load generator stays cheap; its CPU
is measured and printed). Each loops: ``POST /v1/spaces/{s}/claims
{"kind": "code"}`` with its token (every submission makes a review work item,
which inherits its subject's priority: a claim of any kind would reach the
priority-2 reviews after the seeded priority-2 tasks, and a review needs a
decision this loop does not send); then with the attempt token from the
answer ``POST .../attempts/{id}/renew {generation}`` and ``POST .../attempts/
{id}/submit {generation, summary}``. A probe reads ``GET /v1/spaces/{s}/ready?limit=20`` every 0.1 s
during the run, and ``--probe-alone`` times sequentially with no other load.

On SQLite a write ceiling is measured in the same run (``ceiling_write_app.py``:
same URLs, each write one bare ``BEGIN IMMEDIATE; INSERT; COMMIT`` over HTTP)
with the same agent loop. Targets (PERFORMANCE.md, issue 3 item 9): ready query
p95 < 10 ms (timed alone), >= 200 cycles/s on SQLite, no error other than
expected 409s, PostgreSQL cycles/s >= 0.5 x procrastinate's jobs/s.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import importlib.util
import json
import os
import platform
import resource
import secrets
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

from bench_read import (
    HOST,
    BenchError,
    Server,
    buildmax_command,
    clean_env,
    db_url,
    free_port,
    http,
    nearest_rank,
    proc_cpu_seconds,
    proc_status,
    spawn,
    strip_private,
    version_of,
    wait_ready,
)

HERE = Path(__file__).resolve().parent
#: What the agents claim: code work (the loop cannot hand in a review).
CLAIM_BODY = {"kind": "code"}
CEILING_WRITE_APP = HERE / "ceiling_write_app.py"
PQ_WORKERS = HERE / "pq_workers.py"
SERVE_CENSUS = HERE / "serve_census.py"
TARGET_READY_P95_MS = 10.0
TARGET_SQLITE_CYCLES = 200.0
TARGET_PG_RATIO = 0.5
EXPECTED_STATUS = 409
SETUP_TIMEOUT_S = 120.0
SUMMARY = "benchmark cycle"


def progress(message: str) -> None:
    print(f"[bench_claims] {message}", file=sys.stderr, flush=True)


def pct(values: list[float], p: float) -> float | None:
    """The ``p``-th percentile (nearest rank) of ``values`` in seconds, as ms."""
    if not values:
        return None
    return round(nearest_rank(values, p) * 1000, 2)


def latency_summary(values: list[float]) -> dict[str, Any]:
    return {
        "count": len(values),
        "p50": pct(values, 50),
        "p95": pct(values, 95),
        "p99": pct(values, 99),
        "max": round(max(values) * 1000, 2) if values else None,
    }


# --------------------------------------------------------------------------- HTTP client


class HttpConn:
    """One keep-alive HTTP/1.1 connection to 127.0.0.1 (Content-Length or chunked answers).

    Several times cheaper per request than a general client, so 50 agents in
    one process leave the cores to the servers."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.host_header = f"{HOST}:{port}".encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.connects = 0

    async def close(self) -> None:
        writer, self.reader, self.writer = self.writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def request(
        self, method: str, path: str, token: str | None, body: bytes | None = None
    ) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(HOST, self.port)
            self.connects += 1
        assert self.reader is not None and self.writer is not None
        head = [f"{method} {path} HTTP/1.1".encode(), b"Host: " + self.host_header]
        if token:
            head.append(b"Authorization: Bearer " + token.encode())
        if body is not None:
            head.append(b"Content-Type: application/json")
            head.append(b"Content-Length: " + str(len(body)).encode())
        self.writer.write(b"\r\n".join(head) + b"\r\n\r\n" + (body or b""))
        try:
            raw = await self.reader.readuntil(b"\r\n\r\n")
            lines = raw[:-4].split(b"\r\n")
            status = int(lines[0].split(b" ", 2)[1])
            length = None
            chunked = close = False
            for line in lines[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"transfer-encoding" and b"chunked" in value.lower():
                    chunked = True
                elif name == b"connection" and b"close" in value.lower():
                    close = True
            if chunked:
                parts = []
                while True:
                    size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    if size == 0:
                        await self.reader.readuntil(b"\r\n")
                        break
                    parts.append(await self.reader.readexactly(size))
                    await self.reader.readexactly(2)
                data = b"".join(parts)
            elif length is not None:
                data = await self.reader.readexactly(length)
            else:
                data = await self.reader.read()
                close = True
        except BaseException:
            await self.close()
            raise
        if close:
            await self.close()
        return status, data


# --------------------------------------------------------------------------- load


@dataclasses.dataclass
class Agent:
    name: str
    principal_id: str
    token: str
    port: int


@dataclasses.dataclass
class LoadResult:
    latencies: dict[str, list[float]]
    errors: collections.Counter[str]
    warmup_errors: collections.Counter[str]
    statuses: collections.Counter[str]
    cycles: int
    empty: int
    seconds: float
    client_cpu_s: float
    cycles_all: int
    claims_all: int
    submits_all: int
    reconnects: int
    unfinished_agents: int


class Load:
    """50 agents looping claim-next -> renew -> submit, and a ready-queue probe."""

    def __init__(
        self,
        agents: list[Agent],
        space_id: str,
        probe_port: int,
        probe_token: str,
        opts: argparse.Namespace,
    ) -> None:
        self.agents = agents
        self.space = space_id
        self.probe_port = probe_port
        self.probe_token = probe_token
        self.opts = opts
        self.latencies: dict[str, list[float]] = collections.defaultdict(list)
        self.errors: collections.Counter[str] = collections.Counter()
        self.warmup_errors: collections.Counter[str] = collections.Counter()
        self.statuses: collections.Counter[str] = collections.Counter()
        self.cycles = self.empty = 0
        self.cycles_all = self.claims_all = self.submits_all = 0
        self.stop = False
        self.w0 = self.w1 = 0.0
        self.conns: list[HttpConn] = []

    def _in_window(self, t: float) -> bool:
        return self.w0 <= t < self.w1

    def _record(self, op: str, start: float, status: int | None, kind: str | None) -> None:
        end = time.perf_counter()
        if status is not None:
            self.statuses[f"{op} {status}"] += 1
        if kind is not None:
            (self.errors if self._in_window(end) else self.warmup_errors)[f"{op}: {kind}"] += 1
        elif self._in_window(end):
            self.latencies[op].append(end - start)

    async def _call(
        self, conn: HttpConn, op: str, method: str, path: str, token: str, body: Any
    ) -> tuple[int | None, Any]:
        data = None if body is None else json.dumps(body).encode()
        start = time.perf_counter()
        try:
            status, raw = await asyncio.wait_for(
                conn.request(method, path, token, data), self.opts.request_timeout
            )
        except TimeoutError:
            await conn.close()
            self._record(op, start, None, "timeout")
            return None, None
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
            self._record(op, start, None, type(exc).__name__)
            return None, None
        ok = 200 <= status < 300
        kind = None if ok else f"HTTP {status}"
        self._record(op, start, status, kind)
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            answer = None
        return status, answer

    async def _agent(self, agent: Agent) -> None:
        conn = HttpConn(agent.port)
        self.conns.append(conn)
        base = f"/v1/spaces/{self.space}"
        try:
            while not self.stop:
                start = time.perf_counter()
                status, answer = await self._call(
                    conn, "claim", "POST", f"{base}/claims", agent.token, CLAIM_BODY
                )
                if status == 200:  # nothing claimable: count it, do not spin
                    if self._in_window(time.perf_counter()):
                        self.empty += 1
                    await asyncio.sleep(0.05)
                    continue
                if status != 201 or not answer or not answer.get("attempt"):
                    if status != EXPECTED_STATUS:
                        await asyncio.sleep(0.05)
                    continue
                self.claims_all += 1
                attempt = answer["attempt"]
                token = answer["token"]
                path = f"{base}/attempts/{attempt['id']}"
                generation = attempt["generation"]
                status, _ = await self._call(
                    conn, "renew", "POST", f"{path}/renew", token, {"generation": generation}
                )
                if status != 200:
                    continue
                status, _ = await self._call(
                    conn,
                    "submit",
                    "POST",
                    f"{path}/submit",
                    token,
                    {"generation": generation, "summary": SUMMARY},
                )
                if status != 201:
                    continue
                self.submits_all += 1
                self.cycles_all += 1
                end = time.perf_counter()
                if self._in_window(end):
                    self.cycles += 1
                    self.latencies["cycle"].append(end - start)
        finally:
            await conn.close()

    async def _probe(self) -> None:
        conn = HttpConn(self.probe_port)
        self.conns.append(conn)
        path = f"/v1/spaces/{self.space}/ready?limit=20"
        try:
            while not self.stop:
                await self._call(conn, "ready (under load)", "GET", path, self.probe_token, None)
                await asyncio.sleep(self.opts.probe_interval)
        finally:
            await conn.close()

    async def run(self, on_window_start: Any, on_window_end: Any) -> LoadResult:
        loop_start = time.perf_counter()
        self.w0 = loop_start + self.opts.warmup
        self.w1 = self.w0 + self.opts.duration
        tasks = [asyncio.create_task(self._agent(a)) for a in self.agents]
        tasks.append(asyncio.create_task(self._probe()))
        await asyncio.sleep(max(0.0, self.w0 - time.perf_counter()))
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        on_window_start()
        await asyncio.sleep(max(0.0, self.w1 - time.perf_counter()))
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        on_window_end()
        self.stop = True
        _, pending = await asyncio.wait(tasks, timeout=self.opts.request_timeout + 5)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        client_cpu = (cpu1.ru_utime + cpu1.ru_stime) - (cpu0.ru_utime + cpu0.ru_stime)
        return LoadResult(
            latencies=dict(self.latencies),
            errors=self.errors,
            warmup_errors=self.warmup_errors,
            statuses=self.statuses,
            cycles=self.cycles,
            empty=self.empty,
            seconds=self.w1 - self.w0,
            client_cpu_s=round(client_cpu, 2),
            cycles_all=self.cycles_all,
            claims_all=self.claims_all,
            submits_all=self.submits_all,
            reconnects=sum(max(0, c.connects - 1) for c in self.conns),
            unfinished_agents=len(pending),
        )


def run_async(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


async def probe_alone(port: int, space_id: str, token: str, count: int) -> dict[str, Any]:
    """``count`` sequential ready-queue reads on one connection, nothing else running."""
    conn = HttpConn(port)
    path = f"/v1/spaces/{space_id}/ready?limit=20"
    times: list[float] = []
    errors: collections.Counter[str] = collections.Counter()
    items = 0
    try:
        for i in range(count + 20):  # the first 20 warm caches and are not counted
            start = time.perf_counter()
            status, raw = await conn.request("GET", path, token)
            elapsed = time.perf_counter() - start
            if status != 200:
                errors[f"HTTP {status}"] += 1
                continue
            if i >= 20:
                times.append(elapsed)
                items = len(json.loads(raw)["items"])
    finally:
        await conn.close()
    return {"latency_ms": latency_summary(times), "errors": dict(errors), "items": items}


# --------------------------------------------------------------------------- samplers


class Sampler:
    """Samples VmRSS of some pids every 0.1 s until stopped (peak per pid)."""

    def __init__(self, pids: list[int], interval: float = 0.1) -> None:
        self.pids = pids
        self.peak: dict[int, int] = dict.fromkeys(pids, 0)
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            for pid in self.pids:
                rss = proc_status(pid).get("VmRSS")
                if rss is not None and rss > self.peak[pid]:
                    self.peak[pid] = rss

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def postgres_pids() -> list[int]:
    """Every process named ``postgres`` (the server and its backends), for CPU context."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/comm") as fh:
                    if fh.read().strip() == "postgres":
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


def machine_cpu() -> tuple[float, float]:
    """Busy and total CPU seconds of the whole machine so far (all cores, /proc/stat)."""
    with open("/proc/stat") as fh:
        values = [int(v) for v in fh.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    total = sum(values[:8])
    tck = os.sysconf("SC_CLK_TCK")
    return (total - idle) / tck, total / tck


def cpu_of(pids: list[int]) -> dict[int, float]:
    return {pid: cpu for pid in pids if (cpu := proc_cpu_seconds(pid)) is not None}


class CpuWindow:
    """CPU seconds of processes over the measured window (postgres backends included)."""

    def __init__(self, pids: list[int], postgres: bool) -> None:
        self.pids = pids
        self.postgres = postgres
        self.before: dict[int, float] = {}
        self.pg_before: dict[int, float] = {}
        self.result: dict[int, float] = {}
        self.pg_result: float | None = None
        self.machine_before = (0.0, 0.0)
        self.machine_busy_s = self.machine_total_s = 0.0

    def start(self) -> None:
        self.machine_before = machine_cpu()
        self.before = cpu_of(self.pids)
        if self.postgres:
            self.pg_before = cpu_of(postgres_pids())

    def end(self) -> None:
        busy0, total0 = self.machine_before
        busy1, total1 = machine_cpu()
        self.machine_busy_s = round(busy1 - busy0, 2)
        self.machine_total_s = round(total1 - total0, 2)
        after = cpu_of(self.pids)
        self.result = {
            pid: round(after[pid] - self.before[pid], 2)
            for pid in self.pids
            if pid in after and pid in self.before
        }
        if self.postgres:
            pg_after = cpu_of(postgres_pids())
            # Backends that ended in the window are lost; new ones count from zero.
            self.pg_result = round(
                sum(cpu - self.pg_before.get(pid, 0.0) for pid, cpu in pg_after.items()), 2
            )


# --------------------------------------------------------------------------- profiling

PROFILE_RULES: list[tuple[str, tuple[str, ...]]] = [
    ("SQLite execution on the event loop (short reads)", ("buildmax/database/sqlite.py",)),
    ("aiosqlite hand-off, event-loop side", ("aiosqlite/",)),
    ("PostgreSQL driver (asyncpg, databases)", ("asyncpg/", "databases/")),
    ("SQL compile (SQLAlchemy)", ("sqlalchemy/", "buildmax/database/statements.py")),
    ("JSON + marshmallow", ("marshmallow/", "json/", "buildmax/bodies.py")),
    ("auth (token lookup)", ("buildmax/auth.py", "buildmax/tokens.py")),
    ("audit", ("buildmax/audit.py",)),
    ("outbox events", ("buildmax/events.py",)),
    ("idempotency", ("buildmax/idempotency.py",)),
    ("plugin hooks (pluggy)", ("pluggy/",)),
    ("tasks plugin code", ("buildmax_tasks/",)),
    ("buildmax kernel code", ("buildmax/",)),
    ("HTTP (hypercorn/h11/quart/werkzeug)", ("hypercorn/", "h11/", "quart/", "werkzeug/")),
    ("event loop (uvloop C code: I/O, callbacks) and asyncio", ("asyncio/", "uvloop")),
]
AIOSQLITE_THREAD = "_connection_worker_thread"


def _frame_file(frame: str) -> str:
    # py-spy raw frames look like "function (path/to/file.py:123)"
    inner = frame.rpartition("(")[2]
    return inner.rstrip(")").rpartition(":")[0] or inner


def classify(thread: str, body: list[str]) -> tuple[str, set[str]]:
    """The component of one sample (deepest matching frame) and every component on it."""
    if AIOSQLITE_THREAD in thread:
        if any("_execute_fetchall" in f or "_execute_insert" in f for f in body):
            return "SQLite execution (aiosqlite threads: writer, readers)", set()
        return "aiosqlite threads: waiting for work, hand-off, GIL", set()
    matched = None
    seen: set[str] = set()
    for frame in reversed(body):
        file = _frame_file(frame)
        for name, needles in PROFILE_RULES:
            if any(n in file for n in needles):
                if matched is None:
                    matched = name
                seen.add(name)
                break
    return matched or "other", seen


def analyse_profile(path: Path, top: int = 15) -> dict[str, Any]:
    """Components and hottest functions of a py-spy ``--format raw --threads`` file.

    Each sample goes to the component of its deepest frame that matches a
    rule (so SQL run from audit code counts as SQL, and audit's own Python
    as audit); ``inclusive`` counts a sample for every component on its
    stack (event-loop thread only)."""
    component: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    leaf: collections.Counter[str] = collections.Counter()
    threads: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        thread = frames[0].partition(": ")[2] if frames[0].startswith("thread") else "?"
        body = [f for f in frames if not f.startswith(("thread (", "process "))]
        threads["aiosqlite threads" if AIOSQLITE_THREAD in thread else thread] += count
        leaf[body[-1] if body else "?"] += count
        name, seen = classify(thread, body)
        component[name] += count
        for item in seen:
            inclusive[item] += count

    def share(counter: collections.Counter[str]) -> list[list[Any]]:
        return [[k, v, round(100 * v / total, 1)] for k, v in counter.most_common() if v]

    return {
        "samples": total,
        "components": share(component),
        "inclusive": share(inclusive),
        "threads": share(threads),
        "top_self": [[k, v, round(100 * v / total, 1)] for k, v in leaf.most_common(top)],
    }


class Profiler:
    """py-spy record on the servers during the measured window (``--profile``)."""

    def __init__(self, servers: list[Server], workdir: Path, duration: float) -> None:
        self.servers = servers
        self.workdir = workdir
        self.duration = duration
        self.procs: list[tuple[Server, subprocess.Popen[bytes], Path]] = []
        self.exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")

    def start(self) -> None:
        if not Path(self.exe).exists():
            progress("--profile: py-spy is not installed (pip install py-spy); no profile")
            return
        for server in self.servers:
            out = self.workdir / f"profile-{server.name}.txt"
            args = [
                self.exe,
                "record",
                "--pid",
                str(server.pid),
                "--duration",
                str(max(1, int(self.duration))),
                "--rate",
                "200",
                "--threads",
                "--nonblocking",
                "--format",
                "raw",
                "--output",
                str(out),
            ]
            log = open(self.workdir / f"py-spy-{server.name}.log", "wb")  # noqa: SIM115
            self.procs.append(
                (server, subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT), out)
            )
            log.close()

    def finish(self) -> dict[str, Any]:
        results = {}
        for server, proc, out in self.procs:
            try:
                proc.wait(timeout=self.duration + 60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if out.exists():
                results[server.name] = analyse_profile(out) | {"file": str(out)}
            else:
                results[server.name] = {"error": f"py-spy exited {proc.returncode}, no output"}
        return results


# --------------------------------------------------------------------------- census


async def sequential_agent(port: int, setup: Setup, cycles: int) -> dict[str, Any]:
    """One agent, one request at a time: ``cycles`` claim -> renew -> submit, then reads."""
    conn = HttpConn(port)
    base = f"/v1/spaces/{setup.space_id}"
    token = setup.agents[0][2]
    times: dict[str, list[float]] = collections.defaultdict(list)

    async def timed(op: str, method: str, path: str, tok: str, body: Any) -> tuple[int, Any]:
        start = time.perf_counter()
        status, raw = await conn.request(
            method, path, tok, None if body is None else json.dumps(body).encode()
        )
        times[op].append(time.perf_counter() - start)
        return status, json.loads(raw) if raw else None

    try:
        for _ in range(cycles):
            status, answer = await timed("claim", "POST", f"{base}/claims", token, CLAIM_BODY)
            if status != 201:
                raise BenchError(f"census claim answered {status}: {answer}")
            attempt, secret = answer["attempt"], answer["token"]
            path = f"{base}/attempts/{attempt['id']}"
            body = {"generation": attempt["generation"]}
            await timed("renew", "POST", f"{path}/renew", secret, body)
            await timed("submit", "POST", f"{path}/submit", secret, body | {"summary": SUMMARY})
        for _ in range(cycles):
            await timed("ready", "GET", f"{base}/ready?limit=20", token, None)
    finally:
        await conn.close()
    return {op: latency_summary(v[2:]) for op, v in times.items()}


def census(
    label: str, workdir: Path, data_dir: Path, database_url: str | None, setup: Setup, cycles: int
) -> dict[str, Any]:
    """Statements, database time and handler time per route, one request at a time
    (``serve_census.py``: ``buildmax serve`` with ``Tx`` and dispatch wrapped)."""
    port = free_port()
    out = workdir / f"census-{label}.json"
    args = [sys.executable, str(SERVE_CENSUS), *serve_args(data_dir, port, database_url)[1:]]
    progress(f"census ({cycles} sequential cycles): {' '.join(args)}")
    env = clean_env() | {"BENCH_CENSUS_OUT": str(out)}
    server = spawn(f"census-{label}", args, workdir / f"census-{label}.log", "", env)
    server.url = f"http://{HOST}:{port}"
    try:
        wait_ready(server, "/readyz", timeout=SETUP_TIMEOUT_S)
        client = run_async(sequential_agent(port, setup, cycles))
    finally:
        server.stop()
    if not out.exists():
        return {"error": f"no census written:\n{server.log_tail()}"}
    routes = {}
    for key, t in sorted(json.loads(out.read_text()).items()):
        n = t["requests"]
        if key.startswith("GET /readyz") or not n:
            continue
        routes[key] = {
            "requests": n,
            "statements": round(t["statements"] / n, 1),
            "db_ms": round(t["db_s"] / n * 1000, 2),
            "handler_ms": round(t["handler_s"] / n * 1000, 2),
            "shapes": sorted(
                (
                    [round(c / n, 2), round(t["shape_s"][k] / n * 1000, 3), k]
                    for k, c in t["shapes"].items()
                ),
                reverse=True,
            ),
        }
    return {"cycles": cycles, "routes": routes, "client_ms": client}


def print_census(c: dict[str, Any]) -> None:
    if "error" in c:
        print(f"  census: {c['error']}")
        return
    print(
        f"  census: one agent, one request at a time ({c['cycles']} cycles; serve_census.py), "
        "per request:"
    )
    print(f"    {'route':<48} {'n':>4} {'statements':>10} {'db ms':>7} {'handler ms':>10}")
    for key, r in c["routes"].items():
        print(
            f"    {key:<48} {r['requests']:>4} {r['statements']:>10} {r['db_ms']:>7.2f} "
            f"{r['handler_ms']:>10.2f}"
        )
    print(
        "    statements per request by shape (SQL up to WHERE/VALUES/SET), "
        "with their db ms per request:"
    )
    for key, r in c["routes"].items():
        print(f"      {key}")
        for n, ms, text in r["shapes"]:
            print(f"        {n:>5g} x {ms:>6.3f} ms  {text}")
    print(
        "    client-observed p50: "
        + ", ".join(f"{op} {s['p50']} ms" for op, s in c["client_ms"].items())
    )
    print(
        "    (db ms: awaiting Tx.execute/fetch_all, i.e. compile + execute + thread hop; "
        "BEGIN/COMMIT not counted; handler ms: Quart dispatch incl. auth and JSON)"
    )


# --------------------------------------------------------------------------- servers


def serve_args(data_dir: Path, port: int, database_url: str | None) -> list[str]:
    args = [*buildmax_command(), "serve", "--data-dir", str(data_dir), "--port", str(port)]
    if database_url:
        args += ["--database-url", database_url]
    return args


#: ``--load-plugins``: the servers' BUILDMAX_LOAD_PLUGINS (None: every installed plugin).
LOAD_PLUGINS: str | None = None


def server_env() -> dict[str, str]:
    """The servers' environment: no BUILDMAX_* variables, except the
    plugin allow-list when ``--load-plugins`` gave one."""
    env = clean_env()
    if LOAD_PLUGINS is not None:
        env["BUILDMAX_LOAD_PLUGINS"] = LOAD_PLUGINS
    return env


def env_note(note: str) -> str:
    """How the servers' environment is described in the report."""
    if LOAD_PLUGINS is None:
        return note
    return f"{note}; except BUILDMAX_LOAD_PLUGINS={LOAD_PLUGINS!r}"


def start_server(
    name: str, workdir: Path, data_dir: Path, database_url: str | None = None
) -> Server:
    port = free_port()
    args = serve_args(data_dir, port, database_url)
    progress(f"starting {name}: {' '.join(args)}")
    log = workdir / f"{name}.log"
    log.unlink(missing_ok=True)
    server = spawn(name, args, log, f"http://{HOST}:{port}", server_env())
    wait_ready(server, "/readyz", timeout=SETUP_TIMEOUT_S)
    return server


def loaded_plugins() -> list[str]:
    """``buildmax plugins`` as the server sees them (same environment): one line each."""
    try:
        done = subprocess.run(
            [*buildmax_command(), "plugins"],
            capture_output=True,
            text=True,
            env=server_env(),
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"unknown ({exc})"]
    return [" ".join(line.split()) for line in done.stdout.splitlines() if line.strip()]


def admin_token_of(server: Server) -> str:
    from bench_read import TOKEN_RE

    match = TOKEN_RE.search(server.log())
    if not match:
        raise BenchError(
            f"{server.name} printed no admin token (is the database fresh?):\n{server.log_tail()}"
        )
    return match.group(1)


def port_of(server: Server) -> int:
    return int(urllib.parse.urlsplit(server.url).port or 0)


def call(server: Server, method: str, path: str, token: str, body: Any, expect: int) -> Any:
    status, raw = http(method, server.url + path, token=token, body=body)
    if status != expect:
        raise BenchError(f"{method} {path} answered {status} (wanted {expect}): {raw[:300]!r}")
    return json.loads(raw) if raw else None


@dataclasses.dataclass
class Setup:
    space_id: str
    project_ids: list[str]
    agents: list[tuple[str, str, str]]  # name, principal id, token


def setup_space(server: Server, token: str, opts: argparse.Namespace) -> Setup:
    """The space, its projects and the agents (principals, members, tokens) over HTTP."""
    space = call(server, "POST", "/v1/spaces", token, {"slug": "bench"}, 201)["id"]
    projects = [
        call(server, "POST", f"/v1/spaces/{space}/projects", token, {"name": f"p{i:02d}"}, 201)[
            "id"
        ]
        for i in range(opts.projects)
    ]
    agents = []
    for i in range(opts.agents):
        name = f"agent-{i:02d}"
        body = {"kind": "agent", "name": name}
        principal = call(server, "POST", "/v1/principals", token, body, 201)
        pid = principal["id"]
        call(server, "PUT", f"/v1/spaces/{space}/members/{pid}", token, {"role": "member"}, 200)
        issued = call(
            server, "POST", "/v1/tokens", token, {"principal_id": pid, "name": "bench"}, 201
        )
        agents.append((name, pid, issued["token"]))
    return Setup(space, projects, agents)


# --------------------------------------------------------------------------- seeding

REVISION_BODY = "Seeded by benchmarks/bench_claims.py."
DAY_MS = 86_400_000


def seed_sqlite(db_path: Path, setup: Setup, historical: int, ready: int) -> dict[str, Any]:
    """Bulk INSERT ... SELECT over a recursive counter, in one transaction per table."""
    started = time.perf_counter()
    conn = sqlite3.connect(db_path, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous = OFF")
        space_pk = conn.execute(
            "SELECT id FROM spaces WHERE public_id = ?", (setup.space_id,)
        ).fetchone()[0]
        admin_pk = conn.execute(
            "SELECT created_by FROM spaces WHERE id = ?", (space_pk,)
        ).fetchone()[0]
        conn.execute("CREATE TEMP TABLE bench_projects (idx INTEGER PRIMARY KEY, pk INTEGER)")
        conn.executemany(
            "INSERT INTO bench_projects SELECT ?, id FROM task_projects WHERE public_id = ?",
            list(enumerate(setup.project_ids)),
        )
        first_new = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM task_tasks").fetchone()[0]
        now = int(time.time() * 1000)
        k = len(setup.project_ids)
        conn.execute("BEGIN")
        for state, count, t0, step, prio in (
            ("done", historical, now - 180 * DAY_MS, 180 * DAY_MS // max(1, historical), "0"),
            ("ready", ready, now - DAY_MS, DAY_MS // max(1, ready), "n % 3"),
        ):
            if count <= 0:
                continue
            conn.execute(
                f"""
                WITH RECURSIVE seq(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM seq WHERE n < ?)
                INSERT INTO task_tasks (
                    public_id, space_id, project_id, kind, title, priority, labels, state,
                    human_only, max_attempts, attempts_used, generation, revision, finding_ids,
                    ready_at, created_at, created_by, updated_at)
                SELECT 'ta_' || lower(hex(randomblob(16))), ?, bench_projects.pk, 'code',
                       ? || ' task ' || n, {prio}, '[]', ?, 0, 3, 0, 0, 1, '[]',
                       ? + n * ?, ? + n * ?, ?, ? + n * ?
                FROM seq JOIN bench_projects ON bench_projects.idx = n % ?
                """,
                (count - 1, space_pk, state, state, t0, step, t0, step, admin_pk, t0, step, k),
            )
        conn.execute(
            "INSERT INTO task_revisions (task_id, number, title, body, criteria, created_at, "
            "created_by) SELECT id, 1, title, ?, '', created_at, created_by FROM task_tasks "
            "WHERE id >= ? ORDER BY id",
            (REVISION_BODY, first_new),
        )
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        counts = dict(
            conn.execute(
                "SELECT state, count(*) FROM task_tasks WHERE space_id = ? GROUP BY state",
                (space_pk,),
            ).fetchall()
        )
        revisions = conn.execute("SELECT count(*) FROM task_revisions").fetchone()[0]
    finally:
        conn.close()
    return {
        "seconds": round(time.perf_counter() - started, 1),
        "tasks_by_state": counts,
        "revisions": revisions,
        "space_pk": space_pk,
        "db_bytes": db_path.stat().st_size,
        "method": "INSERT ... SELECT from a recursive counter, one transaction, "
        "synchronous=OFF for the load; no ANALYZE (the server runs none)",
    }


async def seed_postgres(url: str, setup: Setup, historical: int, ready: int) -> dict[str, Any]:
    """Bulk INSERT ... SELECT FROM generate_series, then ANALYZE (what autovacuum would do)."""
    import asyncpg

    started = time.perf_counter()
    conn = await asyncpg.connect(url)
    try:
        space_pk = await conn.fetchval("SELECT id FROM spaces WHERE public_id = $1", setup.space_id)
        admin_pk = await conn.fetchval("SELECT created_by FROM spaces WHERE id = $1", space_pk)
        project_pks = [
            await conn.fetchval("SELECT id FROM task_projects WHERE public_id = $1", p)
            for p in setup.project_ids
        ]
        first_new = await conn.fetchval("SELECT coalesce(max(id), 0) + 1 FROM task_tasks")
        now = int(time.time() * 1000)
        async with conn.transaction():
            for state, count, t0, step, prio in (
                ("done", historical, now - 180 * DAY_MS, 180 * DAY_MS // max(1, historical), "0"),
                ("ready", ready, now - DAY_MS, DAY_MS // max(1, ready), "n % 3"),
            ):
                if count <= 0:
                    continue
                await conn.execute(
                    f"""
                    INSERT INTO task_tasks (
                        public_id, space_id, project_id, kind, title, priority, labels, state,
                        human_only, max_attempts, attempts_used, generation, revision,
                        finding_ids, ready_at, created_at, created_by, updated_at)
                    SELECT 'ta_' || md5(random()::text || n::text), $1,
                           ($2::bigint[])[1 + n % $3], 'code', $4 || ' task ' || n, {prio}, '[]',
                           $4, 0, 3, 0, 0, 1, '[]', t, t, $7, t
                    FROM generate_series(0, $8::bigint - 1) AS n,
                         LATERAL (SELECT $5::bigint + n * $6::bigint AS t) AS at
                    """,
                    space_pk,
                    project_pks,
                    len(project_pks),
                    state,
                    t0,
                    step,
                    admin_pk,
                    count,
                )
            await conn.execute(
                "INSERT INTO task_revisions (task_id, number, title, body, criteria, "
                "created_at, created_by) SELECT id, 1, title, $1, '', created_at, created_by "
                "FROM task_tasks WHERE id >= $2 ORDER BY id",
                REVISION_BODY,
                first_new,
            )
        await conn.execute("ANALYZE")
        counts = {
            r["state"]: r["count"]
            for r in await conn.fetch(
                "SELECT state, count(*) FROM task_tasks WHERE space_id = $1 GROUP BY state",
                space_pk,
            )
        }
        revisions = await conn.fetchval("SELECT count(*) FROM task_revisions")
        size = await conn.fetchval("SELECT pg_database_size(current_database())")
    finally:
        await conn.close()
    return {
        "seconds": round(time.perf_counter() - started, 1),
        "tasks_by_state": counts,
        "revisions": revisions,
        "space_pk": space_pk,
        "db_bytes": size,
        "method": "INSERT ... SELECT FROM generate_series, one transaction, then ANALYZE",
    }


def ready_sql(space_pk: int, dialect: str) -> str | None:
    """The server's own ready query (``buildmax_tasks.claims.ready_statement``
    with the values claim-next binds, 21 rows), as SQL text."""
    try:
        from buildmax_tasks.claims import ClaimFilters, ready_params, ready_statement
        from sqlalchemy.dialects import postgresql as pg_dialect
        from sqlalchemy.dialects import sqlite as sqlite_dialect
    except ImportError:
        return None
    filters = ClaimFilters()
    values = ready_params(space_pk, int(time.time() * 1000), filters, 21)
    query = ready_statement(filters.shape()).params(**values)
    dia = sqlite_dialect.dialect() if dialect == "sqlite" else pg_dialect.dialect()
    return str(query.compile(dialect=dia, compile_kwargs={"literal_binds": True}))


def explain_sqlite(db_path: Path, space_pk: int, runs: int = 200) -> dict[str, Any]:
    sql = ready_sql(space_pk, "sqlite")
    if sql is None:
        return {"error": "buildmax_tasks not importable"}
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + sql).fetchall()]
        times = []
        for _ in range(runs + 5):
            start = time.perf_counter()
            conn.execute(sql).fetchall()
            times.append(time.perf_counter() - start)
    finally:
        conn.close()
    return {"plan": plan, "sql_alone_ms": latency_summary(times[5:])}


async def explain_postgres(url: str, space_pk: int, runs: int = 200) -> dict[str, Any]:
    import asyncpg

    sql = ready_sql(space_pk, "postgresql")
    if sql is None:
        return {"error": "buildmax_tasks not importable"}
    conn = await asyncpg.connect(url)
    try:
        plan = [r[0] for r in await conn.fetch("EXPLAIN " + sql)]
        times = []
        for _ in range(runs + 5):
            start = time.perf_counter()
            await conn.fetch(sql)
            times.append(time.perf_counter() - start)
    finally:
        await conn.close()
    return {"plan": plan, "sql_alone_ms": latency_summary(times[5:])}


# --------------------------------------------------------------------------- checks


def sqlite_counts(db_path: Path, space_pk: int) -> dict[str, Any]:
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return _counts(lambda q, *a: conn.execute(q, a).fetchone()[0], space_pk)
    finally:
        conn.close()


async def postgres_counts(url: str, space_pk: int) -> dict[str, Any]:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        rows: dict[str, Any] = {}
        for key, q in _COUNT_QUERIES:
            rows[key] = await conn.fetchval(q.replace("?", "$1"), space_pk)
        return rows
    finally:
        await conn.close()


_COUNT_QUERIES = [
    ("ready", "SELECT count(*) FROM task_tasks WHERE space_id = ? AND state = 'ready'"),
    ("claimed", "SELECT count(*) FROM task_tasks WHERE space_id = ? AND state = 'claimed'"),
    ("attempts", "SELECT count(*) FROM task_attempts WHERE space_id = ?"),
    (
        "tasks_with_two_attempts",
        "SELECT count(*) FROM (SELECT task_id FROM task_attempts WHERE space_id = ? "
        "GROUP BY task_id HAVING count(*) > 1) AS t",
    ),
    (
        "submissions",
        "SELECT count(*) FROM task_submissions JOIN task_tasks "
        "ON task_tasks.id = task_submissions.task_id WHERE task_tasks.space_id = ?",
    ),
]


def _counts(fetch: Any, space_pk: int) -> dict[str, Any]:
    return {key: fetch(q, space_pk) for key, q in _COUNT_QUERIES}


def consistency(counts: dict[str, Any], load: LoadResult) -> list[str]:
    """What the database says against what the agents saw; empty when it agrees."""
    problems = []
    if counts["attempts"] != load.claims_all:
        problems.append(f"{counts['attempts']} attempt rows but {load.claims_all} claims answered")
    if counts["submissions"] != load.submits_all:
        problems.append(
            f"{counts['submissions']} submissions but {load.submits_all} submits answered"
        )
    if counts["tasks_with_two_attempts"]:
        problems.append(f"{counts['tasks_with_two_attempts']} tasks have more than one attempt")
    return problems


# --------------------------------------------------------------------------- runs


def load_report(
    load: LoadResult,
    alone: dict[str, Any],
    servers: list[Server],
    cpu: CpuWindow,
    sampler: Sampler,
) -> dict[str, Any]:
    seconds = load.seconds
    expected = {k: v for k, v in load.errors.items() if k.endswith(f"HTTP {EXPECTED_STATUS}")}
    unexpected = {k: v for k, v in load.errors.items() if k not in expected}
    server_cpu = sum(cpu.result.get(s.pid, 0.0) for s in servers)
    ops = {op: latency_summary(v) for op, v in sorted(load.latencies.items())}
    ops["ready (alone)"] = alone["latency_ms"]
    rss = {}
    for s in servers:
        status = proc_status(s.pid)
        rss[s.name] = {
            "peak_hwm_kib": status.get("VmHWM", 0),
            "peak_sampled_kib": sampler.peak.get(s.pid, 0),
        }
    return {
        "seconds": round(seconds, 2),
        "cycles": load.cycles,
        "cycles_per_s": round(load.cycles / seconds, 1) if seconds else 0.0,
        "requests_per_s": round(
            sum(len(v) for k, v in load.latencies.items() if k in ("claim", "renew", "submit"))
            / seconds,
            1,
        )
        if seconds
        else 0.0,
        "operations_ms": ops,
        "empty_claims": load.empty,
        "errors_expected_409": expected,
        "errors_unexpected": unexpected,
        "errors_during_warmup": dict(load.warmup_errors),
        "server_cpu_s": round(server_cpu, 2),
        "server_cpu_ms_per_cycle": round(server_cpu / load.cycles * 1000, 2)
        if load.cycles
        else None,
        "postgres_cpu_s": cpu.pg_result,
        "client_cpu_s": load.client_cpu_s,
        "machine_busy_cores": round(cpu.machine_busy_s / seconds, 2) if seconds else None,
        "other_processes_cpu_s": round(
            cpu.machine_busy_s - server_cpu - (cpu.pg_result or 0.0) - load.client_cpu_s, 2
        ),
        "client_cpu_share_of_one_core": round(load.client_cpu_s / seconds, 2) if seconds else None,
        "rss": rss,
        "reconnects": load.reconnects,
        "unfinished_agents": load.unfinished_agents,
        "ready_alone_errors": alone["errors"],
        "ready_alone_items": alone["items"],
    }


def agents_for(setup: Setup, servers: list[Server]) -> list[Agent]:
    """Agents split evenly across ``servers`` (first half on the first, ...)."""
    n = len(setup.agents)
    return [
        Agent(name, pid, token, port_of(servers[i * len(servers) // n]))
        for i, (name, pid, token) in enumerate(setup.agents)
    ]


def measure_ours(
    servers: list[Server],
    setup: Setup,
    opts: argparse.Namespace,
    workdir: Path,
    postgres: bool,
    profile: bool,
) -> dict[str, Any]:
    agents = agents_for(setup, servers)
    probe_port, probe_token = port_of(servers[0]), setup.agents[0][2]
    progress(f"ready query alone: {opts.probe_alone} sequential reads on {servers[0].name}")
    alone = run_async(probe_alone(probe_port, setup.space_id, probe_token, opts.probe_alone))
    cpu = CpuWindow([s.pid for s in servers], postgres)
    profiler = Profiler(servers, workdir, opts.duration) if profile else None

    def window_start() -> None:
        cpu.start()
        if profiler:
            profiler.start()
        progress(f"measuring {opts.duration:g}s")

    progress(
        f"{len(agents)} agents on {', '.join(s.name for s in servers)}: "
        f"warm-up {opts.warmup:g}s, then {opts.duration:g}s measured"
    )
    with Sampler([s.pid for s in servers]) as sampler:
        load = run_async(
            Load(agents, setup.space_id, probe_port, probe_token, opts).run(window_start, cpu.end)
        )
    for server in servers:
        if not server.alive():
            raise BenchError(f"{server.name} died during the run:\n{server.log_tail()}")
    report = load_report(load, alone, servers, cpu, sampler)
    if profiler:
        report["profile"] = profiler.finish()
    report["_load"] = load
    return report


def run_sqlite(opts: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from buildmax_tasks.settings import TaskSettings

    from buildmax.config import load_config

    data_dir = workdir / "sqlite-data"
    servers: list[Server] = []
    result: dict[str, Any] = {}
    try:
        first = start_server("buildmax-sqlite-setup", workdir, data_dir)
        servers.append(first)
        token = admin_token_of(first)
        setup = setup_space(first, token, opts)
        first.stop()
        servers.remove(first)
        db_path = data_dir / "buildmax.db"
        progress(
            f"seeding SQLite: {opts.historical:,} historical + {opts.ready:,} ready tasks "
            f"over {opts.projects} projects"
        )
        seed = seed_sqlite(db_path, setup, opts.historical, opts.ready)
        progress(f"seeded in {seed['seconds']}s ({seed['db_bytes'] / 2**20:.0f} MiB)")
        result["seed"] = seed
        result["explain"] = explain_sqlite(db_path, seed["space_pk"])
        server = start_server("buildmax-sqlite", workdir, data_dir)
        servers.append(server)
        settings = load_config(
            None, environ=clean_env(), data_dir=str(data_dir), port=port_of(server)
        )
        result["configuration"] = {
            "command": " ".join(serve_args(data_dir, port_of(server), None)),
            "environment": env_note("no BUILDMAX_* variables, no configuration file"),
            "served": next(
                (ln for ln in server.log().splitlines() if "BuildMax serving" in ln), ""
            ),
            "buildmax": {k: v for k, v in dataclasses.asdict(settings).items() if k != "plugins"}
            | {"engine": settings.engine, "database": settings.effective_database_url},
            "plugins.tasks": dataclasses.asdict(TaskSettings()),
            "plugins": loaded_plugins(),
        }
        ours = measure_ours([server], setup, opts, workdir, False, opts.profile)
        load: LoadResult = ours.pop("_load")
        counts = sqlite_counts(db_path, seed["space_pk"])
        ours["database_after"] = counts
        ours["consistency"] = consistency(counts, load)
        result["ours"] = ours
        server.stop()
        servers.remove(server)
        if opts.profile:
            result["census"] = census("sqlite", workdir, data_dir, None, setup, opts.census_cycles)
        if opts.ceiling:
            result["ceiling"] = run_write_ceiling(opts, workdir, setup)
    finally:
        for server in servers:
            server.stop()
    return result


def run_write_ceiling(opts: argparse.Namespace, workdir: Path, setup: Setup) -> dict[str, Any]:
    from buildmax.config import Config

    port = free_port()
    args = [
        sys.executable,
        str(CEILING_WRITE_APP),
        "--port",
        str(port),
        "--db",
        str(workdir / "ceiling.db"),
        "--graceful-timeout",
        str(Config().shutdown_grace_seconds),
    ]
    progress(f"starting write ceiling: {' '.join(args)}")
    server = spawn("ceiling", args, workdir / "ceiling.log", f"http://{HOST}:{port}", clean_env())
    try:
        wait_ready(server, "/v1/spaces/warmup/ready")
        report = measure_ours([server], setup, opts, workdir, False, False)
        report.pop("_load")
        return report
    finally:
        server.stop()


async def _admin(url: str, statement: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def run_postgres(opts: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    suffix = f"{os.getpid()}_{secrets.token_hex(4)}"
    ours_db, pq_db = f"bench_claims_{suffix}", f"bench_claims_pq_{suffix}"
    admin_url = db_url(opts.pg_url, "postgres")
    created: list[str] = []
    servers: list[Server] = []
    result: dict[str, Any] = {"databases": [ours_db, pq_db]}
    try:
        run_async(_admin(admin_url, f'CREATE DATABASE "{ours_db}"'))
        created.append(ours_db)
        url = db_url(opts.pg_url, ours_db)
        migrate = [*buildmax_command(), "db", "migrate", "--database-url", url]
        progress(f"migrating: {' '.join(migrate)}")
        done = subprocess.run(
            migrate, capture_output=True, text=True, env=server_env(), timeout=SETUP_TIMEOUT_S
        )
        if done.returncode != 0:
            raise BenchError(f"buildmax db migrate failed:\n{done.stdout}\n{done.stderr}")
        data_dir = workdir / "pg-data"
        first = start_server("buildmax-pg-setup", workdir, data_dir, url)
        servers.append(first)
        token = admin_token_of(first)
        setup = setup_space(first, token, opts)
        first.stop()
        servers.remove(first)
        progress(
            f"seeding PostgreSQL: {opts.historical:,} historical + {opts.ready:,} ready tasks "
            f"over {opts.projects} projects"
        )
        seed = run_async(seed_postgres(url, setup, opts.historical, opts.ready))
        progress(f"seeded in {seed['seconds']}s ({seed['db_bytes'] / 2**20:.0f} MiB)")
        result["seed"] = seed
        result["explain"] = run_async(explain_postgres(url, seed["space_pk"]))
        for name in ("buildmax-pg-a", "buildmax-pg-b"):
            servers.append(start_server(name, workdir, data_dir, url))
        result["configuration"] = {
            "commands": [
                " ".join(serve_args(data_dir, port_of(s), url)) + f"   # {s.name}" for s in servers
            ],
            "environment": env_note(
                "no BUILDMAX_* variables, no configuration file; "
                "defaults as for SQLite, pg_pool_min 2 / pg_pool_max 10 per process"
            ),
            "plugins": loaded_plugins(),
        }
        ours = measure_ours(servers, setup, opts, workdir, True, opts.profile)
        load: LoadResult = ours.pop("_load")
        counts = run_async(postgres_counts(url, seed["space_pk"]))
        ours["database_after"] = counts
        ours["consistency"] = consistency(counts, load)
        result["ours"] = ours
        for server in list(servers):
            server.stop()
            servers.remove(server)
        if opts.profile:
            result["census"] = census("pg", workdir, data_dir, url, setup, opts.census_cycles)
        if importlib.util.find_spec("procrastinate") is None:
            result["procrastinate"] = {
                "error": "procrastinate is not installed in this environment "
                "(pip install procrastinate; tox -e bench installs it)"
            }
        else:
            run_async(_admin(admin_url, f'CREATE DATABASE "{pq_db}"'))
            created.append(pq_db)
            result["procrastinate"] = run_procrastinate(db_url(opts.pg_url, pq_db), opts, workdir)
    finally:
        for server in servers:
            server.stop()
        for name in created:
            try:
                run_async(_admin(admin_url, f'DROP DATABASE "{name}" WITH (FORCE)'))
                progress(f"dropped database {name}")
            except Exception as exc:
                progress(f"could not drop database {name}: {exc}")
    return result


async def _pq_counts(url: str) -> dict[str, int]:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT status::text, count(*) FROM procrastinate_jobs GROUP BY 1")
        return {r[0]: r[1] for r in rows}
    finally:
        await conn.close()


def run_procrastinate(url: str, opts: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    py = [sys.executable, str(PQ_WORKERS)]
    jobs = max(20_000, int((opts.warmup + opts.duration) * opts.pq_jobs_per_s))
    started = time.perf_counter()
    for step in (["schema"], ["defer", "--count", str(jobs)]):
        done = subprocess.run(
            [*py, *step, "--dsn", url], capture_output=True, text=True, timeout=600
        )
        if done.returncode != 0:
            raise BenchError(f"pq_workers {step[0]} failed:\n{done.stdout}\n{done.stderr}")
    run_async(_admin(url, "ANALYZE"))
    prepare_s = round(time.perf_counter() - started, 1)
    progress(f"procrastinate: {jobs:,} no-op jobs queued in {prepare_s}s")
    procs: list[Server] = []
    per = [
        opts.agents // opts.pq_processes + (1 if i < opts.agents % opts.pq_processes else 0)
        for i in range(opts.pq_processes)
    ]
    try:
        for i, workers in enumerate(per):
            args = [*py, "work", "--dsn", url, "--workers", str(workers), "--name", f"pq{i}"]
            procs.append(spawn(f"procrastinate-{i}", args, workdir / f"pq{i}.log", "", clean_env()))
        cpu = CpuWindow([p.pid for p in procs], True)
        counts: dict[str, dict[str, int]] = {}
        with Sampler([p.pid for p in procs]) as sampler:
            time.sleep(opts.warmup)
            counts["start"] = run_async(_pq_counts(url))
            cpu.start()
            t0 = time.perf_counter()
            time.sleep(opts.duration)
            counts["end"] = run_async(_pq_counts(url))
            seconds = time.perf_counter() - t0
            cpu.end()
        dead = [p for p in procs if not p.alive()]
        if dead:
            raise BenchError(f"{dead[0].name} died:\n{dead[0].log_tail()}")
        rss = {p.name: {"peak_hwm_kib": proc_status(p.pid).get("VmHWM", 0)} for p in procs}
        for p in procs:
            rss[p.name]["peak_sampled_kib"] = sampler.peak.get(p.pid, 0)
    finally:
        for p in procs:
            p.stop()
    done_in_window = counts["end"].get("succeeded", 0) - counts["start"].get("succeeded", 0)
    failed = counts["end"].get("failed", 0)
    return {
        "processes": opts.pq_processes,
        "workers_per_process": per,
        "jobs_queued": jobs,
        "prepare_s": prepare_s,
        "seconds": round(seconds, 2),
        "jobs": done_in_window,
        "jobs_per_s": round(done_in_window / seconds, 1) if seconds else 0.0,
        "failed_jobs": failed,
        "todo_left": counts["end"].get("todo", 0),
        "worker_cpu_s": round(sum(cpu.result.values()), 2),
        "postgres_cpu_s": cpu.pg_result,
        "rss": rss,
    }


# --------------------------------------------------------------------------- report


def versions() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "buildmax": version_of("buildmax"),
        "buildmax-tasks": version_of("buildmax-tasks"),
        "quart": version_of("quart"),
        "hypercorn": version_of("hypercorn"),
        "uvloop": version_of("uvloop"),
        "aiosqlite": version_of("aiosqlite"),
        "sqlalchemy": version_of("sqlalchemy"),
        "databases": version_of("databases"),
        "asyncpg": version_of("asyncpg"),
        "procrastinate": version_of("procrastinate"),
        "psycopg": version_of("psycopg"),
        "sqlite": sqlite3.sqlite_version,
    }


def verdicts(report: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    sq = report.get("sqlite")
    pg = report.get("postgresql")
    for name, run in (("SQLite", sq), ("PostgreSQL", pg)):
        if not run or "ours" not in run:
            continue
        p95 = run["ours"]["operations_ms"]["ready (alone)"]["p95"]
        out.append(
            {
                "what": f"{name}: ready query p95 (alone, {report['seeded_historical']:,} "
                "historical tasks)",
                "value": f"{p95} ms",
                "target": f"< {TARGET_READY_P95_MS:g} ms",
                "met": p95 is not None and p95 < TARGET_READY_P95_MS,
            }
        )
        unexpected = run["ours"]["errors_unexpected"]
        problems = run["ours"]["consistency"]
        out.append(
            {
                "what": f"{name}: errors other than expected 409s; database consistent",
                "value": (", ".join(f"{k} x{v}" for k, v in unexpected.items()) or "none")
                + ("; " + "; ".join(problems) if problems else ""),
                "target": "none",
                "met": not unexpected and not problems,
            }
        )
    if sq and "ours" in sq:
        c = sq["ours"]["cycles_per_s"]
        out.append(
            {
                "what": "SQLite: claim -> renew -> submit cycles/s, 50 agents, 1 process",
                "value": f"{c}",
                "target": f">= {TARGET_SQLITE_CYCLES:g}",
                "met": c >= TARGET_SQLITE_CYCLES,
            }
        )
    if pg and "ours" in pg:
        pq = pg.get("procrastinate", {})
        jobs = pq.get("jobs_per_s")
        ratio = round(pg["ours"]["cycles_per_s"] / jobs, 3) if jobs else None
        pg["ratio"] = ratio
        out.append(
            {
                "what": "PostgreSQL: ours cycles/s (2 processes) / procrastinate jobs/s",
                "value": f"{ratio}" if ratio is not None else f"not measured ({pq.get('error')})",
                "target": f">= {TARGET_PG_RATIO:g}",
                "met": ratio is not None and ratio >= TARGET_PG_RATIO,
            }
        )
    return out


def fmt_ms(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}"


def print_ours(title: str, m: dict[str, Any]) -> None:
    print(f"  {title}")
    header = (
        f"    {'operation':<20} {'count':>7} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} "
        f"{'max ms':>8}"
    )
    print(header)
    for op, s in m["operations_ms"].items():
        print(
            f"    {op:<20} {s['count']:>7} {fmt_ms(s['p50']):>8} {fmt_ms(s['p95']):>8} "
            f"{fmt_ms(s['p99']):>8} {fmt_ms(s['max']):>8}"
        )
    print(
        f"    throughput: {m['cycles_per_s']} cycles/s ({m['cycles']} cycles in {m['seconds']}s), "
        f"{m['requests_per_s']} claim/renew/submit requests/s; empty claim answers "
        f"{m['empty_claims']}"
    )
    if m["empty_claims"]:
        print(
            "    WARNING: the ready queue ran dry during the measurement (claims answered "
            "task null); cycles/s is understated: raise --ready"
        )
    exp = ", ".join(f"{k} x{v}" for k, v in m["errors_expected_409"].items()) or "none"
    unexp = ", ".join(f"{k} x{v}" for k, v in m["errors_unexpected"].items()) or "none"
    print(f"    errors: expected 409s: {exp}; other: {unexp}")
    if m["errors_during_warmup"]:
        warm = ", ".join(f"{k} x{v}" for k, v in m["errors_during_warmup"].items())
        print(f"    errors during warm-up (not counted): {warm}")
    pg = "" if m["postgres_cpu_s"] is None else f"; postgres processes {m['postgres_cpu_s']}s"
    print(
        f"    CPU in window: server {m['server_cpu_s']}s "
        f"({fmt_ms(m['server_cpu_ms_per_cycle'])} ms/cycle){pg}; load generator "
        f"{m['client_cpu_s']}s ({m['client_cpu_share_of_one_core']} of one core); "
        f"machine busy {m['machine_busy_cores']} of {os.cpu_count()} cores, of which "
        f"{m['other_processes_cpu_s']}s by processes outside this benchmark"
    )
    for name, r in m["rss"].items():
        print(
            f"    peak RSS {name}: {r['peak_hwm_kib'] / 1024:.1f} MiB VmHWM (whole life); "
            f"{r['peak_sampled_kib'] / 1024:.1f} MiB sampled max under load"
        )
    if "database_after" in m:
        d = m["database_after"]
        check = "consistent" if not m["consistency"] else "; ".join(m["consistency"])
        print(
            f"    database after: {d['ready']} ready, {d['claimed']} claimed, {d['attempts']} "
            f"attempts, {d['submissions']} submissions, tasks with >1 attempt "
            f"{d['tasks_with_two_attempts']}: {check} with what the agents saw"
        )
    if m["reconnects"] or m["unfinished_agents"]:
        print(
            f"    reconnects {m['reconnects']}, "
            f"agents still busy at the end {m['unfinished_agents']}"
        )


def print_profile(profile: dict[str, Any]) -> None:
    for name, prof in profile.items():
        if "error" in prof:
            print(f"  profile {name}: {prof['error']}")
            continue
        print(f"  profile {name}: {prof['samples']} py-spy samples at 200 Hz ({prof['file']})")
        print("    by component (deepest matching frame; all threads):")
        for comp, n, share in prof["components"]:
            print(f"      {share:5.1f}%  {comp}  ({n})")
        print("    inclusive (a sample counts for every component on its stack):")
        for comp, _n, share in prof["inclusive"]:
            print(f"      {share:5.1f}%  {comp}")
        print("    threads:")
        for thread, _n, share in prof["threads"]:
            print(f"      {share:5.1f}%  {thread}")
        print("    hottest functions (self):")
        for fn, _n, share in prof["top_self"]:
            print(f"      {share:5.1f}%  {fn}")


def print_table(report: dict[str, Any]) -> None:
    print("Configuration")
    print(
        f"  seeded  : {report['seeded_projects']} projects, {report['seeded_historical']:,} "
        f"historical (done) + {report['seeded_ready']:,} ready tasks per engine"
    )
    print(
        f"  load    : {report['agents']} agents, one keep-alive HTTP/1.1 connection each "
        "(asyncio + uvloop in the benchmark process); warm-up "
        f"{report['warmup_s']:g}s, measured {report['duration_s']:g}s; ready probe every "
        f"{report['probe_interval_s']:g}s during the run, {report['probe_alone']} reads alone"
    )
    print("  versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()))
    m = report["machine"]
    print(
        f"  machine : {m['cpus']} CPUs, Linux {m['kernel']}, load average at start "
        f"{' '.join(str(x) for x in m['loadavg_at_start'])}"
    )
    sq = report.get("sqlite")
    if sq:
        print()
        print("SQLite")
        cfg = sq.get("configuration", {})
        if cfg:
            print(f"  server  : {cfg['command']} ({cfg['environment']})")
            print(f"  log     : {cfg['served'].strip()}")
            print(
                "  effective configuration: "
                + ", ".join(f"{k}={v!r}" for k, v in cfg["buildmax"].items())
            )
            print(
                "  [plugins.tasks] defaults: "
                + ", ".join(f"{k}={v!r}" for k, v in cfg["plugins.tasks"].items())
            )
            print("  plugins (buildmax plugins, same environment):")
            for line in cfg["plugins"]:
                print(f"    {line}")
        print_seed(sq)
        if "ours" in sq:
            print_ours("ours (buildmax serve, 1 process)", sq["ours"])
        if "ceiling" in sq:
            print_ours(
                "write ceiling (ceiling_write_app.py: bare BEGIN IMMEDIATE; INSERT; COMMIT "
                "per request, same URLs, no auth)",
                sq["ceiling"],
            )
            c = sq["ceiling"]["cycles_per_s"]
            if c:
                print(f"  ratio ours/ceiling cycles/s: {sq['ours']['cycles_per_s'] / c:.3f}")
        if sq.get("ours", {}).get("profile"):
            print_profile(sq["ours"]["profile"])
        if sq.get("census"):
            print_census(sq["census"])
    pg = report.get("postgresql")
    if pg:
        print()
        print("PostgreSQL")
        print(f"  server  : {report.get('postgres_version', '?')}; databases {pg['databases']}")
        for line in pg.get("configuration", {}).get("commands", []):
            print(f"  command : {line}")
        if pg.get("configuration"):
            print(f"  config  : {pg['configuration']['environment']}")
            for line in pg["configuration"].get("plugins", []):
                print(f"  plugin  : {line}")
        print_seed(pg)
        if "ours" in pg:
            print_ours("ours (2 x buildmax serve, agents split 25/25)", pg["ours"])
        pq = pg.get("procrastinate")
        if pq:
            print("  procrastinate (peer, same PostgreSQL server, own database)")
            if "error" in pq:
                print(f"    {pq['error']}")
            else:
                print(
                    f"    {sum(pq['workers_per_process'])} workers of concurrency 1 in "
                    f"{pq['processes']} processes {pq['workers_per_process']}; "
                    f"{pq['jobs_queued']:,} no-op jobs queued first ({pq['prepare_s']}s)"
                )
                print(
                    f"    throughput: {pq['jobs_per_s']} jobs/s ({pq['jobs']} claim -> finish in "
                    f"{pq['seconds']}s); failed jobs {pq['failed_jobs']}; left to do "
                    f"{pq['todo_left']:,}"
                )
                print(
                    f"    CPU in window: workers {pq['worker_cpu_s']}s; postgres processes "
                    f"{pq['postgres_cpu_s']}s"
                )
                for name, r in pq["rss"].items():
                    print(
                        f"    peak RSS {name}: {r['peak_hwm_kib'] / 1024:.1f} MiB VmHWM; "
                        f"{r['peak_sampled_kib'] / 1024:.1f} MiB sampled max"
                    )
        if pg.get("ratio") is not None:
            print(f"  ratio ours cycles/s / procrastinate jobs/s: {pg['ratio']:.3f}")
        if pg.get("ours", {}).get("profile"):
            print_profile(pg["ours"]["profile"])
        if pg.get("census"):
            print_census(pg["census"])
    print()
    print("Targets (PERFORMANCE.md; issue 3, item 9)")
    for v in report["verdicts"]:
        print(
            f"  {'PASS' if v['met'] else 'MISS'}  {v['what']}: {v['value']} (target {v['target']})"
        )
    print()
    print(
        "Latencies are per request as the agent sees it (send to last byte), closed loop: "
        "with 50 agents, mean latency ~ 50 / requests per second. 'cycle' is claim start "
        "to submit answer. CPU is user+system of the processes over the measured window."
    )
    print(f"Whole run: {report['total_s']}s.")


def print_seed(run: dict[str, Any]) -> None:
    seed = run.get("seed")
    if not seed:
        return
    print(
        f"  seeding : {seed['seconds']}s ({seed['method']}); tasks by state "
        f"{seed['tasks_by_state']}, {seed['revisions']:,} revisions; database "
        f"{seed['db_bytes'] / 2**20:.0f} MiB"
    )
    ex = run.get("explain", {})
    if "plan" in ex:
        print("  ready query plan (the server's ready_statement, LIMIT 21):")
        for line in ex["plan"]:
            print(f"    {line}")
        s = ex["sql_alone_ms"]
        print(
            f"  ready query SQL alone (no HTTP, {s['count']} runs): p50 {fmt_ms(s['p50'])} ms, "
            f"p95 {fmt_ms(s['p95'])} ms, p99 {fmt_ms(s['p99'])} ms"
        )
    elif ex:
        print(f"  ready query plan: {ex.get('error')}")


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="claim-next -> renew -> submit with 50 agents on SQLite and PostgreSQL"
    )
    p.add_argument("--historical", type=int, default=1_000_000, help="done tasks (1,000,000)")
    p.add_argument("--ready", type=int, default=10_000, help="ready tasks (10,000)")
    p.add_argument("--projects", type=int, default=20, help="projects (20)")
    p.add_argument("--agents", type=int, default=50, help="concurrent agents (50)")
    p.add_argument("--duration", type=float, default=20, help="measured seconds (20)")
    p.add_argument("--warmup", type=float, default=5, help="warm-up seconds, not counted (5)")
    p.add_argument(
        "--engines", default="sqlite,postgresql", help="sqlite, postgresql or both (default)"
    )
    p.add_argument(
        "--pg-url",
        default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432"),
        help="PostgreSQL server (a fresh database is created and dropped on it); "
        "default $BENCH_PG_URL or postgresql://postgres@127.0.0.1:5432",
    )
    p.add_argument(
        "--pq-processes",
        type=int,
        default=2,
        help="processes the 50 procrastinate workers are spread over (2: its best here)",
    )
    p.add_argument(
        "--pq-jobs-per-s",
        type=float,
        default=3000,
        help="jobs queued per second of warm-up + duration, so the queue never runs dry",
    )
    p.add_argument("--probe-interval", type=float, default=0.1, help="ready probe period (0.1 s)")
    p.add_argument("--probe-alone", type=int, default=300, help="sequential ready reads alone")
    p.add_argument("--request-timeout", type=float, default=30.0, help="per request (30 s)")
    p.add_argument("--no-ceiling", dest="ceiling", action="store_false", help="skip the ceiling")
    p.add_argument(
        "--profile", action="store_true", help="py-spy record the servers in the measured window"
    )
    p.add_argument(
        "--census-cycles",
        type=int,
        default=40,
        help="with --profile: sequential cycles counted by serve_census.py (40)",
    )
    p.add_argument(
        "--load-plugins",
        metavar="NAMES",
        help="the servers' BUILDMAX_LOAD_PLUGINS, e.g. 'tasks' to measure without the audit "
        "plugin (default: every installed plugin)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temp directory (logs, SQLite db)")
    opts = p.parse_args(argv)
    global LOAD_PLUGINS
    LOAD_PLUGINS = opts.load_plugins
    engines = {e.strip() for e in opts.engines.split(",") if e.strip()}
    if not engines or engines - {"sqlite", "postgresql"}:
        p.error("--engines: sqlite, postgresql or both")
    opts.engine_set = engines
    if opts.duration < 1 or opts.warmup < 0 or opts.duration > 600 or opts.warmup > 600:
        p.error("--duration 1..600 s, --warmup 0..600 s")
    if opts.historical < 0 or opts.ready < 1 or opts.projects < 1 or opts.agents < 1:
        p.error("need --historical >= 0, --ready >= 1, --projects >= 1, --agents >= 1")
    if opts.historical > 20_000_000 or opts.agents > 500:
        p.error("bounded: --historical at most 20,000,000, --agents at most 500")
    if not 1 <= opts.pq_processes <= opts.agents:
        p.error("--pq-processes between 1 and --agents")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if not sys.platform.startswith("linux"):
        print("bench_claims: needs Linux (/proc for RSS and CPU)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="bench_claims-"))
    report: dict[str, Any] = {
        "seeded_projects": opts.projects,
        "seeded_historical": opts.historical,
        "seeded_ready": opts.ready,
        "agents": opts.agents,
        "warmup_s": opts.warmup,
        "duration_s": opts.duration,
        "probe_interval_s": opts.probe_interval,
        "probe_alone": opts.probe_alone,
        "versions": versions(),
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        },
    }
    try:
        if "sqlite" in opts.engine_set:
            report["sqlite"] = run_sqlite(opts, workdir)
        if "postgresql" in opts.engine_set:
            try:
                report["postgres_version"] = run_async(_pg_version(opts.pg_url))
            except Exception as exc:
                raise BenchError(f"PostgreSQL at {opts.pg_url} is not reachable: {exc}") from None
            report["postgresql"] = run_postgres(opts, workdir)
    except BenchError as exc:
        print(f"bench_claims: {exc}", file=sys.stderr)
        return 1
    finally:
        if opts.keep:
            progress(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    report["verdicts"] = verdicts(report)
    report["total_s"] = round(time.perf_counter() - started, 1)
    if opts.json:
        print(json.dumps(strip_private(report), indent=2, default=str))
    else:
        print_table(report)
    return 0


async def _pg_version(base: str) -> str:
    import asyncpg

    conn = await asyncpg.connect(db_url(base, "postgres"))
    try:
        return str(await conn.fetchval("SELECT version()")).split(" on ")[0]
    finally:
        await conn.close()


if __name__ == "__main__":
    sys.exit(main())
