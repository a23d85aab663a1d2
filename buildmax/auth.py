"""Who is calling: bearer tokens to :class:`Caller`, and scope checks.

Every route that needs a principal calls :func:`authenticate`, naming the
token scopes it accepts; a scoped token is refused everywhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from buildmax_hookspecs import Actor, App
from quart import g, request

from .current import current_buildmax
from .problems import TokenScopeRefused, Unauthenticated
from .tables import tokens
from .tokens import LOOKUP, SECRET_PREFIX, lookup_token, lookup_token_pk, verifier_of

if TYPE_CHECKING:
    from .app import BuildMax

log = logging.getLogger("buildmax.auth")

T = TypeVar("T")

#: The ASGI scope key of an in-process request's caller (set by
#: :mod:`buildmax.internal` only: a request from the network never has it).
ACTING_CALLER = "buildmax.acting_caller"


@dataclass(frozen=True)
class Caller:
    """An authenticated request's principal and token."""

    actor: Actor
    principal_pk: int
    token_pk: int

    @property
    def is_admin(self) -> bool:
        """System admin: acts in every space (each such action audited as an override)."""
        return self.actor.system_role == "admin"

    @property
    def is_operator(self) -> bool:
        """System operator: reads every space."""
        return self.actor.system_role == "operator"


async def authenticate(accept_scopes: Iterable[str] = ()) -> Caller:
    """The caller of the current request, or 401/403.

    ``accept_scopes`` names the scope types this route accepts in addition
    to unscoped tokens.
    """
    caller: Caller | None = g.get("buildmax_caller")
    if caller is None:
        caller = await _counting_failures(_load_caller())
        g.buildmax_caller = caller
    return _in_scope(caller, accept_scopes)


async def _load_caller() -> Caller:
    app = current_buildmax()
    acting = request.scope.get(ACTING_CALLER)
    if isinstance(acting, Caller):
        return await _reload(app, acting)
    caller, _ = await _look_up(app, bearer_secret(), LOOKUP, {})
    return caller


async def authenticate_secret(secret: str) -> Caller:
    """The caller a token ``secret`` carried some other way than the
    ``Authorization`` header names (the dashboard's session cookie), or 401;
    the same checks and failure count as a bearer token, and no scoped
    token: a session is never scoped."""
    caller, _ = await _counting_failures(_look_up(current_buildmax(), secret, LOOKUP, {}))
    return _in_scope(caller, ())


async def authenticate_reading(
    statement: Any, params: dict[str, Any], accept_scopes: Iterable[str] = ()
) -> tuple[Caller, dict[str, Any] | None]:
    """:func:`authenticate`, reading the token with ``statement`` (the token
    lookup, :data:`buildmax.tokens.LOOKUP`, with more columns joined and
    their ``params``): the route's first read comes in the same statement.
    The row is ``None`` when the caller was known already (authenticated
    earlier in this request, or an in-process request): read what you need
    then."""
    app = current_buildmax()
    if g.get("buildmax_caller") is not None or isinstance(request.scope.get(ACTING_CALLER), Caller):
        return await authenticate(accept_scopes), None
    caller, row = await _counting_failures(_look_up(app, bearer_secret(), statement, params))
    g.buildmax_caller = caller
    return _in_scope(caller, accept_scopes), row


async def _counting_failures(loading: Awaitable[T]) -> T:
    try:
        return await loading
    except Unauthenticated:
        current_buildmax().metrics.authentication_failures.labels("token").inc()
        raise


def _in_scope(caller: Caller, accept_scopes: Iterable[str]) -> Caller:
    scope = caller.actor.scope_type
    if scope is not None and scope not in set(accept_scopes):
        raise TokenScopeRefused(
            f"this token is scoped to {scope} {caller.actor.scope_id} and this route does not "
            "accept that scope"
        )
    return caller


async def _look_up(
    app: BuildMax, secret: str, statement: Any, params: dict[str, Any]
) -> tuple[Caller, dict[str, Any]]:
    """The caller the token ``secret`` names, and the row ``statement``
    read for it (by the token's verifier and ``params``)."""
    if not secret:
        raise Unauthenticated("send an API token as 'Authorization: Bearer <token>'")
    if not secret.startswith(SECRET_PREFIX) or len(secret) > 100:
        raise Unauthenticated("the token is not valid")
    async with app.db.read() as conn:
        found = await conn.fetch_one(statement, {"verifier": verifier_of(secret), **params})
    row = dict(found) if found is not None else None
    now = app.clock.now_ms()
    refusal = token_refusal(row, now)
    if refusal is not None:
        raise Unauthenticated(refusal)
    assert row is not None
    app.token_toucher.touch(row["token_pk"], row["last_used_at"], now)
    return _caller_of(row), row


async def _reload(app: BuildMax, acting: Caller) -> Caller:
    """An in-process request's caller (:mod:`buildmax.internal`), as its
    token and principal stand now: revoked, expired or disabled since the
    caller was authenticated is 401, and a changed system role counts."""
    async with app.db.read() as conn:
        row = await lookup_token_pk(conn, acting.token_pk)
    refusal = token_refusal(row, app.clock.now_ms())
    if refusal is not None:
        raise Unauthenticated(refusal)
    assert row is not None
    return _caller_of(row)


def _caller_of(row: dict[str, Any]) -> Caller:
    actor = Actor(
        principal_id=row["principal_id"],
        kind=row["kind"],
        name=row["name"],
        system_role=row["system_role"],
        token_id=row["token_id"],
        scope_type=row["scope_type"],
        scope_id=row["scope_id"],
    )
    return Caller(actor=actor, principal_pk=row["principal_pk"], token_pk=row["token_pk"])


def token_refusal(row: dict[str, object] | None, now: int) -> str | None:
    """Why a looked-up token row does not authenticate, or ``None`` if it does."""
    if row is None:
        return "the token is not valid"
    if row["revoked_at"] is not None:
        return "the token was revoked"
    expires_at = row["expires_at"]
    if isinstance(expires_at, int) and expires_at <= now:
        return "the token has expired"
    if row["disabled_at"] is not None:
        return "the principal is disabled"
    return None


async def still_authorized(app: App, secret: str, space_pk: int, caller: Caller) -> bool:
    """For long-lived responses (event streams): is the token still good and
    the caller still allowed in the space (by its current system role or
    membership)? Checked again as the response goes on, so a revocation, a
    demotion or a removal ends it."""
    from .tables import space_members

    async with app.db.read() as conn:
        row = await lookup_token(conn, secret)
        if row is None or token_refusal(row, app.clock.now_ms()) is not None:
            return False
        if row["system_role"] in ("admin", "operator"):
            return True
        role = await conn.fetch_val(
            sa.select(space_members.c.role).where(
                space_members.c.space_id == space_pk,
                space_members.c.principal_id == caller.principal_pk,
            )
        )
    return role is not None


def bearer_secret() -> str:
    """The bearer token of the current request ("" when absent)."""
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    return secret.strip() if scheme.lower() == "bearer" else ""


_TOUCH = (
    sa.update(tokens)
    .where(
        tokens.c.id == sa.bindparam("token_pk"),
        sa.or_(
            tokens.c.last_used_at.is_(None),
            tokens.c.last_used_at < sa.bindparam("older_than"),
        ),
    )
    .values(last_used_at=sa.bindparam("now"))
)


class TokenToucher:
    """Writes a token's last-used time at most once per interval.

    The write happens in the background after the request, so an
    authenticated read stays a read; the touches of a short window share one
    write transaction, so a burst of new tokens (one per claimed attempt)
    costs one transaction, not one each.
    """

    #: Seconds touches wait to be written together.
    BATCH_SECONDS = 0.2

    def __init__(self, app: object, interval_ms: int) -> None:
        self._app = app
        self._interval = interval_ms
        self._due: dict[int, int] = {}
        self._flusher: asyncio.Task[None] | None = None
        self._hurry = asyncio.Event()

    def touch(self, token_pk: int, last_used_at: int | None, now: int) -> None:
        """Schedule a write if the stored time is older than the interval."""
        if last_used_at is not None and now - last_used_at < self._interval:
            return
        if token_pk in self._due:
            return
        self._due[token_pk] = now
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._hurry.wait(), self.BATCH_SECONDS)
        await self._flush()

    async def _flush(self) -> None:
        due, self._due = self._due, {}
        if not due:
            return
        try:
            async with self._app.db.write() as tx:  # type: ignore[attr-defined]
                for token_pk, now in due.items():
                    await self._write(tx, token_pk, now)
        except Exception:
            log.exception("could not record when %d tokens were last used", len(due))

    async def _write(self, tx: Any, token_pk: int, now: int) -> None:
        await tx.execute(
            _TOUCH, {"token_pk": token_pk, "now": now, "older_than": now - self._interval}
        )

    async def drain(self) -> None:
        """Write every pending touch now (tests, shutdown)."""
        flusher = self._flusher
        if flusher is not None and not flusher.done():
            self._hurry.set()
            await flusher
        self._hurry.clear()
        await self._flush()
