"""Principals: who may act. Admins create and disable; operators read."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Transaction
from quart import Blueprint, Response

from ..apidoc import api
from ..auth import Caller
from ..bodies import json_response
from ..current import current_buildmax
from ..idempotency import Reply, Work
from ..pagination import page_body, page_request
from ..passwords import hash_password, verify_password
from ..principals import PUBLIC_COLUMNS, change_principal, create_principal, find_principal
from ..problems import Forbidden, NotFound, ValidationFailed
from ..roles import SYSTEM_ROLES
from ..schemas import (
    PRINCIPAL_OUT,
    PrincipalCreate,
    PrincipalOut,
    PrincipalPage,
    PrincipalUpdate,
)
from ..tables import principals

blueprint = Blueprint("buildmax_principals", __name__)


def _render(row: Any) -> dict[str, Any]:
    return PRINCIPAL_OUT.dump(row)  # type: ignore[no-any-return]


#: Body fields a receipt's fingerprint leaves out.
_PASSWORDS = ("password", "current_password")


async def _password_hash(kind: str, password: str | None) -> str | None:
    if password is None:
        return None
    if kind != "human":
        raise ValidationFailed(
            "only human principals sign in with a password",
            errors={"password": ["Only for human principals."]},
        )
    # Its length was checked with the body (schemas.PASSWORD).
    return await hash_password(password)


@blueprint.get("/v1/principals")
@api(
    "List principals (admins and operators)",
    response=PrincipalPage,
    system_roles=SYSTEM_ROLES,
    tags=["principals"],
)
async def list_principals() -> Response:
    """Ordered by name."""
    app = current_buildmax()
    page = page_request()
    query = sa.select(*PUBLIC_COLUMNS).order_by(principals.c.name).limit(page.limit + 1)
    if page.after is not None:
        query = query.where(principals.c.name > str(page.after[0]))
    async with app.db.read() as conn:
        rows = [dict(r) for r in await conn.fetch_all(query)]
    items = [_render(r) for r in rows]
    return json_response(page_body(items, rows, page.limit, lambda r: (r["name"],)))


@blueprint.post("/v1/principals")
@api(
    "Create a principal (admins)",
    body=PrincipalCreate,
    response=PrincipalOut,
    status=201,
    system_roles=["admin"],
    idempotent=True,
    secret_fields=("password",),
    tags=["principals"],
)
async def create(caller: Caller, data: dict[str, Any]) -> Work:
    """Humans may get a password (12+ characters) to sign in; agents and
    services authenticate with tokens only."""
    app = current_buildmax()
    password_hash = await _password_hash(data["kind"], data["password"])

    async def work(tx: Transaction) -> Reply:
        row = await create_principal(
            tx,
            kind=data["kind"],
            name=data["name"],
            display_name=data["display_name"],
            system_role=data["system_role"],
            password_hash=password_hash,
            now=app.clock.now_ms(),
        )
        await app.audit.record(
            tx,
            caller.actor,
            "principal.created",
            target_type="principal",
            target_id=row["public_id"],
            details={"kind": row["kind"], "name": row["name"], "system_role": row["system_role"]},
        )
        return Reply(201, _render(row))

    return work


@blueprint.get("/v1/principals/me")
@api("The principal this token belongs to", response=PrincipalOut, tags=["principals"])
async def me(caller: Caller) -> Response:
    """Who am I."""
    app = current_buildmax()
    async with app.db.read() as conn:
        row = await find_principal(conn, caller.actor.principal_id or "")
    if row is None:  # pragma: no cover - the token join just found it
        raise NotFound("no such principal")
    return json_response(_render(row))


@blueprint.get("/v1/principals/<ref>")
@api(
    "Show a principal (yourself, or anyone for admins and operators)",
    response=PrincipalOut,
    tags=["principals"],
)
async def show(ref: str, caller: Caller) -> Response:
    """By public id or name."""
    app = current_buildmax()
    async with app.db.read() as conn:
        row = await find_principal(conn, ref)
    if row is None or (
        row["id"] != caller.principal_pk and not (caller.is_admin or caller.is_operator)
    ):
        raise NotFound("no such principal")
    return json_response(_render(row))


@blueprint.patch("/v1/principals/<ref>")
@api(
    "Change a principal: display name, password, system role, disabled (admins; "
    "yourself: display name and password)",
    body=PrincipalUpdate,
    response=PrincipalOut,
    idempotent=True,
    secret_fields=_PASSWORDS,
    tags=["principals"],
)
async def update(ref: str, caller: Caller, data: dict[str, Any]) -> Work:
    """Disabling a principal stops all its tokens on the next request. Changing
    your own password needs ``current_password`` (when one is set) and ends
    your other sign-in sessions. Only what actually changes is written and
    audited."""
    return await _update(caller, data, ref)


@blueprint.patch("/v1/principals/me")
@api(
    "Change yourself: display name and password (admins: also system role, disabled)",
    body=PrincipalUpdate,
    response=PrincipalOut,
    idempotent=True,
    secret_fields=_PASSWORDS,
    tags=["principals"],
)
async def update_me(caller: Caller, data: dict[str, Any]) -> Work:
    """``PATCH /v1/principals/{ref}`` with your own id."""
    return await _update(caller, data, caller.actor.principal_id or "")


async def _update(caller: Caller, data: dict[str, Any], ref: str) -> Work:
    """The work of changing the principal ``ref``."""
    app = current_buildmax()
    async with app.db.read() as conn:
        target = await find_principal(conn, ref)
    is_self = target is not None and target["id"] == caller.principal_pk
    if target is None or not (caller.is_admin or is_self):
        raise NotFound("no such principal")
    if not caller.is_admin and ({"system_role", "disabled"} & set(data)):
        raise Forbidden("changing a system role or disabling needs the admin system role")
    if (
        "password" in data
        and is_self
        and not caller.is_admin
        and target["password_hash"]
        and not await verify_password(target["password_hash"], data.get("current_password", ""))
    ):
        raise Forbidden("current_password is missing or wrong")
    password_hash = await _password_hash(target["kind"], data.get("password"))

    async def work(tx: Transaction) -> Reply:
        row = await change_principal(
            app, tx, caller.actor, target, data, password_hash, keep_token_pk=caller.token_pk
        )
        return Reply(200, _render(row))

    return work
