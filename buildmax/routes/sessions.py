"""Human sign-in with a password, and sign-out."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, g

from .. import sessions
from ..apidoc import api
from ..auth import Caller
from ..bodies import json_response
from ..schemas import SessionCreate, TokenIssued
from ..tokens import issued_body

blueprint = Blueprint("buildmax_sessions", __name__)


@blueprint.post("/v1/sessions")
@api(
    "Sign in with name and password; returns a session token",
    body=SessionCreate,
    response=TokenIssued,
    status=201,
    auth=False,
    not_idempotent="it answers a new secret each time and there is no caller to keep a "
    "receipt for; a retry signs in again",
    tags=["sessions"],
)
async def sign_in(data: dict[str, Any]) -> Response:
    """Failed attempts are limited per principal name and per client address."""
    # The connection's address, or the client's as a trusted proxy names it.
    signed_in = await sessions.sign_in(data["name"], data["password"], g.client_address)
    return json_response(issued_body(signed_in.issued, signed_in.principal_id), 201)


@blueprint.delete("/v1/sessions/current")
@api(
    "Sign out: revoke the token of this request",
    status=204,
    not_idempotent="the token it revokes cannot authenticate a retry; signing out twice "
    "changes nothing",
    tags=["sessions"],
)
async def sign_out(caller: Caller) -> Response:
    """The token used for this request stops working immediately."""
    await sessions.sign_out(caller.actor)
    return Response(status=204)
