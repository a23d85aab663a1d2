"""The audit trail: append cost inside a transaction, export and verify of N events.

    python benchmarks/bench_audit.py [--engines sqlite,postgresql] [--events 100000]
                                     [--appends 5000] [--json] [--keep]

Per engine, on a fresh database (SQLite: a fresh data directory; PostgreSQL: a
fresh database ``bench_audit_<pid>_<random>`` on ``--pg-url``, dropped at the
end), an app is built in this process the way the test fixture builds one
(``create_app(Config(...), auto_migrate=True)``, every installed plugin, the
system clock) and started with ``app.test_app()``; the loop is uvloop when
installed (what ``buildmax serve`` runs on).

1. **Seeding through the real append path**: ``app.audit.record`` 500 times
   per write transaction, round-robin over 3 space chains and the system chain
   (``space.updated`` / ``principal.updated``), so every event is appended by
   the plugin's before-commit callback like in production.
2. **Export**: on the empty trail (the command's fixed cost), once the trail
   holds 10,000 events (``--small-events``) and once it holds ``--events``
   (100,000), ``python -m buildmax audit export --output FILE`` runs as a
   subprocess (``--data-dir`` or ``--database-url``) while the app stays open,
   as on a live server: wall time, events/s, file size and the command's own
   peak RSS (``ru_maxrss`` from ``os.wait4`` in a small launcher that forks
   it: a child forked from the benchmark itself would report the benchmark's
   RSS too, since Linux keeps the pre-``execve`` high-water mark). Memory is
   bounded when the peak RSS does not grow from 10,000 to 100,000 events.
3. **Verify**: ``python -m buildmax audit verify FILE`` (offline, each file)
   and ``python -m buildmax audit verify`` (the database): wall time, peak RSS,
   exit code, and the events and chains each reports.
4. **Append cost inside an existing transaction** (after the export, so the
   trail already holds N events): pairs of write transactions on 8 more space
   chains, each ``UPDATE spaces SET name`` then, in one of the two,
   ``app.audit.record(..., "space.updated", ...)``; the order inside a pair
   alternates (ABBA). Each whole ``async with app.db.write()`` block is timed,
   so the figure includes the append itself, which happens in the plugin's
   ``last`` before-commit callback, not in ``record()``. Both variants also
   register two no-op ``last`` callbacks around ``record()`` whose timestamps
   bracket the plugin's flush. The added cost is p(with) - p(without) per
   percentile (the target's figure) and, for context, the percentiles of the
   per-pair difference. ``--warmup-appends`` pairs first, not counted.
5. The database is verified again (subprocess) with the appended events.

Target (PERFORMANCE.md, audit issue item 6): added cost of one audit event
inside a transaction p95 < 1 ms on SQLite. Item 4: export of 100,000 events
with bounded memory (peak RSS reported), verifying offline.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import resource
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from bench_read import BenchError, clean_env, db_url, nearest_rank, strip_private

#: Audit issue item 6: added cost of one event inside a transaction, p95, SQLite.
TARGET_APPEND_P95_US = 1000.0
#: Peak RSS growth between the small and the full export still called bounded.
BOUNDED_GROWTH_MIB = 16.0
SEED_PER_TX = 500
SEED_SPACES = 3
APPEND_SPACES = 8
CHILD_TIMEOUT_S = 1800.0


def progress(message: str) -> None:
    print(f"[bench_audit] {message}", file=sys.stderr, flush=True)


def version_of(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


# --------------------------------------------------------------------------- statistics


def pct_us(values_ns: list[int], p: float) -> float | None:
    """The ``p``-th percentile (nearest rank) of ``values_ns``, in microseconds."""
    if not values_ns:
        return None
    return round(nearest_rank(values_ns, p) / 1000, 1)


def summary_us(values_ns: list[int]) -> dict[str, Any]:
    return {
        "count": len(values_ns),
        "p50": pct_us(values_ns, 50),
        "p95": pct_us(values_ns, 95),
        "p99": pct_us(values_ns, 99),
        "max": round(max(values_ns) / 1000, 1) if values_ns else None,
        "mean": round(sum(values_ns) / len(values_ns) / 1000, 1) if values_ns else None,
    }


# --------------------------------------------------------------------------- subprocesses


#: Runs argv[2:] and writes its exit code, wall time and own rusage to argv[1]. A
#: child's ``ru_maxrss`` also counts the memory of the process it was forked
#: from (Linux keeps the pre-exec high-water mark across ``execve``), so the
#: command is forked from this small interpreter, not from the benchmark.
_MEASURE = """
import json, os, sys, time
started = time.perf_counter()
pid = os.fork()
if pid == 0:
    try:
        os.execv(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as out:
    json.dump({"exit": os.waitstatus_to_exitcode(status),
               "wall_s": time.perf_counter() - started,
               "maxrss_kib": usage.ru_maxrss,
               "cpu_s": usage.ru_utime + usage.ru_stime}, out)
"""


def run_child(name: str, args: list[str], workdir: Path) -> dict[str, Any]:
    """Run ``args`` to completion: wall time, exit code and the peak RSS and
    CPU of that one process (``os.wait4`` in a small launcher, see _MEASURE)."""
    out_path, err_path = workdir / f"{name}.stdout", workdir / f"{name}.stderr"
    result_path = workdir / f"{name}.rusage.json"
    launcher = [sys.executable, "-I", "-S", "-c", _MEASURE, str(result_path), *args]
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            launcher, stdout=out, stderr=err, env=clean_env(), cwd=workdir, start_new_session=True
        )
        try:
            proc.wait(timeout=CHILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise BenchError(
                f"{name}: no answer within {CHILD_TIMEOUT_S:g} s ({' '.join(args)})"
            ) from None
    if proc.returncode != 0 or not result_path.exists():
        raise BenchError(f"{name}: the launcher failed ({err_path.read_text()[-500:]})")
    measured = json.loads(result_path.read_text())
    stdout = out_path.read_text(errors="replace")
    stderr = err_path.read_text(errors="replace")
    return {
        "command": " ".join(args),
        "exit": measured["exit"],
        "wall_s": round(measured["wall_s"], 3),
        "peak_rss_mib": round(measured["maxrss_kib"] / 1024, 1),
        "cpu_s": round(measured["cpu_s"], 2),
        "stdout_tail": stdout.splitlines()[-6:],
        "stderr_tail": [line for line in stderr.splitlines() if line.strip()][-4:],
        "_stdout": stdout,
    }


def verify_counts(stdout: str) -> tuple[int, int, int]:
    """(chains ok, chains broken, events) from ``buildmax audit verify``'s output."""
    ok = broken = count = 0
    for line in stdout.splitlines():
        if line.startswith("ok "):
            ok += 1
            count += int(line.split(": ", 1)[1].split(" event", 1)[0])
        elif line.startswith("BROKEN"):
            broken += 1
    return ok, broken, count


def buildmax_args(*args: str) -> list[str]:
    return [sys.executable, "-m", "buildmax", *args]


# --------------------------------------------------------------------------- in process


class Trail:
    """The app under test, its principal and spaces, and the seeded count."""

    def __init__(self, app: Any, actor: Any, principal_id: str) -> None:
        self.app = app
        self.actor = actor
        self.principal_id = principal_id
        self.seed_spaces: list[dict[str, Any]] = []
        self.seeded = 0
        self.seed_s = 0.0

    async def make_space(self, slug: str) -> dict[str, Any]:
        from buildmax.spaces import create_space

        owner = await self._principal_pk()
        async with self.app.db.write() as tx:
            return dict(
                await create_space(
                    tx,
                    slug=slug,
                    name=slug,
                    owner_pk=owner,
                    created_by=owner,
                    now=self.app.clock.now_ms(),
                )
            )

    async def _principal_pk(self) -> int:
        import sqlalchemy as sa

        from buildmax.tables import principals

        async with self.app.db.read() as conn:
            pk = await conn.fetch_val(
                sa.select(principals.c.id).where(principals.c.public_id == self.principal_id)
            )
        return int(pk)

    async def seed_to(self, total: int) -> None:
        """Record events, ``SEED_PER_TX`` per transaction, until ``total`` were seeded."""
        app, actor = self.app, self.actor
        targets = [s["public_id"] for s in self.seed_spaces] + [None]
        started = time.perf_counter()
        while self.seeded < total:
            count = min(SEED_PER_TX, total - self.seeded)
            async with app.db.write() as tx:
                for i in range(self.seeded, self.seeded + count):
                    space = targets[i % len(targets)]
                    if space is None:
                        await app.audit.record(
                            tx,
                            actor,
                            "principal.updated",
                            target_type="principal",
                            target_id=self.principal_id,
                            details={"display_name": f"seed {i}"},
                        )
                    else:
                        await app.audit.record(
                            tx,
                            actor,
                            "space.updated",
                            space_id=space,
                            target_type="space",
                            target_id=space,
                            details={"name": f"seed {i}"},
                        )
            self.seeded += count
        self.seed_s += time.perf_counter() - started


async def open_trail(app: Any) -> Trail:
    from buildmax_hookspecs import Actor

    from buildmax.principals import create_principal

    async with app.db.write() as tx:
        row = await create_principal(
            tx,
            kind="human",
            name=f"bench-{secrets.token_hex(4)}",
            system_role="admin",
            now=app.clock.now_ms(),
        )
    actor = Actor(principal_id=row["public_id"], kind="human", name=row["name"])
    trail = Trail(app, actor, row["public_id"])
    for k in range(SEED_SPACES):
        trail.seed_spaces.append(await trail.make_space(f"seed-{k}"))
    return trail


async def measure_appends(trail: Trail, pairs: int, warmup: int) -> dict[str, Any]:
    """Pairs of write transactions with and without one audit event."""
    import sqlalchemy as sa

    from buildmax.tables import spaces

    app, actor = trail.app, trail.actor
    targets = [await trail.make_space(f"append-{k}") for k in range(APPEND_SPACES)]
    rename = (
        sa.update(spaces)
        .where(spaces.c.id == sa.bindparam("space_pk"))
        .values(name=sa.bindparam("new_name"))
    )
    samples: dict[str, list[int]] = {
        "without": [],
        "with": [],
        "record": [],
        "flush_with": [],
        "flush_without": [],
    }
    paired: list[int] = []

    async def one(with_audit: bool, space: dict[str, Any], name: str) -> tuple[int, int, int]:
        marks = [0, 0]

        async def before() -> None:
            marks[0] = time.perf_counter_ns()

        async def after() -> None:
            marks[1] = time.perf_counter_ns()

        recorded = 0
        started = time.perf_counter_ns()
        async with app.db.write() as tx:
            await tx.execute(rename, {"space_pk": space["id"], "new_name": name})
            tx.before_commit(before, last=True)
            if with_audit:
                r0 = time.perf_counter_ns()
                await app.audit.record(
                    tx,
                    actor,
                    "space.updated",
                    space_id=space["public_id"],
                    target_type="space",
                    target_id=space["public_id"],
                    details={"name": name},
                )
                recorded = time.perf_counter_ns() - r0
            tx.before_commit(after, last=True)
        return time.perf_counter_ns() - started, recorded, marks[1] - marks[0]

    for k in range(warmup + pairs):
        space = targets[k % len(targets)]
        order = (False, True) if k % 2 == 0 else (True, False)
        took: dict[bool, int] = {}
        for with_audit in order:
            total, recorded, flush = await one(with_audit, space, f"n{k}{int(with_audit)}")
            took[with_audit] = total
            if k >= warmup:
                if with_audit:
                    samples["with"].append(total)
                    samples["record"].append(recorded)
                    samples["flush_with"].append(flush)
                else:
                    samples["without"].append(total)
                    samples["flush_without"].append(flush)
        if k >= warmup:
            paired.append(took[True] - took[False])
    result: dict[str, Any] = {name: summary_us(values) for name, values in samples.items()}
    result["paired"] = summary_us(paired)
    result["added"] = {
        p: round(result["with"][p] - result["without"][p], 1) for p in ("p50", "p95", "p99")
    }
    result["pairs"], result["warmup_pairs"], result["chains"] = pairs, warmup, len(targets)
    result["events_recorded"] = warmup + pairs
    return result


# --------------------------------------------------------------------------- one engine


async def _engine(
    opts: argparse.Namespace, engine: str, workdir: Path, url: str | None
) -> dict[str, Any]:
    from buildmax.app import create_app
    from buildmax.config import Config

    data_dir = workdir / f"{engine}-data"
    config = Config(data_dir=str(data_dir), database_url=url or "")
    target = ["--database-url", url] if url else ["--data-dir", str(data_dir)]
    app = create_app(config, auto_migrate=True)
    run: dict[str, Any] = {"database": url or str(data_dir / "buildmax.db")}
    async with app.test_app():
        run["plugins"] = sorted(
            name for name, _ in app.plugins.pm.list_name_plugin() if not name.startswith("<")
        )
        trail = await open_trail(app)
        exports: dict[str, Any] = {}
        verifies: dict[str, Any] = {}
        # 0 first: the fixed cost of a connected `buildmax audit export`.
        sizes = sorted({0, min(opts.small_events, opts.events), opts.events})
        for size in sizes:
            progress(f"{engine}: seeding to {size:,} events ({SEED_PER_TX} per transaction)")
            await trail.seed_to(size)
            path = workdir / f"{engine}-export-{size}.jsonl"
            progress(f"{engine}: buildmax audit export ({size:,} events)")
            child = await asyncio.to_thread(
                run_child,
                f"{engine}-export-{size}",
                buildmax_args("audit", "export", "--output", str(path), *target),
                workdir,
            )
            child["events"] = size
            child["file_mib"] = round(path.stat().st_size / 2**20, 2) if path.exists() else None
            child["events_per_s"] = round(size / child["wall_s"]) if child["wall_s"] else None
            exports[str(size)] = child
            progress(f"{engine}: buildmax audit verify FILE ({size:,} events, offline)")
            offline = await asyncio.to_thread(
                run_child,
                f"{engine}-verify-file-{size}",
                buildmax_args("audit", "verify", str(path)),
                workdir,
            )
            offline["chains_ok"], offline["chains_broken"], offline["events"] = verify_counts(
                offline["_stdout"]
            )
            offline["expected_events"] = size
            # An empty trail is reported ("nothing was verified"), never passed.
            offline["expected_exit"] = 0 if size else 1
            verifies[f"file {size}"] = offline
        run["seed"] = {
            "events": trail.seeded,
            "seconds": round(trail.seed_s, 2),
            "events_per_s": round(trail.seeded / trail.seed_s) if trail.seed_s else None,
            "per_tx": SEED_PER_TX,
            "chains": SEED_SPACES + 1,
        }
        progress(f"{engine}: buildmax audit verify (database, {trail.seeded:,} events)")
        db_check = await asyncio.to_thread(
            run_child,
            f"{engine}-verify-db",
            buildmax_args("audit", "verify", *target),
            workdir,
        )
        db_check["chains_ok"], db_check["chains_broken"], db_check["events"] = verify_counts(
            db_check["_stdout"]
        )
        db_check["expected_events"] = trail.seeded
        verifies["database"] = db_check
        progress(
            f"{engine}: {opts.warmup_appends} + {opts.appends} append pairs "
            f"(trail holds {trail.seeded:,} events)"
        )
        run["append"] = await measure_appends(trail, opts.appends, opts.warmup_appends)
        run["append"]["trail_events_before"] = trail.seeded
        progress(f"{engine}: buildmax audit verify (database, after the appends)")
        after = await asyncio.to_thread(
            run_child,
            f"{engine}-verify-db-after",
            buildmax_args("audit", "verify", *target),
            workdir,
        )
        after["chains_ok"], after["chains_broken"], after["events"] = verify_counts(
            after["_stdout"]
        )
        after["expected_events"] = trail.seeded + run["append"]["events_recorded"]
        verifies["database after appends"] = after
    run["export"], run["verify"] = exports, verifies
    small, full = exports[str(sizes[-2])], exports[str(sizes[-1])]
    if len(sizes) >= 2:
        extra = sizes[-1] - sizes[-2]
        dt = full["wall_s"] - small["wall_s"]
        run["export_growth"] = {
            "events": extra,
            "marginal_events_per_s": round(extra / dt) if dt > 0 else None,
            "rss_growth_mib": round(full["peak_rss_mib"] - small["peak_rss_mib"], 1),
            "kib_per_1000_events": round(
                (full["peak_rss_mib"] - small["peak_rss_mib"]) * 1024 / (extra / 1000), 2
            ),
        }
    run["seed"]["note"] = "app.audit.record through the plugin's before-commit append"
    return run


def run_engine(
    opts: argparse.Namespace, engine: str, workdir: Path, url: str | None
) -> dict[str, Any]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_engine(opts, engine, workdir, url))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_engine(opts, engine, workdir, url))


async def _pg_admin(url: str, statement: str) -> str:
    import asyncpg

    conn = await asyncpg.connect(url, timeout=10)
    try:
        if statement == "version":
            return str(await conn.fetchval("SELECT version()")).split(" on ")[0]
        await conn.execute(statement)
        return ""
    finally:
        await conn.close()


def run_postgres(opts: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    name = f"bench_audit_{os.getpid()}_{secrets.token_hex(4)}"
    admin = db_url(opts.pg_url, "postgres")
    try:
        version = asyncio.run(_pg_admin(admin, "version"))
    except Exception as exc:
        raise BenchError(f"PostgreSQL at {opts.pg_url} is not reachable: {exc}") from None
    asyncio.run(_pg_admin(admin, f'CREATE DATABASE "{name}"'))
    progress(f"postgresql: created database {name}")
    try:
        run = run_engine(opts, "postgresql", workdir, db_url(opts.pg_url, name))
    finally:
        asyncio.run(_pg_admin(admin, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        progress(f"postgresql: dropped database {name}")
    run["server_version"] = version
    return run


# --------------------------------------------------------------------------- report


def verdicts(report: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for engine in ("sqlite", "postgresql"):
        run = report.get(engine)
        if not run:
            continue
        added = run["append"]["added"]["p95"]
        if engine == "sqlite":
            out.append(
                {
                    "target": "SQLite: added cost of one audit event in a transaction, p95 < 1 ms",
                    "value": f"{added} us",
                    "pass": added < TARGET_APPEND_P95_US,
                }
            )
        growth = run.get("export_growth")
        if growth:
            out.append(
                {
                    "target": f"{engine}: export peak RSS bounded (growth from "
                    f"{report['small_events']:,} to {report['events']:,} events "
                    f"< {BOUNDED_GROWTH_MIB:g} MiB)",
                    "value": f"{growth['rss_growth_mib']:+} MiB",
                    "pass": growth["rss_growth_mib"] < BOUNDED_GROWTH_MIB,
                }
            )
        children = [*run["export"].values(), *run["verify"].values()]
        failed = [c["command"] for c in children if c["exit"] != c.get("expected_exit", 0)]
        wrong = [
            f"verify {name}: {c['events']:,} events (expected {c['expected_events']:,}), "
            f"{c['chains_broken']} chain(s) broken"
            for name, c in run["verify"].items()
            if c["chains_broken"] or c["events"] != c["expected_events"]
        ]
        out.append(
            {
                "target": f"{engine}: every export and verify exits as expected "
                "(1 for an empty trail) and verifies every event",
                "value": "; ".join(failed + wrong) or "exits as expected, counts match",
                "pass": not failed and not wrong,
            }
        )
    return out


def fmt(v: Any) -> str:
    return "-" if v is None else f"{v:,.1f}"


def print_engine(title: str, run: dict[str, Any]) -> None:
    print()
    print(title)
    print(f"  database: {run['database']}")
    if run.get("server_version"):
        print(f"  server  : {run['server_version']}")
    print(f"  plugins : {', '.join(run['plugins'])}")
    s = run["seed"]
    print(
        f"  seeding : {s['events']:,} events in {s['seconds']:.1f} s ({s['events_per_s']:,}/s), "
        f"{s['per_tx']} per transaction over {s['chains']} chains (3 spaces + system), "
        "through app.audit.record and the plugin's before-commit append"
    )
    a = run["append"]
    print(
        f"  append inside an existing transaction: {a['pairs']:,} pairs after "
        f"{a['warmup_pairs']} warm-up, {a['chains']} space chains, trail already holding "
        f"{a['trail_events_before']:,} events; microseconds"
    )
    print(f"    {'':44} {'count':>6} {'p50':>9} {'p95':>9} {'p99':>9} {'max':>9} {'mean':>9}")
    rows = (
        ("tx: UPDATE only (without record)", "without"),
        ("tx: UPDATE + audit.record (with)", "with"),
        ("record() call alone", "record"),
        ("flush at commit, with (before-commit append)", "flush_with"),
        ("flush window, without (no-op baseline)", "flush_without"),
        ("per-pair difference with - without", "paired"),
    )
    for label, key in rows:
        m = a[key]
        print(
            f"    {label:44} {m['count']:>6} {fmt(m['p50']):>9} {fmt(m['p95']):>9} "
            f"{fmt(m['p99']):>9} {fmt(m['max']):>9} {fmt(m['mean']):>9}"
        )
    d = a["added"]
    print(
        f"    {'added cost = p(with) - p(without)':44} {'':>6} {fmt(d['p50']):>9} "
        f"{fmt(d['p95']):>9} {fmt(d['p99']):>9}"
    )
    print("  export (python -m buildmax audit export --output FILE, a subprocess):")
    for size, c in run["export"].items():
        print(
            f"    {int(size):>9,} events: {c['wall_s']:.2f} s wall, "
            f"{c['events_per_s']:,} events/s, {c['file_mib']} MiB file, "
            f"peak RSS {c['peak_rss_mib']} MiB, CPU {c['cpu_s']} s, "
            f"exit {c['exit']}"
        )
    g = run.get("export_growth")
    if g:
        print(
            f"    growth for {g['events']:,} more events: peak RSS {g['rss_growth_mib']:+} MiB "
            f"({g['kib_per_1000_events']:+} KiB per 1,000 events), marginal "
            f"{fmt(g['marginal_events_per_s'])} events/s"
        )
    print("  verify (python -m buildmax audit verify [FILE], a subprocess):")
    for name, c in run["verify"].items():
        extra = f" (expected {c['expected_events']:,})"
        print(
            f"    {name:24} {c['wall_s']:.2f} s wall, peak RSS {c['peak_rss_mib']} MiB, "
            f"CPU {c['cpu_s']} s, exit {c['exit']}: {c['chains_ok']} chain(s) ok, "
            f"{c['chains_broken']} broken, {c['events']:,} events{extra}"
        )
        if c["exit"] != 0 or c["chains_broken"]:
            for line in c["stdout_tail"] + c["stderr_tail"]:
                print(f"      | {line}")
    for name, c in run["export"].items():
        if c["exit"] != 0:
            print(f"    export {name} failed:")
            for line in c["stderr_tail"]:
                print(f"      | {line}")


def print_table(report: dict[str, Any]) -> None:
    print("Configuration")
    print(
        f"  events  : {report['events']:,} seeded per engine (export also at "
        f"{report['small_events']:,}); {report['appends']:,} append pairs after "
        f"{report['warmup_appends']} warm-up"
    )
    print(f"  loop    : {report['loop']}; children: {report['python']} -m buildmax ...")
    print("  versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()))
    m = report["machine"]
    print(
        f"  machine : {m['cpus']} CPUs, Linux {m['kernel']}, load average at start "
        f"{' '.join(str(x) for x in m['loadavg_at_start'])}, at end "
        f"{' '.join(str(x) for x in m['loadavg_at_end'])} (shared machine: numbers are noisy)"
    )
    base = report.get("baseline")
    if base:
        print(
            f"  baseline: `python -m buildmax plugins` peak RSS {base['peak_rss_mib']} MiB, "
            f"{base['wall_s']:.2f} s wall (imports + plugins, no database)"
        )
    if report.get("sqlite"):
        print_engine("SQLite", report["sqlite"])
    if report.get("postgresql"):
        print_engine("PostgreSQL", report["postgresql"])
    print()
    print("Verdicts")
    for v in report["verdicts"]:
        print(f"  {'PASS' if v['pass'] else 'MISS'}  {v['target']}: {v['value']}")
    print(f"\nTotal {report['total_s']} s")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="audit append cost, export and verify")
    p.add_argument(
        "--engines", default="sqlite,postgresql", help="sqlite, postgresql or both (default)"
    )
    p.add_argument(
        "--pg-url",
        default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432"),
        help="PostgreSQL server (a fresh database is created and dropped on it); "
        "default $BENCH_PG_URL or postgresql://postgres@127.0.0.1:5432",
    )
    p.add_argument("--events", type=int, default=100_000, help="events seeded (100,000)")
    p.add_argument("--small-events", type=int, default=10_000, help="the smaller export (10,000)")
    p.add_argument("--appends", type=int, default=5000, help="measured append pairs (5,000)")
    p.add_argument("--warmup-appends", type=int, default=200, help="append pairs not counted (200)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temp directory (db, exports)")
    opts = p.parse_args(argv)
    engines = {e.strip() for e in opts.engines.split(",") if e.strip()}
    if not engines or engines - {"sqlite", "postgresql"}:
        p.error("--engines: sqlite, postgresql or both")
    opts.engine_set = engines
    if not 1 <= opts.events <= 10_000_000 or not 1 <= opts.small_events <= 10_000_000:
        p.error("--events and --small-events between 1 and 10,000,000")
    if not 1 <= opts.appends <= 1_000_000 or not 0 <= opts.warmup_appends <= 100_000:
        p.error("--appends 1..1,000,000, --warmup-appends 0..100,000")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if not sys.platform.startswith("linux"):
        print("bench_audit: needs Linux (os.wait4 peak RSS)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="bench_audit-"))
    try:
        import uvloop  # noqa: F401

        loop = f"uvloop {version_of('uvloop')}"
    except ImportError:
        loop = "asyncio"
    report: dict[str, Any] = {
        "events": opts.events,
        "small_events": min(opts.small_events, opts.events),
        "appends": opts.appends,
        "warmup_appends": opts.warmup_appends,
        "loop": loop,
        "python": sys.executable,
        "versions": {
            "python": platform.python_version(),
            "buildmax": version_of("buildmax"),
            "buildmax-audit": version_of("buildmax-audit"),
            "sqlalchemy": version_of("sqlalchemy"),
            "aiosqlite": version_of("aiosqlite"),
            "databases": version_of("databases"),
            "asyncpg": version_of("asyncpg"),
            "sqlite": sqlite3.sqlite_version,
        },
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        },
    }
    try:
        report["baseline"] = run_child("baseline", buildmax_args("plugins"), workdir)
        if "sqlite" in opts.engine_set:
            report["sqlite"] = run_engine(opts, "sqlite", workdir, None)
        if "postgresql" in opts.engine_set:
            report["postgresql"] = run_postgres(opts, workdir)
    except BenchError as exc:
        print(f"bench_audit: {exc}", file=sys.stderr)
        return 1
    finally:
        if opts.keep:
            progress(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    report["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    report["bench_process_peak_rss_mib"] = round(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1
    )
    report["verdicts"] = verdicts(report)
    report["total_s"] = round(time.perf_counter() - started, 1)
    if opts.json:
        print(json.dumps(strip_private(report), indent=2, default=str))
    else:
        print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
