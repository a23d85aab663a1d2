"""The ceiling for ``bench_read.py``: a bare Quart JSON endpoint on Hypercorn.

One route, no database, no authentication: what Quart + Hypercorn can do
on this machine. ``bench_read.py`` starts it as

    python benchmarks/ceiling_app.py --port PORT [--graceful-timeout S]

and Hypercorn is configured the way ``buildmax serve`` configures it
(``buildmax/commands/server.py``): ``hypercorn.run.run`` with ``workers=0``
(the app runs in this process), ``worker_class="uvloop"``, no access log,
error log to stderr, every other Hypercorn setting at its default.

The route has the same shape as ``GET /v1/spaces/<space>`` so that wrk sends
byte-for-byte the same request line to both servers, and it answers a JSON
object of about the same size as BuildMax's space document.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from quart import Quart

app = Quart(__name__)


@app.get("/v1/spaces/<space>")
async def show(space: str) -> dict[str, object]:
    return {
        "id": space,
        "slug": "bench",
        "name": "bench",
        "created_at": "2025-01-01T00:00:00.000Z",
        "role": "owner",
    }


def hypercorn_config(
    host: str, port: int, graceful_timeout: float, application_path: str
) -> object:
    """The Hypercorn settings ``buildmax serve`` uses for one worker."""
    from hypercorn.config import Config as HypercornConfig

    config = HypercornConfig()
    config.application_path = application_path
    config.bind = [f"{host}:{port}"]
    config.workers = 0  # what `buildmax serve` sets for workers == 1: serve in this process
    config.worker_class = "uvloop"
    config.graceful_timeout = float(graceful_timeout)
    config.accesslog = None
    config.errorlog = "-"
    return config


def main(argv: list[str] | None = None) -> int:
    from hypercorn.run import run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--graceful-timeout", type=float, default=10.0)
    args = parser.parse_args(argv)
    if args.host != "127.0.0.1":
        parser.error("the ceiling server only listens on 127.0.0.1")
    config = hypercorn_config(
        args.host, args.port, args.graceful_timeout, f"{Path(__file__).resolve()}:app"
    )
    print(f"ceiling serving on http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    return int(run(config))  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(main())
