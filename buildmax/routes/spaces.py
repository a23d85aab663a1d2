"""Spaces and their members."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Transaction
from quart import Blueprint, Response

from ..access import SpaceAccess, require_role
from ..apidoc import api
from ..auth import Caller
from ..bodies import json_response
from ..current import current_buildmax
from ..idempotency import Reply, Work
from ..pagination import page_body, page_request
from ..principals import find_member_candidate, find_principal
from ..problems import NotFound
from ..roles import SYSTEM_ROLES
from ..schemas import (
    MEMBER_OUT,
    SPACE_OUT,
    MemberOut,
    MemberPage,
    MemberPut,
    SpaceCreate,
    SpaceOut,
    SpacePage,
    SpaceUpdate,
)
from ..spaces import MEMBER_COLUMNS, create_space, end_membership, rename_space, set_member
from ..tables import principals, space_members, spaces

blueprint = Blueprint("buildmax_spaces", __name__)


def _render(row: Any) -> dict[str, Any]:
    return SPACE_OUT.dump(row)  # type: ignore[no-any-return]


def _access_row(access: SpaceAccess) -> dict[str, Any]:
    return {
        "public_id": access.public_id,
        "slug": access.slug,
        "name": access.name,
        "created_at": access.created_at,
        "role": access.role,
    }


@blueprint.get("/v1/spaces")
@api(
    "List the spaces you are a member of (admins and operators: all)",
    response=SpacePage,
    tags=["spaces"],
)
async def list_spaces(caller: Caller) -> Response:
    """Ordered by slug; ``role`` is your membership role (``null`` if none)."""
    app = current_buildmax()
    page = page_request()
    membership = sa.and_(
        space_members.c.space_id == spaces.c.id,
        space_members.c.principal_id == caller.principal_pk,
    )
    query = (
        sa.select(
            spaces.c.public_id,
            spaces.c.slug,
            spaces.c.name,
            spaces.c.created_at,
            space_members.c.role,
        )
        .select_from(spaces.outerjoin(space_members, membership))
        .order_by(spaces.c.slug)
        .limit(page.limit + 1)
    )
    if not (caller.is_admin or caller.is_operator):
        query = query.where(space_members.c.role.is_not(None))
    if page.after is not None:
        query = query.where(spaces.c.slug > str(page.after[0]))
    async with app.db.read() as conn:
        rows = [dict(r) for r in await conn.fetch_all(query)]
    return json_response(
        page_body([_render(r) for r in rows], rows, page.limit, lambda r: (r["slug"],))
    )


@blueprint.post("/v1/spaces")
@api(
    "Create a space (admins and operators); you, or owner_id, become its owner",
    body=SpaceCreate,
    response=SpaceOut,
    status=201,
    system_roles=SYSTEM_ROLES,
    idempotent=True,
    tags=["spaces"],
)
async def create(caller: Caller, data: dict[str, Any]) -> Work:
    """The slug is unique and permanent."""
    app = current_buildmax()
    owner_pk, owner_id = caller.principal_pk, caller.actor.principal_id
    if data["owner_id"] is not None:
        async with app.db.read() as conn:
            owner = await find_principal(conn, data["owner_id"])
        if owner is None:
            raise NotFound("no such principal for owner_id")
        owner_pk, owner_id = owner["id"], owner["public_id"]

    async def work(tx: Transaction) -> Reply:
        row = await create_space(
            tx,
            slug=data["slug"],
            name=data["name"] or data["slug"],
            owner_pk=owner_pk,
            created_by=caller.principal_pk,
            now=app.clock.now_ms(),
        )
        await app.audit.record(
            tx,
            caller.actor,
            "space.created",
            space_id=row["public_id"],
            target_type="space",
            target_id=row["public_id"],
            details={"slug": row["slug"], "name": row["name"], "owner_id": owner_id},
        )
        if owner_pk != caller.principal_pk:
            row["role"] = None
        return Reply(201, _render(row))

    return work


@blueprint.get("/v1/spaces/<space>")
@api(
    "Show a space (any member)",
    response=SpaceOut,
    tags=["spaces"],
    role="viewer",
    action="space.read",
)
async def show(access: SpaceAccess) -> Response:
    """By public id or slug; 404 when you are not a member."""
    return json_response(_render(_access_row(access)))


@blueprint.patch("/v1/spaces/<space>")
@api(
    "Rename a space (space admins)",
    body=SpaceUpdate,
    response=SpaceOut,
    idempotent=True,
    role="admin",
    action="space.update",
    tags=["spaces"],
)
async def update(caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """Only the display name changes; the slug is permanent."""
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        await rename_space(app, tx, caller.actor, access, data["name"])
        return Reply(200, _render({**_access_row(access), "name": data["name"]}))

    return work


@blueprint.get("/v1/spaces/<space>/members")
@api(
    "List a space's members (any member)",
    response=MemberPage,
    tags=["spaces"],
    role="viewer",
    action="space.read",
)
async def list_members(access: SpaceAccess) -> Response:
    """Ordered by principal name."""
    app = current_buildmax()
    page = page_request()
    query = (
        sa.select(*MEMBER_COLUMNS)
        .select_from(
            space_members.join(principals, principals.c.id == space_members.c.principal_id)
        )
        .where(space_members.c.space_id == access.pk)
        .order_by(principals.c.name)
        .limit(page.limit + 1)
    )
    if page.after is not None:
        query = query.where(principals.c.name > str(page.after[0]))
    async with app.db.read() as conn:
        rows = [dict(r) for r in await conn.fetch_all(query)]
    items = [MEMBER_OUT.dump(r) for r in rows]
    return json_response(page_body(items, rows, page.limit, lambda r: (r["name"],)))


async def _member_target(caller: Caller, ref: str) -> dict[str, Any]:
    """The principal ``ref`` names (:func:`find_member_candidate`): a space
    admin cannot learn from these routes whether a name exists elsewhere on
    the server, since a name out of its sight gets the same 404 as a name
    nobody has."""
    async with current_buildmax().db.read() as conn:
        target = await find_member_candidate(
            conn, ref, caller.principal_pk, caller.is_admin or caller.is_operator
        )
    if target is None:
        raise NotFound("no such principal")
    return target


@blueprint.put("/v1/spaces/<space>/members/<principal>")
@api(
    "Add a member or change its role (space admins; only owners grant owner)",
    body=MemberPut,
    response=MemberOut,
    idempotent=True,
    role="admin",
    action="space.members.manage",
    tags=["spaces"],
)
async def put(principal: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """Putting the same role twice changes nothing; a retry with the same
    ``Idempotency-Key`` answers the first answer."""
    app = current_buildmax()
    target = await _member_target(caller, principal)
    role = data["role"]

    async def work(tx: Transaction) -> Reply:
        await set_member(
            app, tx, caller.actor, access, target, role, owner_rights=_owner_rights(access, caller)
        )
        created_at = await tx.fetch_val(
            sa.select(space_members.c.created_at).where(
                space_members.c.space_id == access.pk,
                space_members.c.principal_id == target["id"],
            )
        )
        body = MEMBER_OUT.dump(
            {
                "principal_id": target["public_id"],
                "name": target["name"],
                "kind": target["kind"],
                "role": role,
                "created_at": created_at,
            }
        )
        return Reply(200, body)

    return work


def _owner_rights(access: SpaceAccess, caller: Caller) -> bool:
    """Whether the caller grants, changes or removes owners: an owner, or a system admin."""
    return access.role == "owner" or caller.is_admin


@blueprint.delete("/v1/spaces/<space>/members/<principal>")
@api(
    "Remove a member (space admins; members may remove themselves)",
    status=204,
    idempotent=True,
    role="viewer",
    action="space.members.manage",
    tags=["spaces"],
)
async def delete(principal: str, caller: Caller, access: SpaceAccess) -> Work:
    """Any member may remove themselves; removing someone else needs the
    admin role (an owner: the owner role). The last owner cannot be removed."""
    app = current_buildmax()
    # The space is checked before the principal is looked up, so a stranger
    # cannot learn which principal names exist.
    leaving = principal in (caller.actor.principal_id, caller.actor.name)
    if not leaving:
        access = require_role(access, "admin", caller, "space.members.manage")
    target = await _member_target(caller, principal)

    async def work(tx: Transaction) -> Reply:
        # Leaving is always allowed, whatever role one holds (the last owner
        # excepted); removing someone else follows the owner rule.
        rights = leaving or _owner_rights(access, caller)
        await end_membership(app, tx, caller.actor, access, target, owner_rights=rights)
        return Reply(204, None)

    return work
