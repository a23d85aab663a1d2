"""The SQLite write ceiling for ``bench_claims.py``: bare write transactions over HTTP.

The same URL shapes as BuildMax's claim-next, renew, submit and ready
routes, so ``bench_claims.py`` drives it with the same agent loop, but each
write route is one ``BEGIN IMMEDIATE; INSERT; COMMIT`` on a single aiosqlite
writer connection behind an ``asyncio.Lock`` (the shape of BuildMax's SQLite
engine, ``buildmax/database/sqlite.py``: WAL, ``synchronous = NORMAL``), with
no authentication, no audit, no validation beyond parsing the JSON body. The
ready route reads 20 rows on the event loop's own sqlite3 connection.

    python benchmarks/ceiling_write_app.py --port PORT --db PATH [--graceful-timeout S]

Hypercorn is configured as ``buildmax serve`` configures it for one worker
(see ``ceiling_app.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sqlite3
import sys
from pathlib import Path
from typing import Any

import aiosqlite
from ceiling_app import hypercorn_config
from quart import Quart, request

app = Quart(__name__)
STATE: dict[str, Any] = {}
COUNTER = itertools.count(1)


@app.before_serving
async def open_db() -> None:
    path = os.environ["BENCH_CEILING_DB"]
    writer = await aiosqlite.connect(path, isolation_level=None)
    await writer.execute_fetchall("PRAGMA journal_mode = WAL")
    await writer.execute_fetchall("PRAGMA synchronous = NORMAL")
    await writer.execute_fetchall(
        "CREATE TABLE IF NOT EXISTS events (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, "
        "ref TEXT NOT NULL, body TEXT NOT NULL, at REAL NOT NULL)"
    )
    reader = sqlite3.connect(path, isolation_level=None)
    STATE.update(writer=writer, reader=reader, lock=asyncio.Lock())


@app.after_serving
async def close_db() -> None:
    await STATE["writer"].close()
    STATE["reader"].close()


async def _write(kind: str, ref: str) -> int:
    body = await request.get_json(force=True, silent=True)
    writer: aiosqlite.Connection = STATE["writer"]
    async with STATE["lock"]:
        await writer.execute_fetchall("BEGIN IMMEDIATE")
        try:
            rows = await writer.execute_fetchall(
                "INSERT INTO events (kind, ref, body, at) VALUES (?, ?, ?, julianday('now')) "
                "RETURNING id",
                (kind, ref, repr(body)),
            )
            await writer.execute_fetchall("COMMIT")
        except BaseException:
            await writer.execute_fetchall("ROLLBACK")
            raise
    return int(next(iter(rows))[0])


@app.post("/v1/spaces/<space>/claims")
async def claim(space: str) -> tuple[dict[str, Any], int]:
    attempt = f"at_{next(COUNTER)}"
    pk = await _write("claim", attempt)
    return {
        "task": {"id": f"ta_{pk}", "state": "claimed"},
        "attempt": {"id": attempt, "generation": 1},
        "token": "bmx_ceiling",
        "token_id": "tk_ceiling",
        "skipped": 0,
    }, 201


@app.post("/v1/spaces/<space>/attempts/<attempt>/renew")
async def renew(space: str, attempt: str) -> tuple[dict[str, Any], int]:
    await _write("renew", attempt)
    return {"id": attempt, "generation": 1, "state": "active"}, 200


@app.post("/v1/spaces/<space>/attempts/<attempt>/submit")
async def submit(space: str, attempt: str) -> tuple[dict[str, Any], int]:
    pk = await _write("submit", attempt)
    return {"submission": {"id": f"su_{pk}"}, "task": {"state": "done"}}, 201


@app.get("/v1/spaces/<space>/ready")
async def ready(space: str) -> dict[str, Any]:
    rows = (
        STATE["reader"]
        .execute("SELECT id, kind, ref FROM events ORDER BY id DESC LIMIT 20")
        .fetchall()
    )
    return {"items": [{"id": r[0], "kind": r[1], "ref": r[2]} for r in rows], "next_cursor": None}


def main(argv: list[str] | None = None) -> int:
    from hypercorn.run import run

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--db", required=True, help="SQLite file (created)")
    parser.add_argument("--graceful-timeout", type=float, default=10.0)
    args = parser.parse_args(argv)
    if args.host != "127.0.0.1":
        parser.error("the ceiling server only listens on 127.0.0.1")
    # Hypercorn imports this file again by path: hand the setting over the environment.
    os.environ["BENCH_CEILING_DB"] = str(Path(args.db).resolve())
    config = hypercorn_config(
        args.host, args.port, args.graceful_timeout, f"{Path(__file__).resolve()}:app"
    )
    print(f"write ceiling serving on http://{args.host}:{args.port}", file=sys.stderr, flush=True)
    return int(run(config))  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(main())
