"""The per-space event stream (Server-Sent Events)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from quart import Blueprint, Response, request

from ..access import require_space
from ..apidoc import api
from ..app import current_buildmax
from ..auth import authenticate, bearer_secret, still_authorized
from ..clock import to_rfc3339
from ..events import stream
from ..inputs import INT64_MAX
from ..problems import ValidationFailed

blueprint = Blueprint("buildmax_space_events", __name__)


def _resume_point() -> int:
    raw = request.headers.get("Last-Event-ID") or request.args.get("after") or "0"
    try:
        after = int(raw)
    except ValueError:
        raise ValidationFailed(
            "Last-Event-ID must be an event id from this stream",
            errors={"Last-Event-ID": ["Not a valid integer."]},
        ) from None
    if not 0 <= after <= INT64_MAX:
        raise ValidationFailed(
            "Last-Event-ID must be an event id from this stream",
            errors={"Last-Event-ID": ["Out of range."]},
        )
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
    tags=["events"],
    content_type="text/event-stream",
)
async def events(space: str) -> Response:
    """Each event has ``id`` (its sequence in the space), ``event`` (its
    type) and ``data`` (JSON). Idle streams get a keep-alive comment."""
    app = current_buildmax()
    caller = await authenticate()
    access = await require_space(space, "viewer", caller, "space.events.read")
    after = _resume_point()
    secret = bearer_secret()

    async def body() -> AsyncIterator[bytes]:
        yield b": connected\n\n"
        keepalive = app.settings.events_keepalive_seconds
        async for rows in stream(app.events, access.pk, after, keepalive):
            # Access is checked again before every batch and every keep-alive,
            # so a revoked token or a removed member gets nothing more.
            if not await still_authorized(app, secret, access.pk, caller):
                yield b"event: access-ended\ndata: {}\n\n"
                return
            if not rows:
                yield b": keep-alive\n\n"
            for row in rows:
                yield _frame(row)

    response = Response(body(), content_type="text/event-stream")
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Accel-Buffering"] = "no"
    response.timeout = None
    return response
