"""Space roles: the one helper every space route uses to require a role.

A principal who is not a member of a space gets 404 for everything in it,
exactly as if the space did not exist. A system admin acts in every space
(each mutation audited as an admin override); a system operator reads every
space. The ``buildmax_permission`` hook can allow or deny on top.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import ResourceRef, Transaction

from .auth import Caller, authenticate_reading
from .current import current_buildmax
from .problems import Forbidden, NotFound
from .roles import SPACE_ROLES
from .tables import principals, space_members, spaces
from .tokens import LOOKUP

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


#: The columns a space is found by, labelled as :func:`_found` reads them.
_SPACE_COLUMNS = (
    spaces.c.id.label("space_pk"),
    spaces.c.public_id.label("space_id"),
    spaces.c.slug.label("space_slug"),
    spaces.c.name.label("space_name"),
    spaces.c.created_at.label("space_created_at"),
    space_members.c.role.label("space_role"),
)
_NAMED = sa.or_(spaces.c.public_id == sa.bindparam("ref"), spaces.c.slug == sa.bindparam("ref"))

#: The space by public id or slug, with the caller's membership role.
#: Built once, so it is compiled once.
_SPACE_ACCESS = (
    sa.select(*_SPACE_COLUMNS)
    .select_from(
        spaces.outerjoin(
            space_members,
            sa.and_(
                space_members.c.space_id == spaces.c.id,
                space_members.c.principal_id == sa.bindparam("principal_pk"),
            ),
        )
    )
    .where(_NAMED)
    .limit(1)
)

#: The token lookup and, in the same statement, the space by public id or
#: slug with the token's principal's membership role (``NULL`` columns when
#: there is no such space).
_TOKEN_AND_SPACE = (
    LOOKUP.add_columns(*_SPACE_COLUMNS)
    .outerjoin(spaces, _NAMED)
    .outerjoin(
        space_members,
        sa.and_(
            space_members.c.space_id == spaces.c.id,
            space_members.c.principal_id == principals.c.id,
        ),
    )
    .limit(1)
)


def _found(row: Mapping[str, Any] | None) -> SpaceAccess | None:
    if row is None or row["space_pk"] is None:
        return None
    return SpaceAccess(
        pk=row["space_pk"],
        public_id=row["space_id"],
        slug=row["space_slug"],
        name=row["space_name"],
        created_at=row["space_created_at"],
        role=row["space_role"],
        admin_override=False,
    )


async def find_space(ref: str, caller: Caller) -> SpaceAccess | None:
    """The space named ``ref`` (public id or slug) with the caller's
    membership role, judged by no one yet; ``None`` if there is none."""
    if len(ref) > 200:
        return None
    async with current_buildmax().db.read() as conn:
        row = await conn.fetch_one(_SPACE_ACCESS, {"ref": ref, "principal_pk": caller.principal_pk})
    return _found(row)


async def caller_and_space(
    ref: str, accept_scopes: Iterable[str] = ()
) -> tuple[Caller, SpaceAccess | None]:
    """The caller (as :func:`buildmax.auth.authenticate` answers, refusals
    first) and :func:`find_space`'s answer for ``ref``, read in the same
    statement as the token when the caller is not known yet."""
    caller, row = await authenticate_reading(_TOKEN_AND_SPACE, {"ref": ref}, accept_scopes)
    if row is None:
        return caller, await find_space(ref, caller)
    return caller, _found(row)


async def require_space(ref: str, minimum: str, caller: Caller, action: str) -> SpaceAccess:
    """The space named ``ref`` (public id or slug) if the caller holds
    ``minimum`` there; otherwise 404 (not a member) or 403 (member, role too low).

    ``action`` (e.g. ``space.read``) is what ``buildmax_permission`` is asked.
    A route declares this (``@api(role=..., action=...)``) and is handed the
    answer; it calls :func:`require_role` when the role it needs depends on
    what the request names.
    """
    return require_found(await find_space(ref, caller), minimum, caller, action)


def require_found(
    found: SpaceAccess | None, minimum: str, caller: Caller, action: str
) -> SpaceAccess:
    """:func:`require_role` for a space :func:`find_space` looked for: 404
    when there was none."""
    if found is None:
        raise NotFound("no such space")
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
