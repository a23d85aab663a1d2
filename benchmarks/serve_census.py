"""``buildmax serve`` that counts SQL statements and database time per route.

For ``bench_claims.py --profile`` and ``bench_dashboard.py``: they send
requests one at a time to this server and print, per route, statements per
request (a request made in-process by another, as the dashboard's pages and
MCP tool calls make them, counts toward that request too), the time spent awaiting the database
(statement compile + execution + the thread hop on SQLite) and the time in
the route handler. Counting wraps ``buildmax.database.base.Tx.execute`` and
``Tx.fetch_all`` (every statement kernel and plugin code runs goes through
them; SQLite's BEGIN IMMEDIATE / COMMIT do not and are not counted) and
``Quart.full_dispatch_request``. Nothing else changes; the numbers are
written as JSON to ``$BENCH_CENSUS_OUT`` when the server exits.

    BENCH_CENSUS_OUT=census.json python benchmarks/serve_census.py serve --data-dir ... --port ...
"""

from __future__ import annotations

import atexit
import contextvars
import json
import os
import sys
import time
from collections import defaultdict
from typing import Any

from quart import Quart, request

from buildmax.database.base import Tx

ROUTE: contextvars.ContextVar[dict[str, float] | None] = contextvars.ContextVar(
    "bench_census_route", default=None
)
TOTALS: dict[str, dict[str, Any]] = defaultdict(
    lambda: {
        "requests": 0,
        "statements": 0,
        "db_s": 0.0,
        "handler_s": 0.0,
        "shapes": defaultdict(int),
        "shape_s": defaultdict(float),
    }
)

_execute, _fetch_all = Tx.execute, Tx.fetch_all
_dispatch = Quart.full_dispatch_request


def shape(statement: Any) -> str:
    """The statement's SQL up to its WHERE clause, whitespace collapsed (a label)."""
    text = " ".join(str(statement).split())
    for word in (" WHERE ", " VALUES ", " SET "):
        text = text.split(word)[0]
    if text.startswith("SELECT "):
        text = "SELECT ... FROM " + text.partition(" FROM ")[2] if " FROM " in text else text
    return text[:110]


def _count(counter: dict[str, Any] | None, statement: Any, start: float) -> None:
    if counter is None:
        return
    spent = time.perf_counter() - start
    counter["db_s"] += spent
    counter["statements"] += 1
    # Labelling compiles the statement once more: kept out of the handler time.
    labelled = time.perf_counter()
    label = shape(statement)
    counter["shapes"][label] += 1
    counter["shape_s"][label] += spent
    counter["overhead_s"] += time.perf_counter() - labelled


async def execute(self: Tx, statement: Any, params: Any = None) -> None:
    counter = ROUTE.get()
    start = time.perf_counter()
    try:
        await _execute(self, statement, params)
    finally:
        _count(counter, statement, start)


async def fetch_all(self: Tx, statement: Any, params: Any = None) -> Any:
    counter = ROUTE.get()
    start = time.perf_counter()
    try:
        return await _fetch_all(self, statement, params)
    finally:
        _count(counter, statement, start)


async def full_dispatch_request(self: Quart, request_context: Any = None) -> Any:
    rule = request.url_rule.rule if request.url_rule is not None else request.path
    totals = TOTALS[f"{request.method} {rule}"]
    counter: dict[str, Any] = {
        "statements": 0,
        "db_s": 0.0,
        "overhead_s": 0.0,
        "shapes": defaultdict(int),
        "shape_s": defaultdict(float),
    }
    # A request made in-process by another (the dashboard's pages, an MCP
    # tool call) also counts toward the request that made it.
    outer = ROUTE.get()
    token = ROUTE.set(counter)
    start = time.perf_counter()
    try:
        return await _dispatch(self, request_context)
    finally:
        ROUTE.reset(token)
        if outer is not None:
            outer["statements"] += counter["statements"]
            outer["db_s"] += counter["db_s"]
            outer["overhead_s"] += counter["overhead_s"]
            for key, n in counter["shapes"].items():
                outer["shapes"][key] += n
                outer["shape_s"][key] += counter["shape_s"][key]
        totals["requests"] += 1
        totals["statements"] += counter["statements"]
        totals["db_s"] += counter["db_s"]
        totals["handler_s"] += time.perf_counter() - start - counter["overhead_s"]
        for key, n in counter["shapes"].items():
            totals["shapes"][key] += n
            totals["shape_s"][key] += counter["shape_s"][key]


def _write() -> None:
    out = os.environ.get("BENCH_CENSUS_OUT")
    if out:
        with open(out, "w") as fh:
            json.dump(TOTALS, fh, indent=2)


Tx.execute = execute  # type: ignore[method-assign]
Tx.fetch_all = fetch_all  # type: ignore[method-assign]
Quart.full_dispatch_request = full_dispatch_request  # type: ignore[method-assign]
atexit.register(_write)

if __name__ == "__main__":
    from buildmax.cli import main

    sys.argv[0] = "buildmax"
    main()
