"""Sustained writes on SQLite: does the write-ahead log stay bounded?

    python benchmarks/bench_wal.py [--duration 180] [--agents 8] [--idle 5]
                                   [--pin-at 60 --pin-for 30 --hard-limit 268435456]
                                   [--json] [--keep]

One ``buildmax serve`` with its default configuration on a fresh data
directory (SQLite), a space with ``--ready`` ready tasks seeded in bulk, and
``--agents`` agents (8) each looping claim-next -> renew -> submit over its
own keep-alive connection (``bench_claims.py``'s agent loop): three write
transactions per cycle, as fast as the server answers, for ``--duration``
seconds. Every 0.25 s a thread samples the size of ``buildmax.db-wal`` and
``buildmax.db``. Then the load stops and the server idles for ``--idle``
seconds, still sampled: the log must be emptied.

With ``--pin-at S --pin-for P`` a reader in this process opens a transaction
on the database S seconds into the measured window and holds its snapshot for
P seconds: the log cannot start over meanwhile and grows up to the server's
hard limit (``--hard-limit``, passed as ``BUILDMAX_SQLITE_WAL_HARD_LIMIT_BYTES``),
past which writes answer 503 ``database-log-full``; after the reader lets go
the log must shrink again.

Printed: writes/s and cycles/s, latency percentiles per operation, errors by
kind, peak server RSS, and the log: largest, p95 and median size under load,
its size at the end of the load and after the idle time, against its soft
limit and against the bytes written per checkpoint interval (what one
interval can add before the log starts over: the ceiling of a log that is
bounded), and the database file's growth for scale.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench_claims import (
    Agent,
    Load,
    LoadResult,
    Sampler,
    Setup,
    admin_token_of,
    latency_summary,
    port_of,
    progress,
    run_async,
    seed_sqlite,
    serve_args,
    setup_space,
)
from bench_read import (
    HOST,
    BenchError,
    Server,
    clean_env,
    free_port,
    run_in_scratch,
    spawn,
    wait_ready,
)

SAMPLE_S = 0.25
MIB = 1024 * 1024
#: The server's defaults (buildmax.config.Config).
DEFAULT_SOFT_LIMIT = 64 * MIB
CHECKPOINT_INTERVAL_S = 1.0
WRITES_PER_CYCLE = 3


class LogSampler:
    """Samples the sizes of the log and the database file every ``SAMPLE_S``."""

    def __init__(self, db_path: Path) -> None:
        self.wal = db_path.with_name(db_path.name + "-wal")
        self.db = db_path
        self.samples: list[tuple[float, int, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.perf_counter()

    @staticmethod
    def _size(path: Path) -> int:
        try:
            return path.stat().st_size
        except FileNotFoundError:
            return 0

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            now = time.perf_counter() - self.t0
            self.samples.append((now, self._size(self.wal), self._size(self.db)))

    def between(self, start: float, end: float) -> list[int]:
        """Log sizes sampled in ``[start, end)`` seconds since the sampler began."""
        return [wal for t, wal, _ in self.samples if start <= t < end]

    def __enter__(self) -> LogSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class Pin:
    """A reader holding one snapshot from ``at`` for ``hold`` seconds of the window."""

    def __init__(self, db_path: Path, at: float, hold: float) -> None:
        self.db_path, self.at, self.hold = db_path, at, hold
        self.started: float | None = None
        self.ended: float | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.window_start = 0.0

    def start(self, window_start: float) -> None:
        self.window_start = window_start
        self._thread.start()

    def _run(self) -> None:
        time.sleep(max(0.0, self.window_start + self.at - time.perf_counter()))
        conn = sqlite3.connect(self.db_path, isolation_level=None)
        try:
            conn.execute("BEGIN")
            conn.execute("SELECT count(*) FROM spaces").fetchall()
            self.started = time.perf_counter()
            time.sleep(self.hold)
            conn.execute("COMMIT")
            self.ended = time.perf_counter()
        finally:
            conn.close()

    def join(self) -> None:
        self._thread.join(timeout=self.at + self.hold + 30)


def largest_growth(sizes: list[int]) -> int:
    """The most the log grew within one second (between samples a second apart)."""
    step = round(1 / SAMPLE_S)
    return max((b - a for a, b in zip(sizes, sizes[step:], strict=False)), default=0)


def mib(value: float | None) -> str:
    return "-" if value is None else f"{value / MIB:.1f} MiB"


def quantile(values: list[int], p: float) -> int | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


def start_server(workdir: Path, data_dir: Path, env_extra: dict[str, str]) -> Server:
    port = free_port()
    args = serve_args(data_dir, port, None)
    progress(f"starting: {' '.join(args)} {' '.join(f'{k}={v}' for k, v in env_extra.items())}")
    log = workdir / "buildmax.log"
    server = spawn("buildmax", args, log, f"http://{HOST}:{port}", clean_env() | env_extra)
    wait_ready(server, "/readyz", timeout=120)
    return server


def run(opts: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    data_dir = workdir / "data"
    db_path = data_dir / "buildmax.db"
    env_extra = {}
    if opts.hard_limit:
        env_extra["BUILDMAX_SQLITE_WAL_HARD_LIMIT_BYTES"] = str(opts.hard_limit)
    server = start_server(workdir, data_dir, env_extra)
    try:
        token = admin_token_of(server)
        setup: Setup = setup_space(
            server, token, argparse.Namespace(projects=4, agents=opts.agents)
        )
        server.stop()
        progress(f"seeding {opts.ready:,} ready tasks")
        seed = seed_sqlite(db_path, setup, 0, opts.ready)
        server = start_server(workdir, data_dir, env_extra)
        agents = [Agent(n, pid, tok, port_of(server)) for n, pid, tok in setup.agents]
        load_opts = argparse.Namespace(
            warmup=opts.warmup,
            duration=opts.duration,
            request_timeout=30.0,
            probe_interval=1.0,
        )
        pin = Pin(db_path, opts.pin_at, opts.pin_for) if opts.pin_for else None
        with LogSampler(db_path) as logs, Sampler([server.pid]) as rss:
            window: dict[str, float] = {}

            def window_start() -> None:
                window["start"] = time.perf_counter() - logs.t0
                if pin:
                    pin.start(time.perf_counter())
                progress(f"measuring {opts.duration:g}s")

            def window_end() -> None:
                window["end"] = time.perf_counter() - logs.t0

            load: LoadResult = run_async(
                Load(agents, setup.space_id, port_of(server), setup.agents[0][2], load_opts).run(
                    window_start, window_end
                )
            )
            if pin:
                pin.join()
            stopped = time.perf_counter() - logs.t0
            progress(f"idle {opts.idle:g}s")
            time.sleep(opts.idle)
            idle_end = time.perf_counter() - logs.t0
        if not server.alive():
            raise BenchError(f"the server died:\n{server.log_tail()}")
        peak_rss = rss.peak[server.pid]
    finally:
        server.stop()
    under_load = logs.between(window["start"], window["end"])
    db_sizes = [db for t, _, db in logs.samples if window["start"] <= t < window["end"]]
    writes = load.statuses
    ok_writes = sum(n for key, n in writes.items() if key.split()[-1].startswith("2"))
    seconds = load.seconds
    db_growth = (db_sizes[-1] - db_sizes[0]) if len(db_sizes) > 1 else 0
    result: dict[str, Any] = {
        "agents": opts.agents,
        "duration_s": opts.duration,
        "seeded_ready": seed.get("ready", opts.ready),
        "cycles_per_s": round(load.cycles / seconds, 1),
        "writes_per_s": round(load.cycles * WRITES_PER_CYCLE / seconds, 1),
        "latency_ms": {op: latency_summary(v) for op, v in load.latencies.items()},
        "errors": dict(load.errors),
        "answers": dict(collections.Counter(writes)),
        "ok_answers_all": ok_writes,
        "peak_rss_mib": round(peak_rss / 1024, 1),
        "wal": {
            "largest": max(under_load, default=0),
            "p95": quantile(under_load, 95),
            "median": quantile(under_load, 50),
            "at_load_end": logs.between(window["end"], stopped + SAMPLE_S)[-1:] or [None],
            "after_idle": logs.between(stopped, idle_end + 1)[-1:] or [None],
            "soft_limit": DEFAULT_SOFT_LIMIT,
            "hard_limit": opts.hard_limit or 1024 * MIB,
        },
        "db": {
            "start": db_sizes[0] if db_sizes else None,
            "end": db_sizes[-1] if db_sizes else None,
            "growth_per_s": round(db_growth / seconds) if seconds else None,
        },
    }
    result["wal"]["at_load_end"] = result["wal"]["at_load_end"][0]
    result["wal"]["after_idle"] = result["wal"]["after_idle"][0]
    result["wal"]["largest_growth_per_s"] = largest_growth(under_load)
    if pin and pin.started and pin.ended:
        t0 = logs.t0
        result["pin"] = {
            "from_s": round(pin.started - t0 - window["start"], 1),
            "to_s": round(pin.ended - t0 - window["start"], 1),
            "largest_while_pinned": max(logs.between(pin.started - t0, pin.ended - t0), default=0),
            "largest_after": max(logs.between(pin.ended - t0 + 3, window["end"]), default=0),
            "refused_503": sum(n for key, n in writes.items() if key.endswith(" 503")),
        }
    return result


def print_report(r: dict[str, Any]) -> None:
    wal = r["wal"]
    print(
        f"\nSQLite write-ahead log under sustained writes ({r['agents']} agents, "
        f"{r['duration_s']:g} s measured)"
    )
    print(
        f"  throughput     {r['writes_per_s']} writes/s ({r['cycles_per_s']} claim cycles/s, "
        f"{WRITES_PER_CYCLE} writes each)"
    )
    for op, lat in r["latency_ms"].items():
        print(
            f"  {op:<14} p50 {lat['p50']} ms  p95 {lat['p95']} ms  p99 {lat['p99']} ms  "
            f"max {lat['max']} ms  (n={lat['count']})"
        )
    print(f"  errors         {r['errors'] or 'none'}")
    print(f"  peak RSS       {r['peak_rss_mib']} MiB")
    print(
        f"  database file  {mib(r['db']['start'])} -> {mib(r['db']['end'])} "
        f"({mib(r['db']['growth_per_s'])}/s)"
    )
    print(
        f"  log largest    {mib(wal['largest'])}   p95 {mib(wal['p95'])}   "
        f"median {mib(wal['median'])}"
    )
    print(
        f"  log limits     soft {mib(wal['soft_limit'])}, hard {mib(wal['hard_limit'])}; "
        f"largest growth within a second {mib(wal['largest_growth_per_s'])}"
    )
    print(
        f"  log at end     {mib(wal['at_load_end'])} when the load stopped, "
        f"{mib(wal['after_idle'])} after the idle time"
    )
    if "pin" in r:
        pin = r["pin"]
        print(
            f"  pinned reader  {pin['from_s']} s to {pin['to_s']} s: log up to "
            f"{mib(pin['largest_while_pinned'])}, {pin['refused_503']} writes refused (503); "
            f"afterwards at most {mib(pin['largest_after'])}"
        )
    # Without a pinning reader the log starts over every checkpoint interval,
    # so it holds at most what a second adds, cut back to the soft limit; a
    # pinned log stops at the hard limit plus the one transaction that passed it.
    bound = wal["hard_limit"] if "pin" in r else wal["soft_limit"]
    bounded = wal["largest"] <= max(bound, 2 * wal["largest_growth_per_s"]) + MIB
    print(
        f"  verdict        log {'bounded' if bounded else 'NOT bounded'} "
        f"(largest {mib(wal['largest'])} against {mib(bound)}); "
        f"{'emptied' if wal['after_idle'] == 0 else 'NOT emptied'} when idle"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="SQLite write-ahead log under sustained writes")
    p.add_argument("--duration", type=float, default=180, help="measured seconds (180)")
    p.add_argument("--warmup", type=float, default=3, help="warm-up seconds (3)")
    p.add_argument("--agents", type=int, default=8, help="concurrent agents (8)")
    p.add_argument("--ready", type=int, default=200_000, help="ready tasks seeded (200,000)")
    p.add_argument("--idle", type=float, default=5, help="idle seconds after the load (5)")
    p.add_argument("--pin-at", type=float, default=0, help="seconds into the window a reader pins")
    p.add_argument("--pin-for", type=float, default=0, help="seconds the reader holds (0: none)")
    p.add_argument("--hard-limit", type=int, default=0, help="the server's WAL hard limit, bytes")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temp directory")
    opts = p.parse_args(argv)
    if not 1 <= opts.duration <= 3600 or not 0 <= opts.idle <= 600 or not 1 <= opts.agents <= 200:
        p.error("--duration 1..3600, --idle 0..600, --agents 1..200")
    if opts.pin_for and opts.pin_at + opts.pin_for > opts.duration:
        p.error("the pin must end inside the measured window")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    report = run_in_scratch("bench_wal", opts.keep, lambda workdir: run(opts, workdir))
    if report is None:
        return 1
    report["machine"] = {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()]}
    if opts.json:
        print(json.dumps(report, indent=2))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
