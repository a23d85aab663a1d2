"""What operators watch: ``/metrics``, diagnostics and each space's attention list."""

from __future__ import annotations

from quart import Blueprint, Response

from .. import __version__
from ..access import SpaceAccess
from ..apidoc import api
from ..auth import Caller
from ..bodies import json_response
from ..current import current_buildmax
from ..diagnostics import read, render_attention, render_gauge, visible
from ..metrics import CONTENT_TYPE, gauge_families
from ..problems import Forbidden, NotFound
from ..schemas import AttentionList, Diagnostics

blueprint = Blueprint("buildmax_operations", __name__)

#: The token scope type that reads ``/metrics`` (and nothing else).
METRICS_SCOPE = "metrics"


@blueprint.get("/metrics")
@api(
    "Prometheus metrics (a metrics-scoped token of a system admin or operator)",
    scopes=[METRICS_SCOPE],
    content_type=CONTENT_TYPE.split(";")[0],
    tags=["operations"],
)
async def metrics(caller: Caller) -> Response:
    """Counters and histograms of every server process, then the state of
    the data read now. Only a token created with ``scope=metrics`` reads
    it, and only while its principal is a system admin or operator."""
    app = current_buildmax()
    if not app.metrics.enabled:
        raise NotFound("metrics are off on this server (metrics = false)")
    if caller.actor.scope_type != METRICS_SCOPE:
        raise Forbidden("/metrics needs a token created with scope=metrics")
    if not (caller.is_admin or caller.is_operator):
        raise Forbidden("a metrics token works while its principal is a system admin or operator")
    reading = await read(app)
    families = gauge_families((g.name, g.help, g.value, g.labels) for g in reading.gauges)
    return Response(app.metrics.exposition(families), content_type=CONTENT_TYPE)


@blueprint.get("/v1/diagnostics")
@api(
    "The server's facts and attention list (system admins and operators)",
    response=Diagnostics,
    system_roles=["admin", "operator"],
    tags=["operations"],
)
async def diagnostics() -> Response:
    """Free disk against the reserve, the database, the last backup, the
    plugins' facts, and what needs a person now in every space."""
    app = current_buildmax()
    reading = await read(app)
    return json_response(
        {
            "generated_at": reading.now,
            "server": {
                "version": __version__,
                "engine": app.db.dialect,
                "workers": app.settings.workers,
                "draining": app.drain.draining,
                "in_flight": app.drain.in_flight,
            },
            "facts": [render_gauge(g) for g in reading.gauges],
            "attention": [render_attention(i, reading.slugs) for i in reading.attention],
        }
    )


@blueprint.get("/v1/spaces/<space>/attention")
@api(
    "What needs a person in this space, as far as your role sees",
    response=AttentionList,
    role="viewer",
    action="space.attention.read",
    tags=["operations"],
)
async def attention(caller: Caller, access: SpaceAccess) -> Response:
    """Each item names the least space role that sees it: a viewer sees
    less than a member, a member less than an admin."""
    app = current_buildmax()
    reading = await read(app, space_pk=access.pk, gauges=False)
    items = visible(reading.attention, access.role, sees_all=caller.is_admin or caller.is_operator)
    return json_response(
        {
            "generated_at": reading.now,
            "items": [render_attention(i, reading.slugs) for i in items],
        }
    )
