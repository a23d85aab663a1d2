"""Signing a person in with a password, and out: the session tokens the
``/v1/sessions`` routes and the dashboard's sign-in form hand out."""

from __future__ import annotations

import math
from dataclasses import dataclass

import sqlalchemy as sa
from buildmax_hookspecs import Actor, Transaction

from .current import current_buildmax
from .database.locks import lock
from .passwords import verify_password
from .principals import find_principal
from .problems import TooManyRequests, Unauthenticated
from .tables import sign_in_failures
from .tokens import IssuedToken, issue_token, revoke_token


@dataclass(frozen=True)
class SignedIn:
    """A new session: its token (the only moment its secret exists) and
    the principal's public id."""

    issued: IssuedToken
    principal_id: str


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


async def sign_in(name: str, password: str, address: str) -> SignedIn:
    """A session for the human principal ``name`` whose password this is,
    signing in from the client ``address``; 401 for a wrong name or
    password, 429 (with ``Retry-After``) past the failure limits.

    Failed attempts are limited per principal name and per client address.
    The attempt is counted as a failure before the password is checked, in
    one locked transaction, so parallel guesses cannot all slip under the
    limit; a success clears the name's failures and is audited."""
    app = current_buildmax()
    now = app.clock.now_ms()
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
    ok = await verify_password(stored_hash, password)
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
            expires_at=now + app.settings.session_ttl_seconds * 1000,
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
    return SignedIn(issued, principal["public_id"])


async def sign_out(actor: Actor) -> None:
    """Revoke the token ``actor`` acts with: it stops working at once. Two
    sign-outs at once: only the one that revoked it is audited."""
    app = current_buildmax()
    async with app.db.write() as tx:
        if await revoke_token(tx, actor.token_id or "", now=app.clock.now_ms()):
            await app.audit.record(
                tx, actor, "token.revoked", target_type="token", target_id=actor.token_id
            )
