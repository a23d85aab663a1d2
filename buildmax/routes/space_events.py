"""The per-space event stream (Server-Sent Events)."""

from __future__ import annotations

import json
from typing import Any

from marshmallow import EXCLUDE, Schema
from quart import Blueprint, Response, request

from ..access import SpaceAccess
from ..apidoc import api, header_args, query_args
from ..auth import Caller, bearer_secret, still_authorized
from ..clock import to_rfc3339
from ..current import current_buildmax
from ..events import event_stream_response
from ..inputs import INT64_MAX
from ..schemas import BoundedInteger

blueprint = Blueprint("buildmax_space_events", __name__)


def _event_id(**kwargs: Any) -> BoundedInteger:
    """An event id: a sequence number in a 64-bit column, from 1 (0: none yet)."""
    return BoundedInteger(0, INT64_MAX, text=True, **kwargs)


class ResumeQuery(Schema):
    """Where a stream resumes when no ``Last-Event-ID`` is sent."""

    class Meta:
        unknown = EXCLUDE

    after = _event_id(metadata={"description": "Send the events after this id (default 0)"})


class ResumeHeaders(Schema):
    """Where a reconnecting stream resumes (``EventSource`` sends it)."""

    class Meta:
        unknown = EXCLUDE

    last_event_id = _event_id(
        data_key="Last-Event-ID",
        metadata={"description": "The id of the last event received; wins over after"},
    )


def _resume_point() -> int:
    # Both are checked, whichever is used: a bad value is refused either way.
    after = int(query_args().get("after", 0))
    if request.headers.get("Last-Event-ID"):
        return int(header_args()["last_event_id"])
    return after


def _frame(row: dict[str, Any]) -> bytes:
    data = json.dumps(
        {
            "type": row["type"],
            "time": to_rfc3339(row["created_at"]),
            "data": json.loads(row["data"]),
        },
        separators=(",", ":"),
    )
    return f"id: {row['seq']}\nevent: {row['type']}\ndata: {data}\n\n".encode()


@blueprint.get("/v1/spaces/<space>/events")
@api(
    "Stream a space's events (text/event-stream; resume with Last-Event-ID)",
    role="viewer",
    action="space.events.read",
    tags=["events"],
    content_type="text/event-stream",
    query=ResumeQuery,
    headers=ResumeHeaders,
)
async def events(caller: Caller, access: SpaceAccess) -> Response:
    """Each event has ``id`` (its sequence in the space), ``event`` (its
    type) and ``data`` (JSON). Idle streams get a keep-alive comment."""
    app = current_buildmax()
    secret = bearer_secret()
    return event_stream_response(
        app,
        access.pk,
        _resume_point(),
        lambda: still_authorized(app, secret, access.pk, caller),
        _frame,
    )
