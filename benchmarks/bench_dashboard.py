"""The dashboard's board and task pages in a space of 10,000 tasks: server
time per page (p50/p95/p99) and the statements each page costs.

    python benchmarks/bench_dashboard.py [--tasks 10000] [--requests 200]
                                         [--engine sqlite|postgresql|both] [--json] [--keep]

The server and its data are ``bench_mcp.py``'s (``bench_claims.py``'s
seeding): one ``buildmax serve`` with no configuration file and no
``BUILDMAX_*`` variables, a space with one project holding ``--tasks``
tasks (half done, half ready, seeded in bulk), a few member agents, and
one claimed task per agent. A person (``ada``, a space admin, with a
password) signs in through the dashboard's form; then, one request at a
time with her session cookie, ``--requests`` of each page:

- **board**: the project's board, every column (seven task-list reads);
- **board (ready)**: the ready column alone, its first page of 100;
- **task**: a claimed task's page (the task, its revisions, dependencies,
  attempts, submissions, decisions, artifacts, review work, members, the
  audit trail).

Server time is the request's own duration in the server's request log
(each request carries a known ``X-Request-Id``), which includes the
in-process API requests the page makes; the client's time is printed
beside it. Then ``serve_census.py`` serves the same data (a server per
page) and counts the statements each page sends, its in-process requests'
included.

Target (issue 22): p95 server time under 50 ms for the board and task pages.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from bench_claims import SERVE_CENSUS, latency_summary, serve_args, server_env, versions
from bench_mcp import REQUEST_LINE, served
from bench_read import HOST, BenchError, db_url, free_port, run_in_scratch, spawn, wait_ready

TARGET_P95_MS = 50.0
PASSWORD = "correct horse battery staple"
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def progress(message: str) -> None:
    print(f"[bench_dashboard] {message}", file=sys.stderr, flush=True)


def _ok(answer: httpx.Response, status: int = 200) -> Any:
    if answer.status_code != status:
        raise BenchError(
            f"{answer.request.method} {answer.request.url.path} answered "
            f"{answer.status_code} (wanted {status}): {answer.text[:300]}"
        )
    return answer.json() if answer.content else None


def prepare(url: str, admin_token: str, setup: Any) -> dict[str, str]:
    """The person (a space admin with a password) and a claimed task per agent."""
    space = setup.space_id
    with httpx.Client(base_url=url, timeout=30) as admin:
        admin.headers["Authorization"] = f"Bearer {admin_token}"
        person = _ok(
            admin.post(
                "/v1/principals", json={"kind": "human", "name": "ada", "password": PASSWORD}
            ),
            201,
        )
        _ok(admin.put(f"/v1/spaces/{space}/members/{person['id']}", json={"role": "admin"}))
        claimed = ""
        for _name, _pid, token in setup.agents:
            answer = _ok(
                admin.post(
                    f"/v1/spaces/{space}/claims",
                    json={},
                    headers={"Authorization": f"Bearer {token}"},
                ),
                201,
            )
            claimed = answer["task"]["id"]
    base = f"/ui/spaces/{space}"
    project = setup.project_ids[0]
    return {
        "board": f"{base}/projects/{project}/",
        "board (ready)": f"{base}/projects/{project}/?state=ready",
        "task": f"{base}/tasks/{claimed}",
    }


def signed_in(url: str) -> httpx.Client:
    """A client holding ada's session cookie."""
    client = httpx.Client(base_url=url, timeout=30, headers={"Accept": "text/html"})
    form = client.get("/ui/sign-in")
    found = _CSRF.search(form.text)
    if not found:
        raise BenchError(f"the sign-in form has no CSRF token: {form.status_code}")
    answer = client.post(
        "/ui/sign-in",
        data={"csrf": found.group(1), "name": "ada", "password": PASSWORD, "next": "/ui/"},
    )
    if answer.status_code != 303:
        raise BenchError(f"signing in answered {answer.status_code}: {answer.text[:300]}")
    return client


def measure(url: str, log: Any, pages: dict[str, str], requests: int) -> dict[str, dict[str, Any]]:
    """Each page ``requests`` times, one at a time (5 warm-ups not counted):
    server time from the request log, client time around each request."""
    results: dict[str, dict[str, Any]] = {}
    with contextlib.closing(signed_in(url)) as client:
        for number, (page, path) in enumerate(pages.items()):
            ids: list[str] = []
            client_s: list[float] = []
            for n in range(requests + 5):
                request_id = f"rq_bench{number}_{n:06d}"
                started = time.perf_counter()
                answer = client.get(path, headers={"X-Request-Id": request_id})
                elapsed = time.perf_counter() - started
                if answer.status_code != 200:
                    raise BenchError(f"{page} answered {answer.status_code}: {answer.text[:300]}")
                if n >= 5:
                    ids.append(request_id)
                    client_s.append(elapsed)
            results[page] = {"path": path, "ids": ids, "client": latency_summary(client_s)}
    time.sleep(0.5)  # the last request's log line
    durations: dict[str, float] = {}
    for line in log().splitlines():
        found = REQUEST_LINE.search(line)
        if found:
            durations[found.group(1)] = float(found.group(5)) / 1000
    for result in results.values():
        server_s = [durations[i] for i in result.pop("ids") if i in durations]
        result["server"] = latency_summary(server_s)
    return results


def census(
    workdir: Path, data_dir: Path, database_url: str | None, pages: dict[str, str]
) -> dict[str, Any]:
    """Statements and database time per page (``serve_census.py``, 20 of
    each, a server of its own per page: the census counts by route)."""
    shown: dict[str, Any] = {}
    for number, (page, path) in enumerate(pages.items()):
        port = free_port()
        out = workdir / f"census-dashboard-{number}.json"
        args = [sys.executable, str(SERVE_CENSUS), *serve_args(data_dir, port, database_url)[1:]]
        env = server_env() | {"BENCH_CENSUS_OUT": str(out)}
        log = workdir / f"census-dashboard-{number}.log"
        server = spawn(f"census-{number}", args, log, "", env)
        server.url = f"http://{HOST}:{port}"
        try:
            wait_ready(server, "/readyz", timeout=120)
            with contextlib.closing(signed_in(server.url)) as client:
                for _ in range(20):
                    client.get(path)
        finally:
            server.stop()
        if not out.exists():
            shown[page] = {"error": f"no census written:\n{server.log_tail()}"}
            continue
        t = json.loads(out.read_text()).get(f"GET {_route_of(path)}")
        if not t or not t["requests"]:
            shown[page] = {"error": f"no census for {_route_of(path)}"}
            continue
        n = t["requests"]
        shown[page] = {
            "requests": n,
            "statements": round(t["statements"] / n, 1),
            "db_ms": round(t["db_s"] / n * 1000, 2),
        }
    return shown


def _route_of(path: str) -> str:
    """The route template of a dashboard path (as the census keys it)."""
    parts = path.split("?")[0].split("/")
    names = {2: "", 3: "<space>"}
    if "projects" in parts:
        return "/ui/spaces/<space>/projects/<project>/"
    if "tasks" in parts:
        return "/ui/spaces/<space>/tasks/<task>"
    return "/".join(names.get(i, p) for i, p in enumerate(parts))


def run_engine(engine: str, opts: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Seed, measure and count on one engine."""
    seeding = argparse.Namespace(
        engine=engine,
        historical=opts.tasks // 2,
        ready=opts.tasks - opts.tasks // 2,
        projects=1,
        agents=opts.agents,
        pg_url=opts.pg_url,
    )
    (workdir / engine).mkdir()
    with served(seeding, workdir / engine) as it:
        pages = prepare(it.server.url, it.admin_token, it.setup)
        progress(f"{engine}: {opts.requests} requests of each page, one at a time")
        timings = measure(it.server.url, it.server.log, pages, opts.requests)
        data_dir = workdir / engine / ("sqlite-data" if engine == "sqlite" else "pg-data")
        database_url = (
            None if engine == "sqlite" else db_url(opts.pg_url, it.configuration["database"])
        )
        it.server.stop()
        counts = census(workdir / engine, data_dir, database_url, pages)
        return {"seed": it.seed, "pages": timings, "census": counts}


def print_report(report: dict[str, Any]) -> None:
    print(f"Dashboard pages at {report['tasks']:,} tasks in one project, one request at a time")
    print(f"  versions: {report['versions']}")
    for engine, result in report["engines"].items():
        print(f"\n{engine}")
        print(
            f"  {'page':<15} {'server p50':>10} {'p95':>8} {'p99':>8} {'max':>8}   "
            f"{'client p50':>10} {'p95':>8}   {'statements':>10} {'db ms':>7}"
        )
        for page, t in result["pages"].items():
            s, c = t["server"], t["client"]
            counted = result["census"].get(page, {})
            print(
                f"  {page:<15} {s['p50']:>10} {s['p95']:>8} {s['p99']:>8} {s['max']:>8}   "
                f"{c['p50']:>10} {c['p95']:>8}   {counted.get('statements', '?'):>10} "
                f"{counted.get('db_ms', '?'):>7}"
            )
    print("\nTargets (issue 22)")
    for verdict in report["verdicts"]:
        print(f"  {verdict}")


def verdicts(report: dict[str, Any]) -> list[str]:
    found = []
    for engine, result in report["engines"].items():
        for page, t in result["pages"].items():
            p95 = t["server"]["p95"]
            mark = "PASS" if p95 is not None and p95 < TARGET_P95_MS else "MISS"
            found.append(
                f"{mark}  {engine}: {page} server p95 {p95} ms (target < {TARGET_P95_MS:g})"
            )
    return found


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="the dashboard's board and task pages at 10,000 tasks")
    p.add_argument("--tasks", type=int, default=10_000, help="tasks in the project (10,000)")
    p.add_argument("--requests", type=int, default=200, help="requests of each page (200)")
    p.add_argument("--agents", type=int, default=4, help="member agents, one claim each (4)")
    p.add_argument(
        "--engine",
        default="both",
        choices=("sqlite", "postgresql", "postgres", "both"),
        help="which engine(s) (both)",
    )
    p.add_argument(
        "--pg-url",
        default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432"),
        help="the PostgreSQL server a fresh database is made on, and dropped after "
        "(default $BENCH_PG_URL or postgresql://postgres@127.0.0.1:5432)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temp directory (logs)")
    opts = p.parse_args(argv)
    if not 2 <= opts.tasks <= 2_000_000 or not 1 <= opts.requests <= 10_000:
        p.error("--tasks 2..2,000,000, --requests 1..10,000")
    if not 1 <= opts.agents <= 100:
        p.error("--agents 1..100")
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    engines = {"both": ["sqlite", "postgresql"], "postgres": ["postgresql"]}.get(
        opts.engine, [opts.engine]
    )
    started = time.perf_counter()

    def work(workdir: Path) -> dict[str, Any]:
        report: dict[str, Any] = {
            "tasks": opts.tasks,
            "requests": opts.requests,
            "versions": versions(),
            "engines": {engine: run_engine(engine, opts, workdir) for engine in engines},
        }
        report["verdicts"] = verdicts(report)
        return report

    report = run_in_scratch("bench_dashboard", opts.keep, work)
    if report is None:
        return 1
    report["whole_run_s"] = round(time.perf_counter() - started, 1)
    if opts.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print_report(report)
        print(f"Whole run: {report['whole_run_s']}s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
