"""Liveness, readiness and the API description."""

from __future__ import annotations

import html

import sqlalchemy as sa
from quart import Blueprint, Response

from .. import __version__
from ..apidoc import api, build_openapi
from ..bodies import json_response
from ..current import current_buildmax
from ..migrations import migration_status
from ..problems import Draining, ServiceUnavailable
from ..schemas import Health

blueprint = Blueprint("buildmax_health", __name__)

#: A database that does not answer is usually back within seconds (a
#: restart, a failover); pending migrations wait for an operator.
DATABASE_RETRY_SECONDS = 5
MIGRATIONS_RETRY_SECONDS = 30


@blueprint.get("/livez")
@api("Liveness: the process answers", response=Health, auth=False, tags=["health"])
async def livez() -> Response:
    """Always 200 while the process runs."""
    return json_response({"status": "ok", "checks": {}})


@blueprint.get("/readyz")
@api(
    "Readiness: database reachable, migrations current, not draining",
    response=Health,
    auth=False,
    tags=["health"],
)
async def readyz() -> Response:
    """200 when the database answers and no loaded plugin has pending
    migrations; 503 ``server-draining`` from the moment the process was told
    to stop (``/livez`` stays 200 meanwhile)."""
    app = current_buildmax()
    if app.drain.draining:
        raise Draining(
            "this server process is draining before it stops; send new requests elsewhere",
            retry_after=DATABASE_RETRY_SECONDS,
        )
    try:
        async with app.db.read() as conn:
            await conn.fetch_val(sa.select(sa.literal_column("1")))
        statuses = await migration_status(app.db, app.migrations())
    except Exception as exc:
        raise ServiceUnavailable(
            f"database unavailable: {exc}", retry_after=DATABASE_RETRY_SECONDS
        ) from None
    behind = [s.plugin for s in statuses if s.loaded and s.state != "current"]
    if behind:
        raise ServiceUnavailable(
            f"migrations not current for: {', '.join(behind)}",
            retry_after=MIGRATIONS_RETRY_SECONDS,
        )
    return json_response({"status": "ok", "checks": {"database": "ok", "migrations": "current"}})


@blueprint.get("/v1/openapi.json")
@api("The OpenAPI 3 document of this server", auth=False, tags=["meta"])
async def openapi() -> Response:
    """Built from the registered routes, including every plugin's."""
    return json_response(build_openapi(current_buildmax(), "BuildMax", __version__))


@blueprint.get("/docs")
async def docs() -> Response:
    """A browsable list of every route, from the OpenAPI document."""
    document = build_openapi(current_buildmax(), "BuildMax", __version__)
    rows = []
    for path, operations in document["paths"].items():
        for method, op in operations.items():
            rows.append(
                f"<tr><td><code>{method.upper()}</code></td><td><code>{html.escape(path)}</code>"
                f"</td><td>{html.escape(op.get('summary', ''))}</td></tr>"
            )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>BuildMax API</title>"
        "<style>body{font-family:sans-serif;margin:2em}td{padding:.2em .8em}"
        "tr:nth-child(odd){background:#f4f4f4}</style></head><body>"
        f"<h1>BuildMax API {html.escape(__version__)}</h1>"
        "<p>Machine-readable: <a href='/v1/openapi.json'>/v1/openapi.json</a>. "
        "Errors are <code>application/problem+json</code>.</p>"
        f"<table>{''.join(rows)}</table></body></html>"
    )
    return Response(page, content_type="text/html; charset=utf-8")
