"""API tokens: list, create (shown once), revoke, rotate."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Transaction
from quart import Blueprint, Response, request

from ..apidoc import api
from ..auth import Caller
from ..bodies import json_response
from ..current import current_buildmax
from ..idempotency import Reply, Work
from ..pagination import page_body, page_request
from ..principals import find_principal
from ..problems import Forbidden, NotFound
from ..schemas import TokenCreate, TokenIssued, TokenOut, TokenPage
from ..tables import principals, tokens
from ..tokens import issue_token, issued_body, reissue_token, revoke_token, token_body

blueprint = Blueprint("buildmax_tokens", __name__)

_TOKEN_COLUMNS = (
    tokens.c.id,
    tokens.c.public_id,
    tokens.c.name,
    tokens.c.origin,
    tokens.c.scope_type,
    tokens.c.scope_id,
    tokens.c.created_at,
    tokens.c.expires_at,
    tokens.c.revoked_at,
    tokens.c.last_used_at,
    principals.c.public_id.label("principal_public_id"),
    principals.c.id.label("principal_pk"),
)


async def _target_principal(caller: Caller, ref: str | None) -> tuple[int, str]:
    """The principal a token call is about: the caller, or (admins) anyone."""
    if ref is None or ref in (caller.actor.principal_id, caller.actor.name):
        return caller.principal_pk, caller.actor.principal_id or ""
    if not caller.is_admin:
        raise Forbidden("only a system admin manages another principal's tokens")
    async with current_buildmax().db.read() as conn:
        principal = await find_principal(conn, ref)
    if principal is None:
        raise NotFound("no such principal")
    return principal["id"], principal["public_id"]


#: The scope id of a server-wide scope (``metrics``).
SERVER_SCOPE_ID = "server"


async def _require_scope_holder(principal_pk: int, scope: str) -> None:
    """A ``metrics`` token is for a system admin or operator (it stops
    working if the principal loses that role)."""
    async with current_buildmax().db.read() as conn:
        role = await conn.fetch_val(
            sa.select(principals.c.system_role).where(principals.c.id == principal_pk)
        )
    if role not in ("admin", "operator"):
        raise Forbidden(f"a {scope} token is for a system admin or operator")


async def _visible_token(conn: Transaction, caller: Caller, token_id: str) -> dict[str, object]:
    row = await conn.fetch_one(
        sa.select(*_TOKEN_COLUMNS)
        .select_from(tokens.join(principals, principals.c.id == tokens.c.principal_id))
        .where(tokens.c.public_id == token_id)
    )
    if row is None or (row["principal_pk"] != caller.principal_pk and not caller.is_admin):
        raise NotFound("no such token")
    return dict(row)


@blueprint.get("/v1/tokens")
@api("List your tokens (admins: ?principal=)", response=TokenPage, tags=["tokens"])
async def list_tokens(caller: Caller) -> Response:
    """Newest first; revoked and expired tokens are included, marked."""
    app = current_buildmax()
    principal_pk, principal_id = await _target_principal(caller, request.args.get("principal"))
    page = page_request(key_types=(int, str))
    query = (
        sa.select(*_TOKEN_COLUMNS)
        .select_from(tokens.join(principals, principals.c.id == tokens.c.principal_id))
        .where(tokens.c.principal_id == principal_pk)
        .order_by(tokens.c.created_at.desc(), tokens.c.public_id.desc())
        .limit(page.limit + 1)
    )
    if page.after is not None:
        created, public_id = page.after
        query = query.where(
            sa.tuple_(tokens.c.created_at, tokens.c.public_id) < sa.tuple_(created, public_id)
        )
    async with app.db.read() as conn:
        rows = [dict(r) for r in await conn.fetch_all(query)]
    items = [token_body(row, principal_id) for row in rows]
    return json_response(
        page_body(items, rows, page.limit, lambda r: (r["created_at"], r["public_id"]))
    )


@blueprint.post("/v1/tokens")
@api(
    "Create a token; its secret is in this response only",
    body=TokenCreate,
    response=TokenIssued,
    status=201,
    idempotent=True,
    tags=["tokens"],
)
async def create_token(caller: Caller, data: dict[str, Any]) -> Work:
    """Admins may create tokens for other principals (for example agents)."""
    app = current_buildmax()
    principal_pk, principal_id = await _target_principal(caller, data["principal_id"])
    scope = data["scope"]
    if scope is not None:
        await _require_scope_holder(principal_pk, scope)

    async def work(tx: Transaction) -> Reply:
        now = app.clock.now_ms()
        lifetime = data["expires_in_seconds"]
        issued = await issue_token(
            tx,
            principal_pk=principal_pk,
            now=now,
            name=data["name"],
            expires_at=now + lifetime * 1000 if lifetime else None,
            scope_type=scope,
            scope_id=None if scope is None else SERVER_SCOPE_ID,
        )
        await app.audit.record(
            tx,
            caller.actor,
            "token.created",
            target_type="token",
            target_id=issued.public_id,
            details={"principal_id": principal_id, "name": data["name"]}
            | ({} if scope is None else {"scope": scope}),
        )
        return Reply(
            201, issued_body(issued, principal_id), secret_field="token", secret_kind="token"
        )

    return work


@blueprint.get("/v1/tokens/<token_id>")
@api("Show a token (never its secret)", response=TokenOut, tags=["tokens"])
async def show_token(token_id: str, caller: Caller) -> Response:
    """Your own tokens, or any token for a system admin."""
    app = current_buildmax()
    async with app.db.read() as conn:
        row = await _visible_token(conn, caller, token_id)
    return json_response(token_body(row, str(row["principal_public_id"])))


@blueprint.delete("/v1/tokens/<token_id>")
@api(
    "Revoke a token; it stops working on the next request",
    status=204,
    idempotent=True,
    tags=["tokens"],
)
async def delete_token(token_id: str, caller: Caller) -> Work:
    """Revoking an already revoked token is not an error."""
    app = current_buildmax()
    async with app.db.read() as conn:  # authorized before a replay can answer
        await _visible_token(conn, caller, token_id)

    async def work(tx: Transaction) -> Reply:
        row = await _visible_token(tx, caller, token_id)
        if await revoke_token(tx, token_id, now=app.clock.now_ms()):
            await app.audit.record(
                tx,
                caller.actor,
                "token.revoked",
                target_type="token",
                target_id=token_id,
                details={"principal_id": row["principal_public_id"]},
            )
        return Reply(204, None)

    return work


@blueprint.post("/v1/tokens/<token_id>/rotate")
@api(
    "Rotate a token: revoke it and return a twin with a new secret",
    response=TokenIssued,
    status=201,
    idempotent=True,
    tags=["tokens"],
)
async def rotate_token(token_id: str, caller: Caller) -> Work:
    """The twin keeps the name, scope and expiry; the old secret stops working."""
    app = current_buildmax()
    async with app.db.read() as conn:  # authorized before a replay can answer
        await _visible_token(conn, caller, token_id)

    async def work(tx: Transaction) -> Reply:
        row = await _visible_token(tx, caller, token_id)
        issued = await reissue_token(tx, token_id, now=app.clock.now_ms())
        if issued is None:
            raise NotFound("the token is revoked or expired; create a new one")
        await app.audit.record(
            tx,
            caller.actor,
            "token.rotated",
            target_type="token",
            target_id=issued.public_id,
            details={"principal_id": row["principal_public_id"], "replaces": token_id},
        )
        body = issued_body(issued, str(row["principal_public_id"]))
        return Reply(201, body, secret_field="token", secret_kind="token")

    return work
