"""The procrastinate peer for ``bench_claims.py``: claim -> finish of no-op jobs.

procrastinate is a benchmark dependency only (the ``bench`` tox environment
installs it); BuildMax never imports it. ``bench_claims.py`` runs

    python benchmarks/pq_workers.py schema --dsn DSN      # procrastinate's schema
    python benchmarks/pq_workers.py defer --dsn DSN --count N
    python benchmarks/pq_workers.py work --dsn DSN --workers W --name P

``work`` runs W procrastinate workers in this process, each with
``concurrency=1`` (one job at a time), all on one psycopg pool of W + 2
connections, on uvloop (as ``buildmax serve`` runs), until SIGTERM. Each
worker loops fetch (``procrastinate_fetch_job``: ``FOR UPDATE SKIP LOCKED``)
-> run the no-op -> finish (``procrastinate_finish_job``), keeping finished
jobs (``delete_jobs`` at its default, ``never``). LISTEN/NOTIFY is off
(``listen_notify=False``): the queue is filled before the workers start, so a
worker always finds a job, and 50 listening connections would exceed
PostgreSQL's default ``max_connections`` together with the pool; the fetch
polling interval (only used when a fetch finds nothing) is 0.05 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from typing import Any

import procrastinate

QUEUE = "bench"
TASK_NAME = "bench_noop"
DEFER_BATCH = 5_000


def make_app(dsn: str, pool_size: int) -> procrastinate.App:
    connector = procrastinate.PsycopgConnector(
        conninfo=dsn, min_size=min(pool_size, 4), max_size=pool_size
    )
    app = procrastinate.App(connector=connector)

    @app.task(name=TASK_NAME, queue=QUEUE)
    async def noop() -> None:
        return None

    return app


async def schema(dsn: str) -> None:
    app = make_app(dsn, 2)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()


async def defer(dsn: str, count: int) -> None:
    app = make_app(dsn, 2)
    task = app.tasks[TASK_NAME]
    async with app.open_async():
        left = count
        while left > 0:
            n = min(DEFER_BATCH, left)
            await task.batch_defer_async(*({} for _ in range(n)))
            left -= n


async def work(dsn: str, workers: int, name: str) -> None:
    app = make_app(dsn, workers + 2)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    options: dict[str, Any] = {
        "queues": [QUEUE],
        "concurrency": 1,
        "wait": True,
        "listen_notify": False,
        "fetch_job_polling_interval": 0.05,
        "install_signal_handlers": False,
    }
    async with app.open_async():
        running = [
            asyncio.create_task(app.run_worker_async(name=f"{name}-{i}", **options))  # type: ignore[arg-type]
            for i in range(workers)
        ]
        print(f"pq_workers {name}: {workers} workers running", file=sys.stderr, flush=True)
        await stop.wait()
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
    # Leave at once: in-flight jobs stay "doing" in a database that is dropped anyway.
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("schema", "defer", "work"))
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--name", default="pq")
    args = parser.parse_args(argv)
    if args.command == "schema":
        coro = schema(args.dsn)
    elif args.command == "defer":
        coro = defer(args.dsn, args.count)
    else:
        coro = work(args.dsn, args.workers, args.name)
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(coro)
    return 0


if __name__ == "__main__":
    sys.exit(main())
