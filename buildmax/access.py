"""Space roles: the one helper every space route uses to require a role.

A principal who is not a member of a space gets 404 for everything in it,
exactly as if the space did not exist. A system admin acts in every space
(each mutation audited as an admin override); a system operator reads every
space. The ``buildmax_permission`` hook can allow or deny on top.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import sqlalchemy as sa
from buildmax_hookspecs import ResourceRef, Transaction

from .auth import Caller
from .current import current_buildmax
from .problems import Forbidden, NotFound
from .roles import SPACE_ROLES
from .tables import space_members, spaces

_RANK = {role: rank for rank, role in enumerate(SPACE_ROLES)}


def role_at_least(role: str | None, minimum: str) -> bool:
    """True when ``role`` is ``minimum`` or above."""
    return role is not None and _RANK[role] >= _RANK[minimum]


@dataclass(frozen=True)
class SpaceAccess:
    """A space the caller may act in, and on what grounds."""

    pk: int
    public_id: str
    slug: str
    name: str
    created_at: int
    role: str | None
    admin_override: bool


#: The space by public id or slug, with the caller's membership role.
#: Built once, so it is compiled once.
_SPACE_ACCESS = (
    sa.select(
        spaces.c.id,
        spaces.c.public_id,
        spaces.c.slug,
        spaces.c.name,
        spaces.c.created_at,
        space_members.c.role,
    )
    .select_from(
        spaces.outerjoin(
            space_members,
            sa.and_(
                space_members.c.space_id == spaces.c.id,
                space_members.c.principal_id == sa.bindparam("principal_pk"),
            ),
        )
    )
    .where(sa.or_(spaces.c.public_id == sa.bindparam("ref"), spaces.c.slug == sa.bindparam("ref")))
    .limit(1)
)


async def require_space(ref: str, minimum: str, caller: Caller, action: str) -> SpaceAccess:
    """The space named ``ref`` (public id or slug) if the caller holds
    ``minimum`` there; otherwise 404 (not a member) or 403 (member, role too low).

    ``action`` (e.g. ``space.read``) is what ``buildmax_permission`` is asked.
    A route declares this (``@api(role=..., action=...)``) and is handed the
    answer; it calls :func:`require_role` when the role it needs depends on
    what the request names.
    """
    app = current_buildmax()
    if len(ref) > 200:
        raise NotFound("no such space")
    async with app.db.read() as conn:
        row = await conn.fetch_one(_SPACE_ACCESS, {"ref": ref, "principal_pk": caller.principal_pk})
    if row is None:
        raise NotFound("no such space")
    found = SpaceAccess(
        pk=row["id"],
        public_id=row["public_id"],
        slug=row["slug"],
        name=row["name"],
        created_at=row["created_at"],
        role=row["role"],
        admin_override=False,
    )
    return require_role(found, minimum, caller, action)


def require_role(access: SpaceAccess, minimum: str, caller: Caller, action: str) -> SpaceAccess:
    """``access`` if the caller may take ``action`` with ``minimum`` there:
    the space's role, a plugin's permission (``buildmax_permission``), a
    system admin's override (``admin_override`` set) or an operator's read;
    otherwise 404 (not a member) or 403 (a member whose role is too low)."""
    resource = ResourceRef(type="space", id=access.public_id, space_id=access.public_id)
    opinions = current_buildmax().hooks.permission(caller.actor, action, resource)
    override = False
    if False in opinions:
        allowed = False
    elif True in opinions or role_at_least(access.role, minimum):
        allowed = True
    elif caller.is_admin:
        allowed, override = True, True
    else:
        allowed = caller.is_operator and minimum == "viewer"
    if not allowed:
        if access.role is None and not caller.is_operator and not caller.is_admin:
            raise NotFound("no such space")
        raise Forbidden(f"this needs the {minimum} role in the space")
    return access if access.admin_override == override else replace(access, admin_override=override)


#: The caller's role in the space, share-locked (on PostgreSQL) until the
#: transaction ends.
_ROLE_HELD = (
    sa.select(space_members.c.role)
    .where(
        space_members.c.space_id == sa.bindparam("space_pk"),
        space_members.c.principal_id == sa.bindparam("principal_pk"),
    )
    .with_for_update(read=True)
)


async def recheck_space(tx: Transaction, access: SpaceAccess, caller: Caller, minimum: str) -> None:
    """In the write transaction of a route that :func:`require_space` let in
    before it read its body: the role that let the caller in is still held,
    else 404 (no longer a member) or 403 (a lower role), as ``require_space``
    answers. A body can take as long as its sender likes, and a membership
    removed or lowered meanwhile must not be acted on. The membership row
    stays share-locked until ``tx`` ends, so a removal or demotion running
    now waits for this write and then sees what it wrote. Access that the
    role did not give (a system admin's override, a plugin's permission)
    is not rechecked."""
    if not role_at_least(access.role, minimum) or caller.is_admin:
        return
    role = await tx.fetch_val(
        _ROLE_HELD, {"space_pk": access.pk, "principal_pk": caller.principal_pk}
    )
    if role_at_least(role, minimum):
        return
    if role is None:
        raise NotFound("no such space")
    raise Forbidden(f"this needs the {minimum} role in the space")
