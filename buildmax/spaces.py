"""Spaces, the isolation boundary, and their members."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from buildmax_hookspecs import Actor, Transaction

from .conflicts import insert_ignoring_conflict
from .ids import new_id
from .problems import Conflict, Forbidden, LastOwner, NotFound, SlugTaken
from .tables import principals, space_members, spaces

if TYPE_CHECKING:
    from .access import SpaceAccess
    from .app import BuildMax


async def space_pk(conn: Transaction, space_id: str) -> int | None:
    """A space's numeric key from its public id (``None`` when there is none)."""
    pk = await conn.fetch_val(sa.select(spaces.c.id).where(spaces.c.public_id == space_id))
    return int(pk) if pk is not None else None


async def create_space(
    tx: Transaction, *, slug: str, name: str, owner_pk: int, created_by: int, now: int
) -> dict[str, Any]:
    """Insert a space with ``owner_pk`` as its owner; 409 when the slug is taken."""
    row = await tx.fetch_one(
        insert_ignoring_conflict(tx.dialect, spaces)
        .values(public_id=new_id("sp"), slug=slug, name=name, created_at=now, created_by=created_by)
        .returning(
            spaces.c.id, spaces.c.public_id, spaces.c.slug, spaces.c.name, spaces.c.created_at
        )
    )
    if row is None:
        raise SlugTaken(f"a space with slug {slug!r} already exists")
    await tx.execute(
        space_members.insert().values(
            space_id=row["id"], principal_id=owner_pk, role="owner", created_at=now
        )
    )
    return {**row, "role": "owner"}


async def member_role(tx: Transaction, space_pk: int, principal_pk: int) -> str | None:
    """The principal's role in the space, or ``None``."""
    role: str | None = await tx.fetch_val(
        sa.select(space_members.c.role).where(
            space_members.c.space_id == space_pk, space_members.c.principal_id == principal_pk
        )
    )
    return role


async def owner_count(tx: Transaction, space_pk: int) -> int:
    """How many owners the space has (locking them on PostgreSQL)."""
    rows = await tx.fetch_all(
        sa.select(space_members.c.principal_id)
        .where(space_members.c.space_id == space_pk, space_members.c.role == "owner")
        .with_for_update()
    )
    return len(rows)


async def put_member(
    tx: Transaction, space_pk: int, principal_pk: int, role: str, now: int
) -> str | None:
    """Add a member or change its role; returns the previous role (``None`` if new)."""
    previous = await member_role(tx, space_pk, principal_pk)
    if previous is None:
        inserted = await tx.fetch_one(
            insert_ignoring_conflict(tx.dialect, space_members)
            .values(space_id=space_pk, principal_id=principal_pk, role=role, created_at=now)
            .returning(space_members.c.role)
        )
        if inserted is None:
            raise Conflict("the membership changed meanwhile; retry")
        return None
    if previous == "owner" and role != "owner" and await owner_count(tx, space_pk) <= 1:
        raise LastOwner("a space needs at least one owner")
    await tx.execute(
        sa.update(space_members)
        .where(space_members.c.space_id == space_pk, space_members.c.principal_id == principal_pk)
        .values(role=role)
    )
    return previous


async def remove_member(tx: Transaction, space_pk: int, principal_pk: int) -> str | None:
    """Remove a member; returns its role, or ``None`` if it was not one."""
    role = await member_role(tx, space_pk, principal_pk)
    if role is None:
        return None
    if role == "owner" and await owner_count(tx, space_pk) <= 1:
        raise LastOwner("a space needs at least one owner")
    await tx.execute(
        sa.delete(space_members).where(
            space_members.c.space_id == space_pk, space_members.c.principal_id == principal_pk
        )
    )
    return role


MEMBER_COLUMNS = (
    principals.c.public_id.label("principal_id"),
    principals.c.name,
    principals.c.kind,
    space_members.c.role,
    space_members.c.created_at,
)


async def rename_space(
    app: BuildMax, tx: Transaction, actor: Actor, access: SpaceAccess, name: str
) -> None:
    """Give ``access``'s space the display name ``name`` (its slug is
    permanent), audited and announced."""
    await tx.execute(sa.update(spaces).where(spaces.c.id == access.pk).values(name=name))
    await app.audit.record(
        tx,
        actor,
        "space.updated",
        space_id=access.public_id,
        target_type="space",
        target_id=access.public_id,
        details={"name": name},
        admin_override=access.admin_override,
    )
    await app.events.publish(tx, access.pk, "space.updated", {"name": name})


async def set_member(
    app: BuildMax,
    tx: Transaction,
    actor: Actor,
    access: SpaceAccess,
    target: dict[str, Any],
    role: str,
    *,
    owner_rights: bool,
) -> None:
    """Make ``target`` a member of ``access``'s space with ``role``, or change
    its role: told to the plugins (``buildmax_member_changed``), audited and
    announced when it changes, nothing when it already is so. Granting or
    taking the owner role needs ``owner_rights`` (403)."""
    _require_owner_rights(owner_rights, role, await member_role(tx, access.pk, target["id"]))
    previous = await put_member(tx, access.pk, target["id"], role, app.clock.now_ms())
    if previous == role:
        return
    await _member_changed(app, tx, actor, access, target, role, previous)
    action = "space.member.added" if previous is None else "space.member.role_changed"
    await app.audit.record(
        tx,
        actor,
        action,
        space_id=access.public_id,
        target_type="principal",
        target_id=target["public_id"],
        details={"role": role, "previous_role": previous},
        admin_override=access.admin_override,
    )
    await app.events.publish(
        tx, access.pk, "space.member.changed", {"principal_id": target["public_id"], "role": role}
    )


async def end_membership(
    app: BuildMax,
    tx: Transaction,
    actor: Actor,
    access: SpaceAccess,
    target: dict[str, Any],
    *,
    owner_rights: bool,
) -> None:
    """Remove ``target`` from ``access``'s space (404 when it is not a
    member; 409 for the last owner): told to the plugins, audited and
    announced. Removing an owner needs ``owner_rights`` (403)."""
    _require_owner_rights(owner_rights, None, await member_role(tx, access.pk, target["id"]))
    previous = await remove_member(tx, access.pk, target["id"])
    if previous is None:
        raise NotFound("the principal is not a member of this space")
    await _member_changed(app, tx, actor, access, target, None, previous)
    await app.audit.record(
        tx,
        actor,
        "space.member.removed",
        space_id=access.public_id,
        target_type="principal",
        target_id=target["public_id"],
        details={"previous_role": previous},
        admin_override=access.admin_override,
    )
    await app.events.publish(
        tx, access.pk, "space.member.changed", {"principal_id": target["public_id"], "role": None}
    )


def _require_owner_rights(owner_rights: bool, role: str | None, target_role: str | None) -> None:
    """Granting, changing or removing an owner needs an owner (or a system admin)."""
    if "owner" in (role, target_role) and not owner_rights:
        raise Forbidden("only an owner grants, changes or removes the owner role")


async def _member_changed(
    app: BuildMax,
    tx: Transaction,
    actor: Actor,
    access: SpaceAccess,
    target: dict[str, Any],
    role: str | None,
    previous: str | None,
) -> None:
    """Tell the plugins that ``target``'s membership changed
    (``buildmax_member_changed``), in the change's transaction and before
    its event is published."""
    await app.hooks.member_changed(
        tx,
        space_id=access.public_id,
        principal_id=target["public_id"],
        role=role,
        previous_role=previous,
        actor=actor,
    )
