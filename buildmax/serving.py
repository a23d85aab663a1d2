"""Running the server processes: Hypercorn workers that drain on SIGTERM,
and a supervisor for several of them.

Each worker serves the app with Hypercorn (uvloop) and handles SIGTERM and
SIGINT itself: it drains (:mod:`buildmax.drain`: ``/readyz`` says
``draining``, every response closes its connection, event streams end) and
stops serving once no request is in flight, or once
``shutdown_grace_seconds`` have passed.

With ``workers > 1`` this process supervises: it opens the listening
socket, starts the workers (each a fresh interpreter sharing the socket)
and, on SIGTERM, passes the signal on and waits for every worker to finish
draining. Hypercorn's own runner stops the other workers as soon as the
first exits, dropping their requests in flight; this one never does. A
worker that dies while the server is not stopping is started again (at most
:data:`RESTARTS` times per minute, after which the server stops).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import tempfile
import time
from multiprocessing.connection import wait
from typing import Any

from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets

from .config import Config
from .logs import configure_logging
from .metrics import MULTIPROCESS_DIR

log = logging.getLogger("buildmax.serving")

#: Worker restarts allowed in :data:`RESTART_WINDOW_SECONDS` before the
#: supervisor gives up and stops the server.
RESTARTS = 5
RESTART_WINDOW_SECONDS = 60
#: Seconds a worker gets beyond the grace period to close its database and
#: exit, before the supervisor kills it.
EXIT_MARGIN_SECONDS = 10


class ListenError(Exception):
    """The server's address cannot be listened on (in use, not ours)."""


def hypercorn_config(settings: Config) -> HypercornConfig:
    """Hypercorn's configuration for ``settings``."""
    config = HypercornConfig()
    config.bind = [f"{settings.host}:{settings.port}"]
    config.workers = settings.workers
    # What is left once the drain ended (the drain itself waits for the
    # requests in flight): the time connections get to close.
    config.graceful_timeout = 1.0
    config.accesslog = None  # buildmax.requests logs each request
    config.errorlog = logging.getLogger("hypercorn.error")
    return config


def serve(settings: Config) -> int:
    """Serve until SIGTERM or SIGINT; the exit status."""
    configure_logging(settings.log_level, settings.log_format)
    config = hypercorn_config(settings)
    try:
        sockets = config.create_sockets()
    except OSError as exc:
        raise ListenError(
            f"cannot listen on {settings.host}:{settings.port}: {exc.strerror}"
        ) from None
    try:
        if settings.workers == 1:
            run_worker(config, sockets)
            return 0
        return _supervise(config, sockets, settings)
    finally:
        for sock in (*sockets.secure_sockets, *sockets.insecure_sockets):
            sock.close()


def run_worker(config: HypercornConfig, sockets: Sockets) -> None:
    """One server process: build the app from the environment and serve it
    until told to stop."""
    import uvloop

    from .asgi import served_app

    app = served_app()
    uvloop.run(_serve(app, config, sockets))


async def _serve(app: Any, config: HypercornConfig, sockets: Sockets) -> None:
    from hypercorn.app_wrappers import ASGIWrapper
    from hypercorn.asyncio.run import worker_serve

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    grace = float(app.settings.shutdown_grace_seconds)

    async def drained() -> None:
        await stop.wait()
        app.drain.begin()
        app.events.close_streams()
        log.info(
            "draining: %d request(s) in flight, up to %.0f s to finish",
            app.drain.in_flight,
            grace,
        )
        if not await app.drain.wait_idle(grace):
            log.warning(
                "the grace period ended with %d request(s) in flight: they are cut off",
                app.drain.in_flight,
            )

    await worker_serve(
        ASGIWrapper(app.drain.counting(app)), config, sockets=sockets, shutdown_trigger=drained
    )


def _supervise(config: HypercornConfig, sockets: Sockets, settings: Config) -> int:
    metrics_dir = tempfile.mkdtemp(prefix="buildmax-metrics-")
    os.environ[MULTIPROCESS_DIR] = metrics_dir
    context = multiprocessing.get_context("spawn")
    stopping = False
    deadline: float | None = None

    def start() -> Any:
        process = context.Process(target=run_worker, args=(config, sockets), daemon=False)
        process.start()
        return process

    def on_signal(signum: int, _frame: Any) -> None:
        nonlocal stopping, deadline
        if stopping:
            return
        stopping = True
        deadline = time.monotonic() + settings.shutdown_grace_seconds + EXIT_MARGIN_SECONDS
        log.info("stopping: every worker drains (up to %d s)", settings.shutdown_grace_seconds)
        for process in workers:
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    workers = [start() for _ in range(settings.workers)]
    restarts: list[float] = []
    status = 0
    try:
        while workers:
            wait([p.sentinel for p in workers], timeout=0.5)
            for process in [p for p in workers if not p.is_alive()]:
                workers.remove(process)
                _forget(process.pid)
                if stopping:
                    continue
                log.error("worker %s exited with status %s", process.pid, process.exitcode)
                now = time.monotonic()
                restarts = [t for t in restarts if now - t < RESTART_WINDOW_SECONDS]
                if len(restarts) >= RESTARTS:
                    log.error("workers keep exiting: stopping the server")
                    status = 1
                    on_signal(signal.SIGTERM, None)
                    continue
                restarts.append(now)
                workers.append(start())
            if deadline is not None and time.monotonic() > deadline:
                for process in workers:
                    log.error("worker %s did not stop in time: killed", process.pid)
                    process.kill()
                deadline = None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        shutil.rmtree(metrics_dir, ignore_errors=True)
    return status


def _forget(pid: int | None) -> None:
    """Drop a dead worker's live gauges from the shared metrics."""
    if pid is None:
        return
    from prometheus_client import multiprocess

    with contextlib.suppress(Exception):
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
