"""API tokens: 256-bit random secrets, stored only as SHA-256 verifiers.

A token is shown once, when it is issued. A request is authenticated by one
indexed read of its verifier, with no positive cache, so a revocation takes
effect on the next request on every server process. A token may carry a
*scope* (a resource type and id, such as an attempt); the plugin that issued
it can shorten or end every token of that scope.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Transaction

from .ids import new_id
from .tables import principals, tokens

SECRET_PREFIX = "bmx_"


_INSERT_TOKEN = (
    tokens.insert()
    .values(
        {
            name: sa.bindparam(name)
            for name in (
                "public_id",
                "principal_id",
                "verifier",
                "name",
                "origin",
                "scope_type",
                "scope_id",
                "created_at",
                "expires_at",
            )
        }
    )
    .returning(tokens.c.id)
)
_END_SCOPE = (
    sa.update(tokens)
    .where(
        tokens.c.revoked_at.is_(None),
        tokens.c.scope_type == sa.bindparam("scope_type"),
        tokens.c.scope_id == sa.bindparam("scope_id"),
    )
    .values(revoked_at=sa.bindparam("now"))
    .returning(tokens.c.id)
)


def new_secret() -> str:
    """A fresh token secret: ``bmx_`` and 256 random bits, URL-safe."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def verifier_of(secret: str) -> str:
    """The stored verifier of a secret (SHA-256, hex)."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedToken:
    """A token just issued: the only moment its secret exists."""

    pk: int
    public_id: str
    secret: str
    principal_pk: int
    name: str
    origin: str
    scope_type: str | None
    scope_id: str | None
    created_at: int
    expires_at: int | None


async def issue_token(
    tx: Transaction,
    *,
    principal_pk: int,
    now: int,
    name: str = "",
    origin: str = "api",
    scope_type: str | None = None,
    scope_id: str | None = None,
    expires_at: int | None = None,
) -> IssuedToken:
    """Create a token and return it with its secret (show it once, store nothing)."""
    if (scope_type is None) != (scope_id is None):
        raise ValueError("scope_type and scope_id go together")
    secret = new_secret()
    public_id = new_id("tk")
    pk = await tx.fetch_val(
        _INSERT_TOKEN,
        {
            "public_id": public_id,
            "principal_id": principal_pk,
            "verifier": verifier_of(secret),
            "name": name,
            "origin": origin,
            "scope_type": scope_type,
            "scope_id": scope_id,
            "created_at": now,
            "expires_at": expires_at,
        },
    )
    return IssuedToken(
        int(pk),
        public_id,
        secret,
        principal_pk,
        name,
        origin,
        scope_type,
        scope_id,
        now,
        expires_at,
    )


async def reissue_token(tx: Transaction, public_id: str, *, now: int) -> IssuedToken | None:
    """Revoke a live token and issue its twin (same principal, name, scope,
    expiry); ``None`` when the token is revoked, expired or its principal
    disabled.

    Used by rotation and by idempotent replays of a response whose secret
    nobody saw."""
    enabled = sa.select(principals.c.id).where(principals.c.disabled_at.is_(None))
    row = await tx.fetch_one(
        sa.update(tokens)
        .where(
            tokens.c.public_id == public_id,
            tokens.c.revoked_at.is_(None),
            sa.or_(tokens.c.expires_at.is_(None), tokens.c.expires_at > now),
            tokens.c.principal_id.in_(enabled),
        )
        .values(revoked_at=now)
        .returning(
            tokens.c.principal_id,
            tokens.c.name,
            tokens.c.origin,
            tokens.c.scope_type,
            tokens.c.scope_id,
            tokens.c.expires_at,
        )
    )
    if row is None:
        return None
    return await issue_token(
        tx,
        principal_pk=row["principal_id"],
        now=now,
        name=row["name"],
        origin=row["origin"],
        scope_type=row["scope_type"],
        scope_id=row["scope_id"],
        expires_at=row["expires_at"],
    )


async def _revoke_where(tx: Transaction, now: int, *conditions: Any) -> int:
    rows = await tx.fetch_all(
        sa.update(tokens)
        .where(tokens.c.revoked_at.is_(None), *conditions)
        .values(revoked_at=now)
        .returning(tokens.c.id)
    )
    return len(rows)


async def revoke_token(tx: Transaction, public_id: str, *, now: int) -> bool:
    """Revoke one token; ``False`` if it did not exist or was already revoked."""
    return await _revoke_where(tx, now, tokens.c.public_id == public_id) > 0


async def end_scope(tx: Transaction, scope_type: str, scope_id: str, *, now: int) -> int:
    """Revoke every live token scoped to ``scope_type:scope_id``; how many."""
    rows = await tx.fetch_all(
        _END_SCOPE, {"scope_type": scope_type, "scope_id": scope_id, "now": now}
    )
    return len(rows)


async def shorten_scope(tx: Transaction, scope_type: str, scope_id: str, *, expires_at: int) -> int:
    """Bring the expiry of every live token of a scope forward to ``expires_at``
    (never later than it already is); how many were changed."""
    rows = await tx.fetch_all(
        sa.update(tokens)
        .where(
            tokens.c.scope_type == scope_type,
            tokens.c.scope_id == scope_id,
            tokens.c.revoked_at.is_(None),
            sa.or_(tokens.c.expires_at.is_(None), tokens.c.expires_at > expires_at),
        )
        .values(expires_at=expires_at)
        .returning(tokens.c.id)
    )
    return len(rows)


_TOKEN_AND_PRINCIPAL = sa.select(
    tokens.c.id.label("token_pk"),
    tokens.c.public_id.label("token_id"),
    tokens.c.scope_type,
    tokens.c.scope_id,
    tokens.c.expires_at,
    tokens.c.revoked_at,
    tokens.c.last_used_at,
    principals.c.id.label("principal_pk"),
    principals.c.public_id.label("principal_id"),
    principals.c.kind,
    principals.c.name,
    principals.c.system_role,
    principals.c.disabled_at,
).select_from(tokens.join(principals, principals.c.id == tokens.c.principal_id))
#: One indexed read per request: the token, its principal, nothing cached
#: (bindparam ``verifier``). Built once, so it is compiled once; a route's
#: first read may be joined to it (:func:`buildmax.auth.authenticate_reading`).
LOOKUP = _TOKEN_AND_PRINCIPAL.where(tokens.c.verifier == sa.bindparam("verifier"))


_LOOKUP_BY_PK = _TOKEN_AND_PRINCIPAL.where(tokens.c.id == sa.bindparam("token_pk"))


async def lookup_token(conn: Transaction, secret: str) -> dict[str, Any] | None:
    """The token row joined with its principal, whatever its state, or ``None``."""
    row = await conn.fetch_one(LOOKUP, {"verifier": verifier_of(secret)})
    return dict(row) if row is not None else None


async def lookup_token_pk(conn: Transaction, token_pk: int) -> dict[str, Any] | None:
    """:func:`lookup_token` by the token's key (a caller already
    authenticated, whose token may since have been revoked)."""
    row = await conn.fetch_one(_LOOKUP_BY_PK, {"token_pk": token_pk})
    return dict(row) if row is not None else None


def token_body(row: dict[str, Any], principal_public_id: str) -> dict[str, Any]:
    """The API representation of a token row (never its secret)."""
    from .schemas import TOKEN_OUT

    scope = None
    if row.get("scope_type") is not None:
        scope = {"type": row["scope_type"], "id": row["scope_id"]}
    body: dict[str, Any] = TOKEN_OUT.dump(
        {
            "id": row["public_id"],
            "name": row["name"],
            "principal_id": principal_public_id,
            "origin": row["origin"],
            "scope": scope,
            "created_at": row["created_at"],
            "expires_at": row["expires_at"],
            "revoked_at": row.get("revoked_at"),
            "last_used_at": row.get("last_used_at"),
        }
    )
    return body


def issued_body(issued: IssuedToken, principal_public_id: str) -> dict[str, Any]:
    """The API representation of a token just issued, secret included."""
    row = {
        "public_id": issued.public_id,
        "name": issued.name,
        "origin": issued.origin,
        "scope_type": issued.scope_type,
        "scope_id": issued.scope_id,
        "created_at": issued.created_at,
        "expires_at": issued.expires_at,
    }
    body: dict[str, Any] = token_body(row, principal_public_id)
    return {**body, "token": issued.secret}
