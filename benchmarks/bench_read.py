"""Authenticated read throughput of ``buildmax serve`` (SQLite) against a bare-Quart ceiling.

    python benchmarks/bench_read.py [--duration 10] [--warmup 2] [--connections 50]
                                    [--threads 2] [--rounds 1] [--json]

Starts three servers on 127.0.0.1, each as Hypercorn with one in-process
uvloop worker and no access log:

* ours: ``buildmax serve --data-dir <fresh temp dir> --port <free port>``
  (default configuration, metrics on; SQLite). It bootstraps an admin on the
  fresh data directory and prints the one-time token; the benchmark creates
  a space ``bench`` with it and loads ``GET /v1/spaces/<space id>`` with
  ``Authorization: Bearer <token>``.
* nometrics: the same with ``BUILDMAX_METRICS=0`` (no request counted, no
  ``/metrics``), on a data directory of its own: what the metrics cost.
* ceiling: ``benchmarks/ceiling_app.py``, one Quart route returning a small
  JSON object, same request.

Each is loaded with wrk (closed loop, N connections) for a warm-up that is
thrown away and then for the measured duration, one after the other, never
at the same time. Reported: requests/s, latency p50/p95/p99, errors by kind
(non-200 status codes, socket errors), server CPU per request and peak RSS,
the ratio ours/ceiling and the metrics' cost (1 - ours/nometrics). Design
targets (the design note PERFORMANCE.md): ratio >= 0.35, our p99 < 50 ms,
metrics cost <= 10% of throughput.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
LUA_SCRIPT = HERE / "wrk_report.lua"
CEILING_APP = HERE / "ceiling_app.py"
HOST = "127.0.0.1"
TARGET_RATIO = 0.35
TARGET_P99_MS = 50.0
#: The largest share of throughput the metrics may cost.
TARGET_METRICS_COST = 0.10
#: The servers measured, in the order of odd rounds (even rounds reverse it).
SERVERS = ("ceiling", "ours", "nometrics")
TOKEN_RE = re.compile(r"\b(bmx_[A-Za-z0-9_\-]+)")
STARTUP_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
HTTP_TIMEOUT_S = 5.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


def progress(message: str) -> None:
    print(f"[bench_read] {message}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """The benchmark could not run (setup failed); printed as one line."""


def run_in_scratch(name: str, keep: bool, work: Callable[[Path], dict[str, Any]]) -> dict | None:
    """``work(workdir)`` in a new temporary directory, removed afterwards
    unless ``keep``: its report, or ``None`` once a :class:`BenchError` is
    printed as ``name: why``."""
    workdir = Path(tempfile.mkdtemp(prefix=f"{name}-"))
    try:
        return work(workdir)
    except BenchError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return None
    finally:
        if keep:
            print(f"[{name}] kept {workdir}", file=sys.stderr, flush=True)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def nearest_rank(values: list[Any], p: float) -> Any:
    """The ``p``-th percentile of non-empty ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(p / 100 * len(ordered)) - 1))]


def db_url(base: str, name: str) -> str:
    """``base`` (a PostgreSQL server URL) naming database ``name``."""
    parts = urllib.parse.urlsplit(base)
    return urllib.parse.urlunsplit(parts._replace(path="/" + name))


def strip_private(value: Any) -> Any:
    """``value`` without the ``_``-prefixed keys of its mappings (for JSON reports)."""
    if isinstance(value, dict):
        return {k: strip_private(v) for k, v in value.items() if not k.startswith("_")}
    if isinstance(value, list):
        return [strip_private(v) for v in value]
    return value


# --------------------------------------------------------------------------- helpers


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def http(
    method: str, url: str, *, token: str | None = None, body: dict[str, Any] | None = None
) -> tuple[int, bytes]:
    """One request to 127.0.0.1 with a timeout; (status, body). Socket errors raise OSError."""
    assert url.startswith(f"http://{HOST}:"), url
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS / VmHWM of ``pid`` in KiB (empty when the process is gone)."""
    values: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    values[key] = int(rest.split()[0])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return values


def proc_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds used so far by ``pid`` (its threads included)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields_after_comm = stat.rsplit(")", 1)[1].split()
    utime, stime = int(fields_after_comm[11]), int(fields_after_comm[12])
    return (utime + stime) / CLK_TCK


def version_of(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def wrk_version(wrk: str) -> str:
    try:
        out = subprocess.run([wrk, "-v"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    text = (out.stdout + out.stderr).strip().splitlines()
    return text[0] if text else "unknown"


# --------------------------------------------------------------------------- servers


@dataclass
class Server:
    """A server child process of this benchmark."""

    name: str
    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    rss_samples_kib: list[int] = field(default_factory=list)
    baseline_rss_kib: int | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> int | None:
        """SIGTERM, wait, then SIGKILL; the exit code."""
        if self.process.poll() is None:
            try:
                self.process.send_signal(signal.SIGTERM)
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                progress(f"{self.name}: no exit {STOP_TIMEOUT_S:.0f}s after SIGTERM; SIGKILL")
                self.process.kill()
                try:
                    self.process.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    progress(f"{self.name}: pid {self.pid} survived SIGKILL")
        return self.process.returncode


def spawn(name: str, args: list[str], log_path: Path, url: str, env: dict[str, str]) -> Server:
    log_file = open(log_path, "wb")  # noqa: SIM115 - the child writes to it
    try:
        process = subprocess.Popen(
            args,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=env,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        log_file.close()
    return Server(name, url, process, log_path)


def wait_ready(server: Server, path: str, timeout: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if not server.alive():
            raise BenchError(
                f"{server.name} exited with {server.process.returncode} during start-up:\n"
                f"{server.log_tail()}"
            )
        try:
            status, _ = http("GET", server.url + path)
            if status == 200:
                return
            last = f"HTTP {status}"
        except OSError as exc:
            last = str(exc)
        time.sleep(0.1)
    raise BenchError(f"{server.name} not ready after {timeout:.0f}s ({last}):\n{server.log_tail()}")


def buildmax_command() -> list[str]:
    """``buildmax`` of this interpreter's environment, else ``python -m buildmax``."""
    script = Path(sys.executable).parent / "buildmax"
    if script.exists():
        return [str(script)]
    found = shutil.which("buildmax")
    return [found] if found else [sys.executable, "-m", "buildmax"]


def clean_env() -> dict[str, str]:
    """This environment without BUILDMAX_* so the server runs on its defaults."""
    return {k: v for k, v in os.environ.items() if not k.startswith("BUILDMAX_")}


def start_buildmax(
    workdir: Path, name: str = "ours", env: dict[str, str] | None = None
) -> tuple[Server, str]:
    data_dir = workdir / f"{name}-data"
    port = free_port()
    args = [*buildmax_command(), "serve", "--data-dir", str(data_dir), "--port", str(port)]
    progress(
        f"starting {name}: {' '.join(f'{k}={v}' for k, v in (env or {}).items())} {' '.join(args)}"
    )
    server = spawn(
        name, args, workdir / f"{name}.log", f"http://{HOST}:{port}", clean_env() | (env or {})
    )
    wait_ready(server, "/readyz")
    match = TOKEN_RE.search(server.log())
    if not match:
        raise BenchError(
            "buildmax serve printed no admin token (is the data directory fresh?):\n"
            + server.log_tail()
        )
    return server, match.group(1)


def start_ceiling(workdir: Path, graceful_timeout: float) -> Server:
    port = free_port()
    args = [
        sys.executable,
        str(CEILING_APP),
        "--port",
        str(port),
        "--graceful-timeout",
        str(graceful_timeout),
    ]
    progress(f"starting ceiling: {' '.join(args)}")
    server = spawn("ceiling", args, workdir / "ceiling.log", f"http://{HOST}:{port}", clean_env())
    wait_ready(server, "/v1/spaces/warmup")
    return server


def create_space(server: Server, token: str) -> str:
    status, body = http("POST", server.url + "/v1/spaces", token=token, body={"slug": "bench"})
    if status != 201:
        raise BenchError(f"POST /v1/spaces answered {status}: {body[:300]!r}")
    space_id = json.loads(body)["id"]
    status, body = http("GET", f"{server.url}/v1/spaces/{space_id}", token=token)
    if status != 200:
        raise BenchError(f"GET /v1/spaces/{space_id} answered {status}: {body[:300]!r}")
    return str(space_id)


# --------------------------------------------------------------------------- load


class RssSampler:
    """Samples VmRSS of a pid every ``interval`` seconds until stopped."""

    def __init__(self, server: Server, interval: float = 0.1) -> None:
        self._server = server
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            rss = proc_status(self._server.pid).get("VmRSS")
            if rss is not None:
                self._server.rss_samples_kib.append(rss)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def run_wrk(
    wrk: str,
    url: str,
    token: str | None,
    *,
    connections: int,
    threads: int,
    duration: float,
    request_timeout: float,
) -> dict[str, Any]:
    env = dict(os.environ)
    env["BENCH_AUTHORIZATION"] = f"Bearer {token}" if token else ""
    seconds = max(1, round(duration))
    args = [
        wrk,
        f"-t{threads}",
        f"-c{connections}",
        f"-d{seconds}s",
        f"--timeout={request_timeout:g}s",
        "-s",
        str(LUA_SCRIPT),
        url,
    ]
    try:
        out = subprocess.run(
            args, capture_output=True, text=True, env=env, timeout=seconds + request_timeout + 30
        )
    except subprocess.TimeoutExpired:
        raise BenchError(
            f"wrk did not finish within {seconds + request_timeout + 30:.0f}s"
        ) from None
    for line in out.stdout.splitlines():
        if line.startswith("BENCH_RESULT "):
            result: dict[str, Any] = json.loads(line[len("BENCH_RESULT ") :])
            return result
    raise BenchError(f"wrk exited {out.returncode} without a result:\n{out.stdout}\n{out.stderr}")


def measure(
    server: Server, url: str, token: str | None, wrk: str, opts: argparse.Namespace
) -> dict[str, Any]:
    if opts.warmup > 0:
        progress(f"{server.name}: warm-up {opts.warmup:g}s")
        warm = run_wrk(
            wrk,
            url,
            token,
            connections=opts.connections,
            threads=opts.threads,
            duration=opts.warmup,
            request_timeout=opts.request_timeout,
        )
        if warm["requests"] == 0:
            raise BenchError(
                f"{server.name}: no request completed during warm-up:\n{server.log_tail()}"
            )
    if server.baseline_rss_kib is None:
        server.baseline_rss_kib = proc_status(server.pid).get("VmRSS")
    progress(f"{server.name}: measuring {opts.duration:g}s")
    cpu_before = proc_cpu_seconds(server.pid)
    with RssSampler(server):
        result = run_wrk(
            wrk,
            url,
            token,
            connections=opts.connections,
            threads=opts.threads,
            duration=opts.duration,
            request_timeout=opts.request_timeout,
        )
    cpu_after = proc_cpu_seconds(server.pid)
    if not server.alive():
        raise BenchError(f"{server.name} died during the run:\n{server.log_tail()}")
    seconds = result["duration_us"] / 1e6
    lat = result["latency_us"]
    errors = result["errors"]
    socket_errors = {k: errors[k] for k in ("connect", "read", "write", "timeout") if errors[k]}
    statuses = {str(k): v for k, v in sorted(result["statuses"].items())}
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    requests = result["requests"]
    return {
        "requests": requests,
        "seconds": round(seconds, 3),
        "rps": round(requests / seconds, 1) if seconds else 0.0,
        "ok_rps": round((requests - sum(statuses.values())) / seconds, 1) if seconds else 0.0,
        "latency_ms": {
            k: round(lat[k] / 1000, 2) for k in ("p50", "p90", "p95", "p99", "p99.9", "max")
        }
        | {"mean": round(lat["mean"] / 1000, 2)},
        "non_200": statuses,
        "non_2xx_3xx_wrk": errors["status"],
        "socket_errors": socket_errors,
        "server_cpu_s": None if cpu is None else round(cpu, 2),
        "server_cpu_us_per_request": None
        if cpu is None or not requests
        else round(cpu / requests * 1e6, 1),
    }


# --------------------------------------------------------------------------- report


def configuration(opts: argparse.Namespace, wrk: str, grace: float) -> dict[str, Any]:
    hypercorn = {
        "hypercorn.run.run workers": 0,
        "worker_class": "uvloop",
        "accesslog": None,
        "errorlog": "-",
        "graceful_timeout_s": grace,
        "other settings": "Hypercorn defaults (keep_alive_timeout 5s, "
        "keep_alive_max_requests 1000, "
        "backlog 100, HTTP/1.1 cleartext)",
    }
    return {
        "hypercorn": hypercorn,
        "load": {
            "tool": wrk_version(wrk),
            "wrk_threads": opts.threads,
            "connections": opts.connections,
            "warmup_s": opts.warmup,
            "duration_s": opts.duration,
            "request_timeout_s": opts.request_timeout,
            "rounds": opts.rounds,
            "request": "GET /v1/spaces/<space id> with Authorization: Bearer <token> "
            "(same bytes to both)",
        },
        "ours": "buildmax serve --data-dir <fresh tmp> --port <free>; "
        "default configuration (metrics on), SQLite",
        "nometrics": "the same with BUILDMAX_METRICS=0, its own fresh data directory",
        "ceiling": "benchmarks/ceiling_app.py: one Quart route, small JSON object, "
        "same Hypercorn settings",
        "versions": {
            "python": platform.python_version(),
            "buildmax": version_of("buildmax"),
            "quart": version_of("quart"),
            "hypercorn": version_of("hypercorn"),
            "uvloop": version_of("uvloop"),
            "aiosqlite": version_of("aiosqlite"),
            "sqlalchemy": version_of("sqlalchemy"),
            "sqlite": sqlite3.sqlite_version,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        },
    }


def fmt_errors(m: dict[str, Any]) -> str:
    parts = [f"HTTP {code}: {n}" for code, n in m["non_200"].items()]
    parts += [f"{kind}: {n}" for kind, n in m["socket_errors"].items()]
    return ", ".join(parts) if parts else "none"


def print_table(report: dict[str, Any]) -> None:
    cfg = report["configuration"]
    print("Configuration")
    print(
        "  servers : one in-process Hypercorn worker each (hypercorn.run.run, workers=0), "
        "worker_class=uvloop, accesslog off, errorlog '-', graceful_timeout "
        f"{cfg['hypercorn']['graceful_timeout_s']:g}s; other Hypercorn settings default"
    )
    print(f"  ours    : {cfg['ours']}")
    print(f"  nometrics: {cfg['nometrics']}")
    print(f"  ceiling : {cfg['ceiling']}")
    load = cfg["load"]
    print(
        f"  load    : {load['tool']}; {load['wrk_threads']} threads, "
        f"{load['connections']} connections, "
        f"warm-up {load['warmup_s']:g}s, measured {load['duration_s']:g}s, request timeout "
        f"{load['request_timeout_s']:g}s, {load['rounds']} round(s), servers measured one at a time"
    )
    print(f"  request : {load['request']}")
    v = cfg["versions"]
    print("  versions: " + ", ".join(f"{k} {val}" for k, val in v.items()))
    m = cfg["machine"]
    print(
        f"  machine : {m['cpus']} CPUs, Linux {m['kernel']}, load average at start "
        f"{' '.join(str(x) for x in m['loadavg_at_start'])}"
    )
    print()
    header = (
        f"{'round':>5}  {'server':<8} {'req/s':>8} {'200/s':>8} {'p50 ms':>7} {'p95 ms':>7} "
        f"{'p99 ms':>7} {'max ms':>7} {'requests':>9} {'CPU us/req':>10}  errors"
    )
    print(header)
    print("-" * len(header))
    for r in report["rounds"]:
        for name in r["order"]:
            m = r[name]
            lat = m["latency_ms"]
            cpu = (
                "-"
                if m["server_cpu_us_per_request"] is None
                else f"{m['server_cpu_us_per_request']:.0f}"
            )
            print(
                f"{r['round']:>5}  {name:<8} {m['rps']:>8.0f} {m['ok_rps']:>8.0f} "
                f"{lat['p50']:>7.2f} {lat['p95']:>7.2f} "
                f"{lat['p99']:>7.2f} {lat['max']:>7.1f} {m['requests']:>9} {cpu:>10}  "
                f"{fmt_errors(m)}"
            )
        print(
            f"{r['round']:>5}  {'ratio':<8} {r['ratio']:>17.3f}   "
            "(ours/ceiling, 200 answers per second)"
        )
        print(
            f"{r['round']:>5}  {'metrics':<8} {r['metrics_cost'] * 100:>16.1f}%   "
            "(1 - ours/nometrics, 200 answers per second)"
        )
        if r["metrics_cpu_cost"] is not None:
            print(
                f"{r['round']:>5}  {'metrics':<8} {r['metrics_cpu_cost'] * 100:>16.1f}%   "
                "(server CPU per request, ours/nometrics - 1)"
            )
    print()
    s = report["summary"]
    for name in SERVERS:
        rss = report["rss_kib"][name]
        print(
            f"peak RSS {name:<8}: {rss['peak_hwm'] / 1024:6.1f} MiB VmHWM "
            "(whole life, start-up included); "
            f"under load (sampled VmRSS max) {rss['peak_sampled'] / 1024:.1f} MiB; "
            f"after warm-up {rss['baseline'] / 1024:.1f} MiB"
        )
    print()
    print(
        f"ratio ours/ceiling : {s['ratio']:.3f}  (target >= {TARGET_RATIO})  "
        f"{'MET' if s['ratio_met'] else 'MISSED'}"
    )
    print(
        f"our p99            : {s['ours_p99_ms']:.2f} ms  (target < {TARGET_P99_MS:g} ms)  "
        f"{'MET' if s['p99_met'] else 'MISSED'}"
    )
    print(
        f"metrics cost       : {s['metrics_cost'] * 100:.1f}% of throughput  "
        f"(target <= {TARGET_METRICS_COST * 100:g}%)  "
        f"{'MET' if s['metrics_cost_met'] else 'MISSED'}"
    )
    if len(report["rounds"]) > 1:
        print("(with several rounds: median ratio over rounds, worst p99 over rounds)")
    if s["errors"]:
        print(f"errors during measurement: {s['errors']}")
    print(
        "CPU us/req: server process CPU time (all threads, user+system) during the measured window "
        "divided by requests; latency is wrk's (closed loop, so mean latency ~ "
        "connections / throughput)"
    )


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Authenticated GET /v1/spaces/<id> on buildmax serve (SQLite) "
        "vs a bare Quart ceiling."
    )
    parser.add_argument(
        "--duration", type=int, default=10, help="measured seconds per server (default 10)"
    )
    parser.add_argument(
        "--warmup", type=int, default=2, help="warm-up seconds per server, not counted (default 2)"
    )
    parser.add_argument(
        "--connections", type=int, default=50, help="concurrent connections (default 50)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="wrk threads (default: 2, or 1 on a 1-CPU machine)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure both servers this many times, alternating order (default 1)",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=5.0,
        help="wrk per-request timeout in seconds; slower answers count as timeouts (default 5)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the report as JSON instead of a table"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the temp directory (server logs, database)"
    )
    opts = parser.parse_args(argv)
    if opts.duration < 1 or opts.warmup < 0 or opts.rounds < 1 or opts.request_timeout <= 0:
        parser.error("need --duration >= 1, --warmup >= 0, --rounds >= 1, --request-timeout > 0")
    if opts.duration > 600 or opts.warmup > 600 or opts.rounds > 20:
        parser.error("bounded: --duration and --warmup at most 600 s, --rounds at most 20")
    if opts.threads < 1 or opts.connections < opts.threads:
        parser.error("need --threads >= 1 and --connections >= --threads")
    return opts


def run(opts: argparse.Namespace, wrk: str, workdir: Path) -> dict[str, Any]:
    from buildmax.config import Config

    grace = float(Config().shutdown_grace_seconds)
    servers: list[Server] = []
    try:
        # Each server with the token and path its request uses.
        targets: dict[str, tuple[Server, str | None, str]] = {}
        for name, env in (("ours", {}), ("nometrics", {"BUILDMAX_METRICS": "0"})):
            server, token = start_buildmax(workdir, name, env)
            servers.append(server)
            targets[name] = (server, token, f"/v1/spaces/{create_space(server, token)}")
        ceiling = start_ceiling(workdir, grace)
        servers.append(ceiling)
        # The ceiling answers any path, and ignores the token.
        targets["ceiling"] = (ceiling, targets["ours"][1], targets["ours"][2])
        progress("servers: " + ", ".join(f"{n} pid {t[0].pid}" for n, t in targets.items()))

        rounds = []
        for i in range(1, opts.rounds + 1):
            order = list(SERVERS) if i % 2 else list(reversed(SERVERS))
            row: dict[str, Any] = {"round": i, "order": order}
            for name in order:
                server, token, path = targets[name]
                row[name] = measure(server, server.url + path, token, wrk, opts)
            # Only 200 answers count: a server that fails fast must not look fast.
            row["ratio"] = (
                round(row["ours"]["ok_rps"] / row["ceiling"]["ok_rps"], 3)
                if row["ceiling"]["ok_rps"]
                else 0.0
            )
            row["metrics_cost"] = (
                round(1 - row["ours"]["ok_rps"] / row["nometrics"]["ok_rps"], 3)
                if row["nometrics"]["ok_rps"]
                else 1.0
            )
            on, off = (row[n]["server_cpu_us_per_request"] for n in ("ours", "nometrics"))
            # Server CPU per request is steadier than throughput on a busy machine.
            row["metrics_cpu_cost"] = round(on / off - 1, 3) if on and off else None
            rounds.append(row)

        rss = {}
        for name in SERVERS:
            server = targets[name][0]
            status = proc_status(server.pid)
            rss[name] = {
                "peak_hwm": status.get("VmHWM", 0),
                "peak_sampled": max(server.rss_samples_kib, default=0),
                "baseline": server.baseline_rss_kib or 0,
                "final": status.get("VmRSS", 0),
            }
    finally:
        for server in reversed(servers):
            code = server.stop()
            progress(f"{server.name} stopped (exit {code})")

    ratio = statistics.median(r["ratio"] for r in rounds)
    metrics_cost = statistics.median(r["metrics_cost"] for r in rounds)
    p99 = max(r["ours"]["latency_ms"]["p99"] for r in rounds)
    errors = {}
    for r in rounds:
        for name in SERVERS:
            text = fmt_errors(r[name])
            if text != "none":
                errors[f"round {r['round']} {name}"] = text
    return {
        "configuration": configuration(opts, wrk, grace),
        "rounds": rounds,
        "rss_kib": rss,
        "summary": {
            "ratio": ratio,
            "ratio_target": TARGET_RATIO,
            "ratio_met": ratio >= TARGET_RATIO,
            "ours_p99_ms": p99,
            "p99_target_ms": TARGET_P99_MS,
            "p99_met": p99 < TARGET_P99_MS,
            "metrics_cost": metrics_cost,
            "metrics_cost_target": TARGET_METRICS_COST,
            "metrics_cost_met": metrics_cost <= TARGET_METRICS_COST,
            "errors": errors,
        },
    }


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    wrk = shutil.which("wrk")
    if wrk is None:
        print(
            "bench_read: wrk is not installed; install it with: "
            "sudo apt-get update && sudo apt-get install -y wrk",
            file=sys.stderr,
        )
        return 2
    if not sys.platform.startswith("linux"):
        print("bench_read: needs Linux (/proc for RSS and CPU)", file=sys.stderr)
        return 2
    report = run_in_scratch("bench_read", opts.keep, lambda workdir: run(opts, wrk, workdir))
    if report is None:
        return 1
    if opts.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
