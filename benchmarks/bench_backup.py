"""``buildmax backup``: what a backup costs the server it is taken from, and
what the commands need as the blob set grows.

    python benchmarks/bench_backup.py [--engine sqlite|postgres] [--agents 20]
                                      [--ready 20000] [--historical 20000]
                                      [--duration 30] [--sets 100,1024] [--json] [--keep]

**Under load.** One ``buildmax serve`` (default configuration, every
installed plugin) with ``--historical`` done and ``--ready`` ready tasks
seeded in bulk, and ``--agents`` agents looping claim-next -> renew ->
submit (``bench_claims.py``'s agent loop) for ``--duration`` seconds. A
third of the way in, ``buildmax backup create`` runs as its own process. A
prober renews one held attempt every 20 ms (a write transaction each):
the longest of its writes while the backup ran, against the longest
outside it, is the write stall the backup caused. Then the backup is
restored into an empty target (a new data directory, or a new PostgreSQL
database) and checked: no attempt without its task, no live artifact whose
blob is neither restored nor tombstoned.

**Blob sets.** For each size in ``--sets`` (MiB): a fresh server, that many
MiB uploaded as 16 MiB artifacts (the default limit), then ``backup create``
and ``backup restore`` into an empty target. Printed: each command's peak
RSS (``wait4``), the server's peak RSS while the backup ran, their
durations, and how much more the largest set needs than the smallest.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
from bench_claims import (
    Agent,
    Load,
    LoadResult,
    Sampler,
    admin_token_of,
    call,
    latency_summary,
    port_of,
    progress,
    run_async,
    seed_postgres,
    seed_sqlite,
    setup_space,
    start_server,
)
from bench_read import BenchError, run_in_scratch

MIB = 1024 * 1024
PG_SERVER = os.environ.get("BUILDMAX_BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
PROBE_INTERVAL_S = 0.02
ARTIFACT_MIB = 16


def _target_args(data_dir: Path, database_url: str | None) -> list[str]:
    args = ["--data-dir", str(data_dir)]
    return [*args, "--database-url", database_url] if database_url else args


def measured(argv: list[str]) -> dict[str, Any]:
    """Run a command; its exit status, seconds, peak RSS (MiB) and output."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    output = proc.stdout.read().decode(errors="replace")
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {
        "exit": proc.returncode,
        "seconds": round(time.perf_counter() - start, 2),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "output": output.strip().splitlines()[-1:] or [""],
    }


async def _new_database() -> str:
    from buildmax.database import servers

    return await servers.create_database(PG_SERVER, f"bmb_{uuid.uuid4().hex[:12]}")


def _migrated(url: str | None) -> str | None:
    """``url`` after ``buildmax db migrate`` (a PostgreSQL server does not migrate at start)."""
    if url is not None:
        done = subprocess.run(
            ["buildmax", "db", "migrate", "--database-url", url], capture_output=True, text=True
        )
        if done.returncode != 0:
            raise BenchError(f"buildmax db migrate failed: {done.stdout}{done.stderr}")
    return url


async def _drop_database(url: str) -> None:
    from buildmax.database import servers

    await servers.drop_database(PG_SERVER, url.rsplit("/", 1)[1])


class Prober:
    """Renews one attempt every ``PROBE_INTERVAL_S``: (start, seconds, status) each."""

    def __init__(self, base: str, space: str, token: str, project: str) -> None:
        self.base, self.space, self.token, self.project = base, space, token, project
        self.samples: list[tuple[float, float, int]] = []
        self.stop = False

    async def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        async with httpx.AsyncClient(base_url=self.base, timeout=30) as http:
            made = await http.post(
                f"/v1/spaces/{self.space}/tasks",
                headers=headers,
                json={"project": self.project, "title": "probe"},
            )
            task = made.json()["id"]
            claim = (
                await http.post(
                    f"/v1/spaces/{self.space}/tasks/{task}/claim", headers=headers, json={}
                )
            ).json()
            attempt, generation = claim["attempt"]["id"], claim["attempt"]["generation"]
            renew = {"Authorization": f"Bearer {claim['token']}"}
            path = f"/v1/spaces/{self.space}/attempts/{attempt}/renew"
            while not self.stop:
                start = time.perf_counter()
                answer = await http.post(path, headers=renew, json={"generation": generation})
                self.samples.append((start, time.perf_counter() - start, answer.status_code))
                await asyncio.sleep(PROBE_INTERVAL_S)


def under_load(opts: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    data = workdir / "data"
    url = _migrated(asyncio.run(_new_database())) if opts.engine == "postgres" else None
    restored_url = asyncio.run(_new_database()) if opts.engine == "postgres" else None
    server = start_server("server", workdir, data, url)
    try:
        token = admin_token_of(server)
        setup = setup_space(server, token, argparse.Namespace(projects=4, agents=opts.agents))
        server.stop()
        progress(f"seeding {opts.historical:,} done and {opts.ready:,} ready tasks")
        if url:
            asyncio.run(seed_postgres(url, setup, opts.historical, opts.ready))
        else:
            seed_sqlite(data / "buildmax.db", setup, opts.historical, opts.ready)
        server = start_server("server", workdir, data, url)
        agents = [Agent(n, pid, tok, port_of(server)) for n, pid, tok in setup.agents]
        prober = Prober(server.url, setup.space_id, token, setup.project_ids[0])
        load_opts = argparse.Namespace(
            warmup=3, duration=opts.duration, request_timeout=30.0, probe_interval=1.0
        )
        backup: dict[str, Any] = {}
        window: list[float] = []

        def take_backup() -> None:
            time.sleep(opts.duration / 3)
            window.append(time.perf_counter())
            argv = ["buildmax", "backup", "create", *_target_args(data, url)]
            backup.update(measured([*argv, "--output", str(workdir / "backups")]))
            window.append(time.perf_counter())

        async def go() -> LoadResult:
            probing = asyncio.create_task(prober.run())
            try:
                load = Load(agents, setup.space_id, port_of(server), setup.agents[0][2], load_opts)
                return await load.run(
                    lambda: threading.Thread(target=take_backup, daemon=True).start(), lambda: None
                )
            finally:
                prober.stop = True
                await probing

        with Sampler([server.pid]) as rss:
            load = run_async(go())
        if len(window) != 2:
            raise BenchError(
                "the backup did not finish inside the measured window: raise --duration"
            )
        server.stop()
        start, end = window
        inside = [s for t, s, _ in prober.samples if start <= t <= end]
        outside = [s for t, s, _ in prober.samples if not start <= t <= end]
        failed = sum(1 for _, _, status in prober.samples if status != 200)
        restored_dir = workdir / "restored"
        restore = measured(
            [
                "buildmax",
                "backup",
                "restore",
                str(workdir / "backups"),
                *_target_args(restored_dir, restored_url),
            ]
        )
        consistency = _consistency(restored_dir, restored_url)
    finally:
        server.stop()
        for each in (url, restored_url):
            if each:
                asyncio.run(_drop_database(each))
    errors = {k: v for k, v in load.errors.items()}
    return {
        "engine": opts.engine,
        "agents": opts.agents,
        "seeded": {"historical": opts.historical, "ready": opts.ready},
        "cycles_per_s": round(load.cycles / load.seconds, 1),
        "load_errors": errors,
        "load_statuses": {
            k: v for k, v in load.statuses.items() if not k.split()[-1].startswith("2")
        },
        "backup": backup,
        "server_peak_rss_mib": round(rss.peak[server.pid] / 1024, 1),
        "probe": {
            "writes_during_backup": len(inside),
            "longest_during_backup_ms": round(max(inside, default=0) * 1000, 1),
            "p99_during_backup_ms": latency_summary(inside).get("p99"),
            "longest_outside_ms": round(max(outside, default=0) * 1000, 1),
            "p99_outside_ms": latency_summary(outside).get("p99"),
            "failed": failed,
        },
        "restore": restore,
        "restored": consistency,
    }


def _consistency(data_dir: Path, url: str | None) -> dict[str, int]:
    """Rows of the restored database that must not exist."""
    queries = {
        "attempts_without_task": "select count(*) from task_attempts a where not exists "
        "(select 1 from task_tasks t where t.id = a.task_id)",
        "live_attempts": "select count(*) from task_attempts where state = 'active'",
        "live_artifacts_marked_lost": "select count(*) from artifact_artifacts "
        "where deleted_at is null and lost_at is not null",
    }
    if url is None:
        conn = sqlite3.connect(data_dir / "buildmax.db")
        try:
            return {k: conn.execute(q).fetchone()[0] for k, q in queries.items()}
        finally:
            conn.close()

    async def read() -> dict[str, int]:
        import asyncpg

        conn = await asyncpg.connect(url.replace("postgresql://", "postgres://", 1))
        try:
            return {k: int(await conn.fetchval(q)) for k, q in queries.items()}
        finally:
            await conn.close()

    return asyncio.run(read())


async def _upload(base: str, token: str, space: str, total_mib: int) -> int:
    """``total_mib`` MiB as 16 MiB artifacts, streamed; how many."""
    count = max(1, total_mib // ARTIFACT_MIB)
    async with httpx.AsyncClient(base_url=base, timeout=300) as http:
        for n in range(count):

            async def body(n: int = n) -> Any:
                block = os.urandom(MIB)
                for i in range(ARTIFACT_MIB):
                    yield block[:-8] + n.to_bytes(4, "big") + i.to_bytes(4, "big")

            answer = await http.post(
                f"/v1/spaces/{space}/artifacts",
                params={"name": f"blob-{n}.bin"},
                headers={
                    "Authorization": f"Bearer {token}",
                    "Content-Type": "application/octet-stream",
                    "Content-Length": str(ARTIFACT_MIB * MIB),
                },
                content=body(),
            )
            if answer.status_code != 201:
                raise BenchError(f"upload {n}: {answer.status_code} {answer.text[:200]}")
    return count


def blob_set(opts: argparse.Namespace, workdir: Path, size_mib: int) -> dict[str, Any]:
    home = workdir / f"set-{size_mib}"
    home.mkdir()
    data = home / "data"
    url = _migrated(asyncio.run(_new_database())) if opts.engine == "postgres" else None
    restored_url = asyncio.run(_new_database()) if opts.engine == "postgres" else None
    server = start_server(f"set-{size_mib}", home, data, url)
    try:
        token = admin_token_of(server)
        space = call(server, "POST", "/v1/spaces", token, {"slug": "blobs"}, 201)["id"]
        progress(f"uploading {size_mib} MiB")
        count = asyncio.run(_upload(server.url, token, space, size_mib))
        with Sampler([server.pid]) as rss:
            before = rss_now(server.pid)
            backup = measured(
                [
                    "buildmax",
                    "backup",
                    "create",
                    *_target_args(data, url),
                    "--output",
                    str(home / "bk"),
                ]
            )
        server_peak = rss.peak[server.pid] / 1024
    finally:
        server.stop()
    restore = measured(
        [
            "buildmax",
            "backup",
            "restore",
            str(home / "bk"),
            *_target_args(home / "restored", restored_url),
        ]
    )
    for each in (url, restored_url):
        if each:
            asyncio.run(_drop_database(each))
    shutil.rmtree(home / "restored", ignore_errors=True)
    return {
        "mib": size_mib,
        "blobs": count,
        "backup": backup,
        "restore": restore,
        "server_rss_before_mib": round(before / 1024, 1),
        "server_peak_rss_mib": round(server_peak, 1),
    }


def rss_now(pid: int) -> int:
    from bench_read import proc_status

    return proc_status(pid).get("VmRSS", 0)


def run(opts: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    report: dict[str, Any] = {"engine": opts.engine}
    if opts.duration:
        report["under_load"] = under_load(opts, workdir)
    report["sets"] = [blob_set(opts, workdir, size) for size in opts.sets]
    return report


def print_report(r: dict[str, Any]) -> None:
    if "under_load" in r:
        u = r["under_load"]
        p = u["probe"]
        print(
            f"\nBackup under load ({u['engine']}, {u['agents']} agents, "
            f"{u['seeded']['historical']:,} done + {u['seeded']['ready']:,} ready tasks seeded)"
        )
        errors = u["load_errors"] or "none"
        print(f"  load           {u['cycles_per_s']} claim cycles/s; errors {errors}")
        print(f"  non-2xx        {u['load_statuses'] or 'none'}")
        b = u["backup"]
        print(
            f"  backup create  exit {b['exit']}, {b['seconds']} s, "
            f"peak RSS {b['peak_rss_mib']} MiB (server peak {u['server_peak_rss_mib']} MiB)"
        )
        print(
            f"  write stall    longest probe write while the backup ran "
            f"{p['longest_during_backup_ms']} ms (p99 {p['p99_during_backup_ms']} ms, "
            f"n={p['writes_during_backup']}); outside it {p['longest_outside_ms']} ms "
            f"(p99 {p['p99_outside_ms']} ms); {p['failed']} probe writes failed"
        )
        rs = u["restore"]
        print(
            f"  restore        exit {rs['exit']}, {rs['seconds']} s, "
            f"peak RSS {rs['peak_rss_mib']} MiB; restored database: {u['restored']}"
        )
    print(f"\nBlob sets ({r['engine']})")
    print(
        "  set MiB  blobs  backup s  backup RSS  server RSS (before/peak)  restore s  restore RSS"
    )
    for s in r["sets"]:
        print(
            f"  {s['mib']:>7}  {s['blobs']:>5}  {s['backup']['seconds']:>8}  "
            f"{s['backup']['peak_rss_mib']:>7} MiB  {s['server_rss_before_mib']:>8} / "
            f"{s['server_peak_rss_mib']:<8} MiB  {s['restore']['seconds']:>9}  "
            f"{s['restore']['peak_rss_mib']:>7} MiB"
        )
    if len(r["sets"]) > 1:
        small, large = r["sets"][0], r["sets"][-1]
        for what, key in (("backup", "backup"), ("restore", "restore")):
            grew = large[key]["peak_rss_mib"] - small[key]["peak_rss_mib"]
            print(
                f"  {what} command: {large['mib']} MiB needs {grew:+.1f} MiB "
                f"over {small['mib']} MiB (bound 32)"
            )
        grew = large["server_peak_rss_mib"] - small["server_peak_rss_mib"]
        print(f"  server during backup: {grew:+.1f} MiB (bound 32)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="buildmax backup: stall under load, RSS by blob set")
    p.add_argument("--engine", choices=["sqlite", "postgres"], default="sqlite")
    p.add_argument("--agents", type=int, default=20)
    p.add_argument("--ready", type=int, default=20_000)
    p.add_argument("--historical", type=int, default=20_000)
    p.add_argument(
        "--duration", type=float, default=30, help="measured seconds under load (0: skip)"
    )
    p.add_argument("--sets", default="100,1024", help="blob set sizes in MiB, comma-separated")
    p.add_argument("--json", action="store_true")
    p.add_argument("--keep", action="store_true")
    opts = p.parse_args(argv)
    opts.sets = [int(x) for x in opts.sets.split(",") if x.strip()]
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    report = run_in_scratch("bench_backup", opts.keep, lambda workdir: run(opts, workdir))
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
