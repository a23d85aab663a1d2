"""Principals: the humans, agents and services that act in BuildMax."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Transaction

from .conflicts import insert_ignoring_conflict
from .ids import new_id
from .problems import NameTaken
from .tables import principals, space_members

PUBLIC_COLUMNS = (
    principals.c.id,
    principals.c.public_id,
    principals.c.kind,
    principals.c.name,
    principals.c.display_name,
    principals.c.system_role,
    principals.c.created_at,
    principals.c.disabled_at,
)


async def create_principal(
    tx: Transaction,
    *,
    kind: str,
    name: str,
    now: int,
    display_name: str = "",
    system_role: str | None = None,
    password_hash: str | None = None,
) -> dict[str, Any]:
    """Insert a principal; 409 when the name is taken."""
    row = await tx.fetch_one(
        insert_ignoring_conflict(tx.dialect, principals)
        .values(
            public_id=new_id("pr"),
            kind=kind,
            name=name,
            display_name=display_name,
            system_role=system_role,
            password_hash=password_hash,
            created_at=now,
        )
        .returning(*PUBLIC_COLUMNS)
    )
    if row is None:
        raise NameTaken(f"a principal named {name!r} already exists")
    return dict(row)


async def find_principal(conn: Transaction, ref: str) -> dict[str, Any] | None:
    """A principal by public id or name."""
    row = await conn.fetch_one(
        sa.select(*PUBLIC_COLUMNS, principals.c.password_hash)
        .where(sa.or_(principals.c.public_id == ref, principals.c.name == ref))
        .limit(1)
    )
    return dict(row) if row is not None else None


async def find_member_candidate(
    conn: Transaction, ref: str, viewer_pk: int, sees_everyone: bool
) -> dict[str, Any] | None:
    """The principal a space admin names to add or remove: by public id, any
    principal (an id is handed out deliberately and cannot be guessed); by
    name, only one ``viewer_pk`` may see: everyone when ``sees_everyone`` (a
    system admin or operator), otherwise itself and the principals it shares
    a space with. One statement, so a name out of sight is exactly as absent
    as a name nobody has."""
    mine = space_members.alias("mine")
    theirs = space_members.alias("theirs")
    shares_a_space = (
        sa.select(mine.c.space_id)
        .join(theirs, theirs.c.space_id == mine.c.space_id)
        .where(mine.c.principal_id == viewer_pk, theirs.c.principal_id == principals.c.id)
        .exists()
    )
    visible = sa.or_(sa.literal(sees_everyone), principals.c.id == viewer_pk, shares_a_space)
    row = await conn.fetch_one(
        sa.select(*PUBLIC_COLUMNS, principals.c.password_hash)
        .where(
            sa.or_(
                principals.c.public_id == ref,
                sa.and_(principals.c.name == ref, visible),
            )
        )
        .limit(1)
    )
    return dict(row) if row is not None else None


async def lock_admins(tx: Transaction) -> None:
    """Lock the enabled admins' rows until the end of ``tx``, so two
    concurrent demotions cannot each see the other admin still enabled."""
    await tx.fetch_all(
        sa.select(principals.c.id)
        .where(principals.c.system_role == "admin", principals.c.disabled_at.is_(None))
        .with_for_update()
    )


async def count_admins(tx: Transaction) -> int:
    """How many enabled system admins exist."""
    return int(
        await tx.fetch_val(
            sa.select(sa.func.count())
            .select_from(principals)
            .where(principals.c.system_role == "admin", principals.c.disabled_at.is_(None))
        )
    )
