"""Claim-next -> renew -> submit through MCP against the same cycles through
the HTTP API, by 50 agents, on one ``buildmax serve`` in one run.

    python benchmarks/bench_mcp.py [--agents 50] [--duration 20] [--warmup 5] [--rounds 1]
                                   [--historical 100000] [--ready 20000] [--sequential 100]
                                   [--engine sqlite|postgres] [--no-profile] [--json]

The server, its data and its agents are ``bench_claims.py``'s: one ``buildmax
serve`` with no configuration file and no ``BUILDMAX_*`` variables (SQLite,
every installed plugin, every default), a space with ``--projects`` projects
and ``--agents`` principals of kind ``agent`` (members, each with its own API
token), and ``--historical`` done + ``--ready`` ready tasks seeded in bulk.
``--engine postgres`` runs the same on a fresh database of ``--pg-url`` (one
server process; the database is dropped at the end).

Both transports run against that same process and database, one after the
other (round 1: HTTP then MCP; round 2: MCP then HTTP; ...), each with a
warm-up that is not counted and a measured window:

- **http**: ``bench_claims.Load``: one keep-alive HTTP/1.1 connection per
  agent; ``POST /v1/spaces/{s}/claims {"kind": "code"}`` with the agent's
  token, then ``renew`` and ``submit`` with the attempt token of the claim.
- **mcp**: the same loop through tools, one session of the official SDK's
  client per agent (``mcp.Client`` over ``streamable_http_client`` on
  ``POST /mcp``, its own ``httpx2.AsyncClient`` carrying the agent's token):
  ``claim_next(space, kind="code")``, ``renew(space, attempt, generation)``,
  ``submit(space, attempt, generation, summary)``. The sessions are opened
  and have listed the tools once before the warm-up. A tool error is
  counted by its problem's status and slug; a 409 answering a claim is a
  race lost, as over HTTP.

The agents run in this process (asyncio on uvloop), never in the server's.
This process's CPU is measured and printed: the SDK's client costs far more
per call than bench_claims' small HTTP client, and on 2 cores the load
generator takes its CPU from the server's.

Before the rounds, one agent makes ``--sequential`` cycles one call at a
time through each transport: latencies without contention, server and
client CPU per cycle, and the server's own request log split into the
``/mcp`` request and the route request each tool call makes inside it.

After the rounds (unless ``--no-profile``), one more window per transport
under the same load with ``py-spy record`` on the server; its samples are
converted to milliseconds of server CPU per cycle by layer (the first marker
found on the stack: the SDK's steps, the in-process request, the route
handlers, request handling around them) and by library (the deepest
frame), HTTP and MCP side by side.

Target: MCP cycles/s >= 0.5 x HTTP cycles/s in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import os
import platform
import re
import resource
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from bench_claims import (
    AIOSQLITE_THREAD,
    CLAIM_BODY,
    EXPECTED_STATUS,
    SETUP_TIMEOUT_S,
    SUMMARY,
    Agent,
    CpuWindow,
    HttpConn,
    Load,
    LoadResult,
    Profiler,
    Sampler,
    Setup,
    _admin,
    _frame_file,
    admin_token_of,
    agents_for,
    fmt_ms,
    latency_summary,
    load_report,
    loaded_plugins,
    port_of,
    postgres_counts,
    print_ours,
    run_async,
    seed_postgres,
    seed_sqlite,
    serve_args,
    server_env,
    setup_space,
    sqlite_counts,
    start_server,
    versions,
)
from bench_read import (
    HOST,
    BenchError,
    Server,
    buildmax_command,
    db_url,
    proc_cpu_seconds,
    strip_private,
    version_of,
)

TARGET_RATIO = 0.5
TRANSPORTS = ("http", "mcp")
OPS = ("claim", "renew", "submit")
#: Sequential cycles per transport not counted (sessions, caches, schema validators warm up).
SEQUENTIAL_WARMUP = 5
#: A line of the server's request log: request id, method, route, status, duration.
REQUEST_LINE = re.compile(r"buildmax\.requests: (\S+) (\S+) (\S+) (\d{3}) ([0-9.]+)ms")
#: The request id prefix of the route requests made by MCP tool calls.
MCP_MARK = "mcp/"


def progress(message: str) -> None:
    print(f"[bench_mcp] {message}", file=sys.stderr, flush=True)


def p50_ms(values: list[float]) -> float | None:
    return round(statistics.median(values) * 1000, 2) if values else None


# --------------------------------------------------------------------------- MCP load


@contextlib.asynccontextmanager
async def mcp_session(base_url: str, token: str, wait_s: float) -> AsyncIterator[Any]:
    """A session of the official SDK's client on ``base_url``/mcp with
    ``token``; each call waits at most ``wait_s``."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=wait_s)
    transport = streamable_http_client(f"{base_url}/mcp", http_client=http)
    async with http, Client(transport, read_timeout_seconds=wait_s) as client:
        yield client


async def call_tool(client: Any, name: str, arguments: dict[str, Any]) -> tuple[str, Any]:
    """``(outcome, structured content)``: outcome ``"ok"``, or the tool
    error as ``"<slug>: HTTP <status>"``; transport failures raise."""
    result = await client.call_tool(name, arguments)
    content = result.structured_content or {}
    if result.is_error:
        return f"{content.get('slug', '?')}: HTTP {content.get('status', '?')}", content
    return "ok", content


class HttpLoad(Load):
    """``bench_claims.Load``; its ready probe only with ``--probe-interval``
    (a fixed cost per second that, counted per cycle, would weigh more on
    the slower transport)."""

    async def _probe(self) -> None:
        if self.opts.probe_interval > 0:
            await super()._probe()


class McpLoad(HttpLoad):
    """``HttpLoad`` (its window, counters, report and probe) with each
    agent's loop made through its own MCP session.

    The sessions are opened, and each has listed the tools once (the SDK's
    client lists them to validate results), before the warm-up starts: that
    is once per agent, not per cycle, and its time is reported apart."""

    clients: dict[str, Any]
    sessions_s = 0.0

    async def run(self, on_window_start: Any, on_window_end: Any) -> LoadResult:
        started = time.perf_counter()
        async with contextlib.AsyncExitStack() as stack:
            self.clients = {}
            try:
                for agent in self.agents:
                    url = f"http://{HOST}:{agent.port}"
                    self.clients[agent.name] = await stack.enter_async_context(
                        mcp_session(url, agent.token, self.opts.request_timeout)
                    )
                await asyncio.gather(*(c.list_tools() for c in self.clients.values()))
            except Exception as exc:
                raise BenchError(f"an MCP session did not open: {exc!r}") from None
            self.sessions_s = time.perf_counter() - started
            progress(f"mcp: {len(self.clients)} sessions open in {self.sessions_s:.1f}s")
            return await super().run(on_window_start, on_window_end)

    async def _tool(
        self, client: Any, op: str, name: str, arguments: dict[str, Any]
    ) -> tuple[str, Any]:
        start = time.perf_counter()
        try:
            outcome, content = await call_tool(client, name, arguments)
        except Exception as exc:  # the SDK raises its transport's and JSON-RPC errors
            self._record(op, start, None, type(exc).__name__)
            return type(exc).__name__, None
        if outcome != "ok":
            status = content.get("status")
            self._record(op, start, status if isinstance(status, int) else None, outcome)
            return outcome, content
        self._record(op, start, None, None)
        return outcome, content

    async def _agent(self, agent: Agent) -> None:
        await self._cycles(self.clients[agent.name])

    async def _cycles(self, client: Any) -> None:
        space = self.space
        while not self.stop:
            start = time.perf_counter()
            outcome, claim = await self._tool(
                client, "claim", "claim_next", {"space": space, **CLAIM_BODY}
            )
            if outcome != "ok":
                if not outcome.endswith(f"HTTP {EXPECTED_STATUS}"):
                    await asyncio.sleep(0.05)  # an error: do not spin
                continue
            attempt = claim.get("attempt")
            if not attempt:  # nothing claimable: count it, do not spin
                if self._in_window(time.perf_counter()):
                    self.empty += 1
                await asyncio.sleep(0.05)
                continue
            self.claims_all += 1
            fence = {"space": space, "attempt": attempt["id"], "generation": attempt["generation"]}
            outcome, _ = await self._tool(client, "renew", "renew", fence)
            if outcome != "ok":
                continue
            outcome, _ = await self._tool(client, "submit", "submit", fence | {"summary": SUMMARY})
            if outcome != "ok":
                continue
            self.submits_all += 1
            self.cycles_all += 1
            end = time.perf_counter()
            if self._in_window(end):
                self.cycles += 1
                self.latencies["cycle"].append(end - start)


# --------------------------------------------------------------------------- one call at a time


@dataclasses.dataclass
class Sequential:
    """One agent's cycles made one call at a time through one transport."""

    times: dict[str, list[float]]
    claims: int
    submits: int
    server_cpu_s: float
    client_cpu_s: float
    log: list[tuple[str, str, float]]  # request id, route, duration ms (the server's log)


def process_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def sequential_http(server: Server, setup: Setup, cycles: int) -> Sequential:
    conn = HttpConn(port_of(server))
    base = f"/v1/spaces/{setup.space_id}"
    token = setup.agents[0][2]

    async def cycle(times: dict[str, list[float]]) -> None:
        start = time.perf_counter()
        status, raw = await conn.request(
            "POST", f"{base}/claims", token, json.dumps(CLAIM_BODY).encode()
        )
        times["claim"].append(time.perf_counter() - start)
        answer = json.loads(raw)
        if status != 201 or not answer.get("attempt"):
            raise BenchError(f"sequential claim answered {status}: {raw[:300]!r}")
        attempt, secret = answer["attempt"], answer["token"]
        path = f"{base}/attempts/{attempt['id']}"
        for op, expect, body in (
            ("renew", 200, {"generation": attempt["generation"]}),
            ("submit", 201, {"generation": attempt["generation"], "summary": SUMMARY}),
        ):
            t0 = time.perf_counter()
            status, raw = await conn.request(
                "POST", f"{path}/{op}", secret, json.dumps(body).encode()
            )
            times[op].append(time.perf_counter() - t0)
            if status != expect:
                raise BenchError(f"sequential {op} answered {status}: {raw[:300]!r}")
        times["cycle"].append(time.perf_counter() - start)

    try:
        return await _sequential(server, cycles, cycle)
    finally:
        await conn.close()


async def sequential_mcp(server: Server, setup: Setup, cycles: int, wait_s: float) -> Sequential:
    space = setup.space_id
    async with mcp_session(server.url, setup.agents[0][2], wait_s) as client:

        async def cycle(times: dict[str, list[float]]) -> None:
            start = time.perf_counter()
            outcome, claim = await call_tool(client, "claim_next", {"space": space, **CLAIM_BODY})
            times["claim"].append(time.perf_counter() - start)
            if outcome != "ok" or not claim.get("attempt"):
                raise BenchError(f"sequential claim_next: {outcome} {claim}")
            attempt = claim["attempt"]
            fence = {"space": space, "attempt": attempt["id"], "generation": attempt["generation"]}
            for op, arguments in (("renew", fence), ("submit", fence | {"summary": SUMMARY})):
                t0 = time.perf_counter()
                outcome, answer = await call_tool(client, op, arguments)
                times[op].append(time.perf_counter() - t0)
                if outcome != "ok":
                    raise BenchError(f"sequential {op}: {outcome} {answer}")
            times["cycle"].append(time.perf_counter() - start)

        return await _sequential(server, cycles, cycle)


async def _sequential(server: Server, cycles: int, cycle: Any) -> Sequential:
    warm: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(SEQUENTIAL_WARMUP):
        await cycle(warm)
    offset = server.log_path.stat().st_size
    server0, client0 = proc_cpu_seconds(server.pid) or 0.0, process_cpu_s()
    times: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(cycles):
        await cycle(times)
    server1, client1 = proc_cpu_seconds(server.pid) or 0.0, process_cpu_s()
    await asyncio.sleep(0.2)  # the last request's log line
    with server.log_path.open("rb") as fh:
        fh.seek(offset)
        text = fh.read().decode(errors="replace")
    log = [
        (m.group(1), m.group(3), float(m.group(5)))
        for m in (REQUEST_LINE.search(line) for line in text.splitlines())
        if m
    ]
    n = cycles + SEQUENTIAL_WARMUP
    return Sequential(dict(times), n, n, server1 - server0, client1 - client0, log)


def op_of(route: str) -> str | None:
    for op, suffix in (("claim", "/claims"), ("renew", "/renew"), ("submit", "/submit")):
        if route.endswith(suffix):
            return op
    return None


def sequential_report(http: Sequential, mcp: Sequential, cycles: int) -> dict[str, Any]:
    """Client latencies, CPU per cycle and the server log's durations per operation."""
    route_http: dict[str, list[float]] = collections.defaultdict(list)
    for _rid, route, ms in http.log:
        if (op := op_of(route)) is not None:
            route_http[op].append(ms / 1000)
    outer = {rid: ms for rid, route, ms in mcp.log if route == "/mcp"}
    inner: dict[str, list[float]] = collections.defaultdict(list)
    wrapped: dict[str, list[float]] = collections.defaultdict(list)
    for rid, route, ms in mcp.log:
        op = op_of(route)
        if op is None or not rid.startswith(MCP_MARK):
            continue
        inner[op].append(ms / 1000)
        if (whole := outer.get(rid.removeprefix(MCP_MARK))) is not None:
            wrapped[op].append(whole / 1000)
    ops = {}
    for op in (*OPS, "cycle"):
        ops[op] = {
            "http_p50_ms": p50_ms(http.times.get(op, [])),
            "mcp_p50_ms": p50_ms(mcp.times.get(op, [])),
            "http_route_logged_p50_ms": p50_ms(route_http.get(op, [])),
            "mcp_request_logged_p50_ms": p50_ms(wrapped.get(op, [])),
            "mcp_inner_route_logged_p50_ms": p50_ms(inner.get(op, [])),
        }
    return {
        "cycles": cycles,
        "operations": ops,
        "server_cpu_ms_per_cycle": {
            "http": round(http.server_cpu_s / cycles * 1000, 2),
            "mcp": round(mcp.server_cpu_s / cycles * 1000, 2),
        },
        "client_cpu_ms_per_cycle": {
            "http": round(http.client_cpu_s / cycles * 1000, 2),
            "mcp": round(mcp.client_cpu_s / cycles * 1000, 2),
        },
    }


# --------------------------------------------------------------------------- profile

#: Where a sample of the server's event-loop thread went: the first layer
#: with a marker on its stack (py-spy frames read "function (file:line)").
#: A tool call's route request runs in a task of its own, so its handler's
#: samples carry no MCP frame: they count as route handlers, as over HTTP.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "MCP: Mcp-Param check (runs and serializes tools/list per call)",
        ("_tool_input_schema (mcp/server/_streamable_http_modern.py:",),
    ),
    (
        "MCP: the tool's in-process request (InternalApi, httpx, ASGI)",
        ("InternalApi.request (buildmax/internal.py:",),
    ),
    (
        "MCP: tool result validated and serialized (pydantic)",
        ("ServerRunner._serialize (mcp/server/runner.py:",),
    ),
    (
        "MCP: JSON-RPC answer dumped again and encoded",
        ("_write (mcp/server/_streamable_http_modern.py:",),
    ),
    (
        "MCP: rest of the SDK (JSON-RPC parse, dispatch, otel, ...)",
        ("_serve (buildmax_mcp/endpoint.py:",),
    ),
    ("authentication", ("(buildmax/auth.py:",)),
    ("route handlers: claim, renew, submit, ready", ("Quart.dispatch_request (quart/app.py:",)),
    (
        "around the handlers: Hypercorn, h11, Quart, log, metrics",
        ("(hypercorn/", "(h11/", "(quart/", "(buildmax/"),
    ),
]
EVENT_LOOP = "event loop (uvloop, asyncio) and the rest"
SQLITE_THREADS = "SQLite threads (aiosqlite: statements, hand-off)"
#: The library of a sample's deepest frame whose file starts with a prefix.
LIBRARIES: list[tuple[str, tuple[str, ...]]] = [
    (
        "pydantic, mcp_types (validation, serialization)",
        ("pydantic/", "pydantic_core/", "mcp_types/"),
    ),
    ("MCP SDK (mcp)", ("mcp/",)),
    ("anyio", ("anyio/",)),
    ("starlette", ("starlette/",)),
    ("opentelemetry", ("opentelemetry/",)),
    ("jsonschema", ("jsonschema/", "referencing/")),
    ("httpx (in-process request)", ("httpx/", "httpcore/")),
    ("BuildMax MCP plugin", ("buildmax_mcp/",)),
    ("SQLAlchemy", ("sqlalchemy/",)),
    ("database drivers (aiosqlite, asyncpg)", ("aiosqlite/", "asyncpg/", "databases/")),
    ("json", ("json/",)),
    ("Quart, werkzeug", ("quart/", "werkzeug/")),
    ("Hypercorn, h11", ("hypercorn/", "h11/")),
    ("BuildMax plugins (tasks, audit, reviews, ...)", ("buildmax_",)),
    ("BuildMax kernel", ("buildmax/",)),
    ("logging", ("logging/",)),
    ("asyncio", ("asyncio/",)),
]


def read_raw_profile(path: Path) -> Iterator[tuple[str, list[str], int]]:
    """``(thread, frames root first, samples)`` of a ``py-spy --format raw --threads`` file."""
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0].partition(": ")[2] if frames[0].startswith("thread") else "?"
        body = [f for f in frames if not f.startswith(("thread (", "process "))]
        yield thread, body, int(count)


def layer_of(thread: str, frames: list[str]) -> str:
    if AIOSQLITE_THREAD in thread:
        return SQLITE_THREADS
    for name, markers in LAYERS:
        if any(marker in frame for frame in frames for marker in markers):
            return name
    return EVENT_LOOP


def library_of(thread: str, frames: list[str]) -> str:
    if AIOSQLITE_THREAD in thread:
        return SQLITE_THREADS
    for frame in reversed(frames):
        file = _frame_file(frame)
        for name, prefixes in LIBRARIES:
            if file.startswith(prefixes):
                return name
    return "other (uvloop and C code with no Python frame)"


def analyse(path: Path, cpu_ms_per_cycle: float | None, top: int = 12) -> dict[str, Any]:
    """Samples by layer, by library and by function, as ms of server CPU per
    cycle (each sample weighs the window's CPU per cycle / samples)."""
    layers: collections.Counter[str] = collections.Counter()
    libraries: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    total = 0
    for thread, frames, count in read_raw_profile(path):
        total += count
        layers[layer_of(thread, frames)] += count
        libraries[library_of(thread, frames)] += count
        leaves[frames[-1] if frames else "?"] += count
    weight = (cpu_ms_per_cycle or 0.0) / total if total else 0.0

    def table(counter: collections.Counter[str], limit: int | None = None) -> dict[str, Any]:
        return {
            k: {"samples": v, "share": round(v / total, 4), "ms_per_cycle": round(v * weight, 3)}
            for k, v in counter.most_common(limit)
        }

    return {
        "samples": total,
        "cpu_ms_per_cycle": cpu_ms_per_cycle,
        "layers": table(layers),
        "libraries": table(libraries),
        "top_self": table(leaves, top),
    }


# --------------------------------------------------------------------------- server


@dataclasses.dataclass
class Served:
    server: Server
    setup: Setup
    admin_token: str
    seed: dict[str, Any]
    counts: Callable[[], dict[str, Any]]
    configuration: dict[str, Any]


@contextlib.contextmanager
def served(opts: argparse.Namespace, workdir: Path) -> Iterator[Served]:
    """The seeded server of ``opts.engine`` (stopped, and its database dropped, after)."""
    if opts.engine == "sqlite":
        with _served_sqlite(opts, workdir) as found:
            yield found
    else:
        with _served_postgres(opts, workdir) as found:
            yield found


def _configure(
    opts: argparse.Namespace, server: Server, data_dir: Path, url: str | None
) -> dict[str, Any]:
    return {
        "engine": opts.engine,
        "command": " ".join(serve_args(data_dir, port_of(server), url)),
        "environment": "no BUILDMAX_* variables, no configuration file",
        "plugins": loaded_plugins(),
    }


def _setup(
    name: str, workdir: Path, data_dir: Path, url: str | None, opts: argparse.Namespace
) -> tuple[Setup, str]:
    """The space and agents, made through a first server; and the admin token it printed."""
    first = start_server(name, workdir, data_dir, url)
    try:
        token = admin_token_of(first)
        return setup_space(first, token, opts), token
    finally:
        first.stop()


@contextlib.contextmanager
def _served_sqlite(opts: argparse.Namespace, workdir: Path) -> Iterator[Served]:
    data_dir = workdir / "sqlite-data"
    setup, token = _setup("buildmax-setup", workdir, data_dir, None, opts)
    db_path = data_dir / "buildmax.db"
    progress(f"seeding SQLite: {opts.historical:,} historical + {opts.ready:,} ready tasks")
    seed = seed_sqlite(db_path, setup, opts.historical, opts.ready)
    server = start_server("buildmax", workdir, data_dir)
    try:
        yield Served(
            server,
            setup,
            token,
            seed,
            lambda: sqlite_counts(db_path, seed["space_pk"]),
            _configure(opts, server, data_dir, None),
        )
    finally:
        server.stop()


@contextlib.contextmanager
def _served_postgres(opts: argparse.Namespace, workdir: Path) -> Iterator[Served]:
    name = f"bench_mcp_{os.getpid()}_{secrets.token_hex(4)}"
    admin_url, url = db_url(opts.pg_url, "postgres"), db_url(opts.pg_url, name)
    try:
        run_async(_admin(admin_url, f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        raise BenchError(f"PostgreSQL at {opts.pg_url}: {exc}") from None
    server: Server | None = None
    try:
        migrate = [*buildmax_command(), "db", "migrate", "--database-url", url]
        done = subprocess.run(
            migrate, capture_output=True, text=True, env=server_env(), timeout=SETUP_TIMEOUT_S
        )
        if done.returncode != 0:
            raise BenchError(f"buildmax db migrate failed:\n{done.stdout}\n{done.stderr}")
        data_dir = workdir / "pg-data"
        setup, token = _setup("buildmax-setup", workdir, data_dir, url, opts)
        progress(f"seeding PostgreSQL: {opts.historical:,} historical + {opts.ready:,} ready tasks")
        seed = run_async(seed_postgres(url, setup, opts.historical, opts.ready))
        server = start_server("buildmax", workdir, data_dir, url)
        yield Served(
            server,
            setup,
            token,
            seed,
            lambda: run_async(postgres_counts(url, seed["space_pk"])),
            _configure(opts, server, data_dir, url) | {"database": name},
        )
    finally:
        if server is not None:
            server.stop()
        try:
            run_async(_admin(admin_url, f'DROP DATABASE "{name}" WITH (FORCE)'))
            progress(f"dropped database {name}")
        except Exception as exc:
            progress(f"could not drop database {name}: {exc}")


# --------------------------------------------------------------------------- measuring


def measure(
    transport: str, it: Served, opts: argparse.Namespace, profile_dir: Path | None = None
) -> tuple[dict[str, Any], LoadResult]:
    """One window of ``transport`` with every agent: bench_claims' report of
    it, and the load's result (with ``profile_dir``, py-spy's file too)."""
    server, setup = it.server, it.setup
    cls = McpLoad if transport == "mcp" else HttpLoad
    load = cls(
        agents_for(setup, [server]), setup.space_id, port_of(server), setup.agents[0][2], opts
    )
    cpu = CpuWindow([server.pid], opts.engine == "postgresql")
    profiler = Profiler([server], profile_dir, opts.duration) if profile_dir else None

    def window_start() -> None:
        cpu.start()
        if profiler:
            profiler.start()
        progress(f"{transport}: measuring {opts.duration:g}s")

    progress(f"{transport}: {len(setup.agents)} agents, warm-up {opts.warmup:g}s")
    with Sampler([server.pid]) as sampler:
        result = run_async(load.run(window_start, cpu.end))
    if not server.alive():
        raise BenchError(f"{server.name} died during the run:\n{server.log_tail()}")
    nothing = {"latency_ms": latency_summary([]), "errors": {}, "items": 0}
    report = load_report(result, nothing, [server], cpu, sampler)
    report["operations_ms"].pop("ready (alone)", None)
    for key in ("ready_alone_errors", "ready_alone_items"):
        report.pop(key, None)
    report["transport"] = transport
    if isinstance(load, McpLoad):
        report["sessions_open_s"] = round(load.sessions_s, 2)
    if profiler:
        files = profiler.finish()
        found = files.get(server.name, {})
        report["_profile_file"] = found.get("file")
        report["_profile_error"] = found.get("error")
    return report, result


def run(opts: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with served(opts, workdir) as it:
        out["seed"] = {k: v for k, v in it.seed.items() if k != "space_pk"}
        out["configuration"] = it.configuration
        claims = submits = 0
        if opts.sequential:
            progress(f"one agent, one call at a time: {opts.sequential} cycles per transport")
            http = run_async(sequential_http(it.server, it.setup, opts.sequential))
            mcp = run_async(
                sequential_mcp(it.server, it.setup, opts.sequential, opts.request_timeout)
            )
            out["sequential"] = sequential_report(http, mcp, opts.sequential)
            claims += http.claims + mcp.claims
            submits += http.submits + mcp.submits
        rounds = []
        for i in range(opts.rounds):
            order = TRANSPORTS if i % 2 == 0 else TRANSPORTS[::-1]
            progress(f"round {i + 1} of {opts.rounds}: {' then '.join(order)}")
            one: dict[str, Any] = {"order": list(order)}
            for transport in order:
                report, result = measure(transport, it, opts)
                one[transport] = report
                claims += result.claims_all
                submits += result.submits_all
            one["ratio"] = ratio(one["mcp"]["cycles_per_s"], one["http"]["cycles_per_s"])
            one["request_ratio"] = ratio(
                one["mcp"]["requests_per_s"], one["http"]["requests_per_s"]
            )
            one["cpu_ratio"] = ratio(
                one["http"]["server_cpu_ms_per_cycle"], one["mcp"]["server_cpu_ms_per_cycle"]
            )
            rounds.append(one)
        out["rounds"] = rounds
        if opts.profile:
            out["profile"] = profile(it, opts, workdir)
            for transport in TRANSPORTS:
                claims += out["profile"].get(transport, {}).pop("_claims", 0)
                submits += out["profile"].get(transport, {}).pop("_submits", 0)
        counts = it.counts()
        out["database_after"] = counts
        out["consistency"] = consistency(counts, claims, submits)
    return out


def profile(it: Served, opts: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One more window per transport, with py-spy on the server."""
    window = argparse.Namespace(**vars(opts) | {"warmup": 2.0, "duration": opts.profile_duration})
    found: dict[str, Any] = {}
    for transport in TRANSPORTS:
        where = workdir / f"profile-{transport}"
        where.mkdir(exist_ok=True)
        progress(f"{transport}: py-spy record on pid {it.server.pid}")
        report, result = measure(transport, it, window, where)
        file = report.get("_profile_file")
        if file:
            found[transport] = analyse(Path(file), report["server_cpu_ms_per_cycle"]) | {
                "cycles_per_s": report["cycles_per_s"],
                "file": file,
            }
        else:
            found[transport] = {"error": report.get("_profile_error") or "no profile written"}
        found[transport] |= {"_claims": result.claims_all, "_submits": result.submits_all}
    return found


def cores(cpu_s: float, seconds: float) -> str:
    return f"{cpu_s / seconds:.2f}" if seconds else "-"


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def consistency(counts: dict[str, Any], claims: int, submits: int) -> list[str]:
    """The database against what every agent was answered, over the whole run."""
    problems = []
    if counts["attempts"] != claims:
        problems.append(f"{counts['attempts']} attempt rows but {claims} claims answered")
    if counts["submissions"] != submits:
        problems.append(f"{counts['submissions']} submissions but {submits} submits answered")
    if counts["tasks_with_two_attempts"]:
        problems.append(f"{counts['tasks_with_two_attempts']} tasks have more than one attempt")
    return problems


# --------------------------------------------------------------------------- report


def verdicts(report: dict[str, Any]) -> list[dict[str, Any]]:
    rounds = report["rounds"]
    ratios = [r["ratio"] for r in rounds if r["ratio"] is not None]
    median = round(statistics.median(ratios), 3) if ratios else None
    unexpected: collections.Counter[str] = collections.Counter()
    for r in rounds:
        for transport in TRANSPORTS:
            for key, n in r[transport]["errors_unexpected"].items():
                unexpected[f"{transport} {key}"] += n
    empty = sum(r[t]["empty_claims"] for r in rounds for t in TRANSPORTS)
    problems = report["consistency"]
    return [
        {
            "what": "MCP / HTTP cycles/s, same server, same run"
            + (f" (median of {len(rounds)} rounds)" if len(rounds) > 1 else ""),
            "value": f"{median}",
            "target": f">= {TARGET_RATIO:g}",
            "met": median is not None and median >= TARGET_RATIO,
        },
        {
            "what": "errors other than expected 409s; ready queue never dry; database consistent",
            "value": (", ".join(f"{k} x{v}" for k, v in unexpected.items()) or "none")
            + (f"; {empty} empty claims" if empty else "")
            + ("; " + "; ".join(problems) if problems else ""),
            "target": "none",
            "met": not unexpected and not problems and not empty,
        },
    ]


def print_report(report: dict[str, Any]) -> None:
    print("Configuration")
    cfg = report["configuration"]
    print(
        f"  server  : {cfg['command']} ({cfg['environment']}"
        + (f"; database {cfg['database']}" if "database" in cfg else "")
        + ")"
    )
    for line in cfg["plugins"]:
        print(f"    {line}")
    seed = report["seed"]
    print(
        f"  seeded  : {report['seeded_projects']} projects, tasks by state "
        f"{seed['tasks_by_state']} in {seed['seconds']}s"
    )
    print(
        f"  load    : {report['agents']} agents in this process (asyncio + uvloop); http: one "
        "keep-alive HTTP/1.1 connection each (bench_claims.Load); mcp: one session of the "
        "official SDK's client each (streamable HTTP, httpx2); "
        + (
            f"a ready probe over HTTP every {report['probe_interval_s']:g}s in both; "
            if report["probe_interval_s"]
            else ""
        )
        + f"warm-up {report['warmup_s']:g}s, measured {report['duration_s']:g}s per transport "
        "and round"
    )
    print("  versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()))
    m = report["machine"]
    print(
        f"  machine : {m['cpus']} CPUs, Linux {m['kernel']}, load average at start "
        f"{' '.join(map(str, m['loadavg_at_start']))}, at the end "
        f"{' '.join(map(str, m.get('loadavg_at_end', [])))}"
    )
    if report.get("sequential"):
        print_sequential(report["sequential"])
    for i, r in enumerate(report["rounds"], 1):
        print()
        print(f"Round {i} ({' then '.join(r['order'])})")
        for transport in r["order"]:
            print_ours(TITLES[transport], r[transport])
            if "sessions_open_s" in r[transport]:
                print(
                    f"    sessions: {report['agents']} opened, tools listed once each, in "
                    f"{r[transport]['sessions_open_s']}s before the warm-up (not counted)"
                )
    print()
    print("Summary (per round)")
    print(
        f"  {'round':<6} {'http c/s':>9} {'mcp c/s':>8} {'ratio':>6} {'calls':>6}   "
        f"{'server CPU ms/cycle':>19} {'http/mcp':>8}   {'cores used: server':>18} "
        f"{'client':>13}"
    )
    for i, r in enumerate(report["rounds"], 1):
        h, c = r["http"], r["mcp"]
        print(
            f"  {i:<6} {h['cycles_per_s']:>9} {c['cycles_per_s']:>8} {r['ratio']!s:>6} "
            f"{r['request_ratio']!s:>6}   {fmt_ms(h['server_cpu_ms_per_cycle']):>8} / "
            f"{fmt_ms(c['server_cpu_ms_per_cycle']):>8} {r['cpu_ratio']!s:>8}   "
            f"{cores(h['server_cpu_s'], h['seconds']):>8} / "
            f"{cores(c['server_cpu_s'], c['seconds'])} "
            f"{h['client_cpu_share_of_one_core']:>6} / {c['client_cpu_share_of_one_core']}"
        )
    print(
        "  ratio: mcp/http cycles/s; calls: the same for claim/renew/submit calls answered "
        "per second (finer: a saturated server moves the agents in waves, so a window's "
        f"cycles come about {report['agents']} at a time, "
        f"+-{report['agents'] / report['duration_s']:.1f} cycles/s); http/mcp: server CPU per "
        "cycle, the capacity ratio while the server is the bottleneck; cores used: http / mcp"
    )
    if report.get("profile"):
        print_profile(report["profile"])
    d = report["database_after"]
    print()
    print(
        f"Database after: {d['ready']} ready, {d['attempts']} attempts, {d['submissions']} "
        f"submissions, tasks with >1 attempt {d['tasks_with_two_attempts']}: "
        + ("consistent" if not report["consistency"] else "; ".join(report["consistency"]))
        + " with what the agents were answered"
    )
    print()
    print("Targets")
    for v in report["verdicts"]:
        print(
            f"  {'PASS' if v['met'] else 'MISS'}  {v['what']}: {v['value']} (target {v['target']})"
        )
    print()
    print(
        "Latencies are per call as the agent sees it (send to answer), closed loop. 'cycle' is "
        "claim start to submit answer. CPU is user+system time over the measured window; the "
        "load generator is this process."
    )
    print(f"Whole run: {report['total_s']}s.")


TITLES = {
    "http": "http (bench_claims.Load: HTTP API, attempt token for renew and submit)",
    "mcp": "mcp (official SDK client, tools claim_next, renew, submit; the agent's token)",
}


def print_sequential(s: dict[str, Any]) -> None:
    print()
    print(
        f"One agent, one call at a time ({s['cycles']} cycles per transport after "
        f"{SEQUENTIAL_WARMUP} not counted); p50 in ms"
    )
    print(
        f"  {'':<8} {'http':>7} {'mcp':>7}   server log: {'http route':>10} "
        f"{'/mcp':>6} {'its route':>9} {'/mcp - route':>12}"
    )
    for op, o in s["operations"].items():
        whole, inner = o["mcp_request_logged_p50_ms"], o["mcp_inner_route_logged_p50_ms"]
        diff = round(whole - inner, 2) if whole is not None and inner is not None else None
        print(
            f"  {op:<8} {fmt_ms(o['http_p50_ms']):>7} {fmt_ms(o['mcp_p50_ms']):>7}   "
            f"{'':>11} {fmt_ms(o['http_route_logged_p50_ms']):>10} "
            f"{fmt_ms(whole):>6} {fmt_ms(inner):>9} {fmt_ms(diff):>12}"
        )
    srv, cli = s["server_cpu_ms_per_cycle"], s["client_cpu_ms_per_cycle"]
    print(
        f"  CPU per cycle: server http {srv['http']} ms, mcp {srv['mcp']} ms; client http "
        f"{cli['http']} ms, mcp {cli['mcp']} ms (the SDK)"
    )
    print(
        "  (server log: the duration the server logs for each request, Quart's start to its "
        "answer; a tool call's route request is logged inside its /mcp request)"
    )


def print_profile(p: dict[str, Any]) -> None:
    print()
    h, c = p.get("http", {}), p.get("mcp", {})
    for name, one in (("http", h), ("mcp", c)):
        if "error" in one:
            print(f"Profile {name}: {one['error']}")
    if "error" in h or "error" in c:
        return
    print(
        f"Profile (py-spy record, 200 Hz, all threads, one more window per transport): "
        f"http {h['samples']} samples at {h['cycles_per_s']} cycles/s, "
        f"mcp {c['samples']} samples at {c['cycles_per_s']} cycles/s; "
        "each sample weighs its window's server CPU per cycle / samples"
    )
    for title, key in (
        ("by layer (first marker on the stack)", "layers"),
        ("by library (deepest frame)", "libraries"),
    ):
        print(
            f"  {title:<62} {'http ms/cycle':>13} {'mcp ms/cycle':>12} {'mcp - http':>10} "
            f"{'mcp share':>9}"
        )
        names = list(dict.fromkeys([*c[key], *h[key]]))
        for name in names:
            a = h[key].get(name, {}).get("ms_per_cycle", 0.0)
            b = c[key].get(name, {}).get("ms_per_cycle", 0.0)
            share = c[key].get(name, {}).get("share", 0.0)
            print(f"    {name:<60} {a:>13.2f} {b:>12.2f} {b - a:>+10.2f} {100 * share:>8.1f}%")
        print(
            f"    {'total (server CPU per cycle in the window)':<60} "
            f"{h['cpu_ms_per_cycle'] or 0:>13.2f} {c['cpu_ms_per_cycle'] or 0:>12.2f} "
            f"{(c['cpu_ms_per_cycle'] or 0) - (h['cpu_ms_per_cycle'] or 0):>+10.2f}"
        )
    print("  hottest functions under mcp (self time, ms/cycle, share of samples)")
    for fn, row in c["top_self"].items():
        print(f"    {row['ms_per_cycle']:>6.2f} {100 * row['share']:>5.1f}%  {fn}")
    print(f"  raw profiles: {h['file']}, {c['file']} (--keep keeps them)")


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="claim-next -> renew -> submit through MCP against the HTTP API, 50 agents"
    )
    p.add_argument("--historical", type=int, default=100_000, help="done tasks (100,000)")
    p.add_argument("--ready", type=int, default=20_000, help="ready tasks (20,000)")
    p.add_argument("--projects", type=int, default=20, help="projects (20)")
    p.add_argument("--agents", type=int, default=50, help="concurrent agents (50)")
    p.add_argument("--duration", type=float, default=20, help="measured seconds per window (20)")
    p.add_argument("--warmup", type=float, default=5, help="warm-up seconds, not counted (5)")
    p.add_argument(
        "--rounds", type=int, default=1, help="rounds of both transports, order alternating (1)"
    )
    p.add_argument(
        "--sequential",
        type=int,
        default=100,
        help="cycles one call at a time per transport before the rounds (100; 0: none)",
    )
    p.add_argument(
        "--no-profile", dest="profile", action="store_false", help="no py-spy windows at the end"
    )
    p.add_argument(
        "--profile-duration", type=float, default=15, help="seconds of each py-spy window (15)"
    )
    p.add_argument(
        "--engine",
        default="sqlite",
        choices=("sqlite", "postgresql", "postgres"),
        help="the server's database (sqlite, the embedded default)",
    )
    p.add_argument(
        "--pg-url",
        default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432"),
        help="with --engine postgresql: the server to create a fresh database on "
        "(default $BENCH_PG_URL or postgresql://postgres@127.0.0.1:5432)",
    )
    p.add_argument(
        "--probe-interval",
        type=float,
        default=0.0,
        help="read the ready queue over HTTP this often during both loads (0: no probe)",
    )
    p.add_argument("--request-timeout", type=float, default=30.0, help="per call (30 s)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temp directory (logs, profiles)")
    opts = p.parse_args(argv)
    if opts.engine == "postgres":
        opts.engine = "postgresql"
    if not (1 <= opts.duration <= 600 and 0 <= opts.warmup <= 600):
        p.error("--duration 1..600 s, --warmup 0..600 s")
    if not 1 <= opts.profile_duration <= 600:
        p.error("--profile-duration 1..600 s")
    if not 0 <= opts.probe_interval <= 60:
        p.error("--probe-interval 0..60 s")
    if not 1 <= opts.rounds <= 20 or not 0 <= opts.sequential <= 10_000:
        p.error("--rounds 1..20, --sequential 0..10,000")
    if opts.historical < 0 or opts.ready < 1 or opts.projects < 1 or not 1 <= opts.agents <= 500:
        p.error("need --historical >= 0, --ready >= 1, --projects >= 1, --agents 1..500")
    if opts.historical > 20_000_000:
        p.error("bounded: --historical at most 20,000,000")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if not sys.platform.startswith("linux"):
        print("bench_mcp: needs Linux (/proc for RSS and CPU)", file=sys.stderr)
        return 2
    try:
        import httpx2  # noqa: F401
        import mcp  # noqa: F401
    except ImportError as exc:
        print(f"bench_mcp: the MCP SDK's client is not installed ({exc})", file=sys.stderr)
        return 2
    if opts.profile and not (
        shutil.which("py-spy") or (Path(sys.executable).parent / "py-spy").exists()
    ):
        progress("py-spy is not installed (pip install py-spy): no profile")
        opts.profile = False
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="bench_mcp-"))
    report: dict[str, Any] = {
        "seeded_projects": opts.projects,
        "seeded_historical": opts.historical,
        "seeded_ready": opts.ready,
        "agents": opts.agents,
        "warmup_s": opts.warmup,
        "duration_s": opts.duration,
        "probe_interval_s": opts.probe_interval,
        "versions": versions()
        | {
            name: version_of(name)
            for name in ("mcp", "mcp-types", "httpx2", "pydantic", "pydantic-core", "anyio")
        },
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        },
    }
    try:
        report |= run(opts, workdir)
    except BenchError as exc:
        print(f"bench_mcp: {exc}", file=sys.stderr)
        return 1
    finally:
        if opts.keep:
            progress(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    report["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["verdicts"] = verdicts(report)
    report["total_s"] = round(time.perf_counter() - started, 1)
    if opts.json:
        print(json.dumps(strip_private(report), indent=2, default=str))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
