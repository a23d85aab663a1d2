"""Human sign-in with a password, and sign-out."""

from __future__ import annotations

import math
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Actor, Transaction
from quart import Blueprint, Response, g

from ..apidoc import api
from ..auth import Caller
from ..bodies import json_response
from ..current import current_buildmax
from ..database.locks import lock
from ..passwords import verify_password
from ..principals import find_principal
from ..problems import TooManyRequests, Unauthenticated
from ..schemas import SessionCreate, TokenIssued
from ..tables import sign_in_failures
from ..tokens import issue_token, issued_body, revoke_token

blueprint = Blueprint("buildmax_sessions", __name__)


async def _retry_after_ms(tx: Transaction, name: str, address: str, now: int) -> int | None:
    """How long until a sign-in for ``name`` from ``address`` is allowed
    again (ms), or ``None`` when it is allowed now.

    A failure counts while it is younger than the window, so the count
    drops below a limit of N when the N-th newest failure leaves the window;
    both limits must have room."""
    settings = current_buildmax().settings
    window = settings.sign_in_window_seconds * 1000
    waits = []
    for column, value, limit in (
        (sign_in_failures.c.name, name, settings.sign_in_max_failures_per_name),
        (sign_in_failures.c.address, address, settings.sign_in_max_failures_per_address),
    ):
        nth_newest = await tx.fetch_val(
            sa.select(sign_in_failures.c.at)
            .where(column == value, sign_in_failures.c.at > now - window)
            .order_by(sign_in_failures.c.at.desc())
            .limit(1)
            .offset(limit - 1)
        )
        if nth_newest is not None:
            waits.append(int(nth_newest) + window - now)
    return max(waits) if waits else None


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
    app = current_buildmax()
    settings = app.settings
    # The connection's address, or the client's as a trusted proxy names it.
    name, address = data["name"], g.client_address
    now = app.clock.now_ms()
    # The attempt is counted as a failure before the password is checked, in
    # one locked transaction, so parallel guesses cannot all slip under the limit.
    async with app.db.write() as tx:
        await lock(tx, "sign-in name", name)
        await lock(tx, "sign-in address", address)
        wait = await _retry_after_ms(tx, name, address, now)
        if wait is not None:
            raise TooManyRequests(
                "too many failed sign-ins; wait and try again",
                retry_after=math.ceil(wait / 1000),
            )
        await tx.execute(sign_in_failures.insert().values(name=name, address=address, at=now))
        principal = await find_principal(tx, name)
    if not (
        principal is not None
        and principal["name"] == name
        and principal["kind"] == "human"
        and principal["disabled_at"] is None
    ):
        principal = None
    stored_hash = principal["password_hash"] if principal is not None else None
    ok = await verify_password(stored_hash, data["password"])
    if principal is None or not ok:
        app.metrics.authentication_failures.labels("sign_in").inc()
        raise Unauthenticated("wrong name or password")
    async with app.db.write() as tx:
        await tx.execute(sa.delete(sign_in_failures).where(sign_in_failures.c.name == name))
        issued = await issue_token(
            tx,
            principal_pk=principal["id"],
            now=now,
            name="session",
            origin="session",
            expires_at=now + settings.session_ttl_seconds * 1000,
        )
        actor = Actor(
            principal["public_id"],
            principal["kind"],
            principal["name"],
            principal["system_role"],
            issued.public_id,
        )
        await app.audit.record(
            tx, actor, "session.created", target_type="token", target_id=issued.public_id
        )
    return json_response(issued_body(issued, principal["public_id"]), 201)


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
    app = current_buildmax()
    async with app.db.write() as tx:
        # Two sign-outs at once: only the one that revoked it is audited.
        if await revoke_token(tx, caller.actor.token_id or "", now=app.clock.now_ms()):
            await app.audit.record(
                tx,
                caller.actor,
                "token.revoked",
                target_type="token",
                target_id=caller.actor.token_id,
            )
    return Response(status=204)
