"""Principals: the humans, agents and services that act in BuildMax."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Actor, App, Transaction

from .conflicts import insert_ignoring_conflict
from .ids import new_id
from .problems import LastAdmin, NameTaken
from .tables import principals, space_members, tokens

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


async def change_principal(
    app: App,
    tx: Transaction,
    actor: Actor,
    target: dict[str, Any],
    data: dict[str, Any],
    password_hash: str | None,
    *,
    keep_token_pk: int,
) -> dict[str, Any]:
    """Write what ``data`` changes of ``target`` (display name, system role,
    disabled; ``password_hash`` when a new password was given), auditing
    each change; 409 ``last-admin`` when no enabled system admin would be
    left. A new password ends the principal's other sign-in sessions (all
    but the token ``keep_token_pk``). The principal's row as it stands."""
    if {"system_role", "disabled"} & set(data):
        await lock_admins(tx)
    now = app.clock.now_ms()
    values = _changes(target, data, password_hash, now)
    if values:
        await tx.execute(
            sa.update(principals).where(principals.c.id == target["id"]).values(**values)
        )
    if await count_admins(tx) == 0:
        raise LastAdmin("this would leave no enabled system admin")
    ended = []
    if password_hash is not None:
        ended = await _end_other_sessions(tx, target["id"], keep_token_pk, now)
    row = await find_principal(tx, target["public_id"])
    assert row is not None
    for action, details in _audit_actions(values, row):
        await app.audit.record(
            tx, actor, action, target_type="principal", target_id=row["public_id"], details=details
        )
    for token_id in ended:
        await app.audit.record(
            tx,
            actor,
            "token.revoked",
            target_type="token",
            target_id=token_id,
            details={"principal_id": row["public_id"]},
        )
    return row


def _changes(
    target: dict[str, Any], data: dict[str, Any], password_hash: str | None, now: int
) -> dict[str, Any]:
    """The columns that actually change."""
    values: dict[str, Any] = {}
    if "display_name" in data and data["display_name"] != target["display_name"]:
        values["display_name"] = data["display_name"]
    if password_hash is not None:
        values["password_hash"] = password_hash
    if "system_role" in data and data["system_role"] != target["system_role"]:
        values["system_role"] = data["system_role"]
    if "disabled" in data and data["disabled"] != (target["disabled_at"] is not None):
        values["disabled_at"] = now if data["disabled"] else None
    return values


async def _end_other_sessions(
    tx: Transaction, principal_pk: int, keep_token_pk: int, now: int
) -> list[str]:
    """A new password ends the principal's sign-in sessions but the current
    one; the public ids of the sessions it ended."""
    rows = await tx.fetch_all(
        sa.update(tokens)
        .where(
            tokens.c.principal_id == principal_pk,
            tokens.c.origin == "session",
            tokens.c.revoked_at.is_(None),
            tokens.c.id != keep_token_pk,
        )
        .values(revoked_at=now)
        .returning(tokens.c.public_id)
    )
    return sorted(row["public_id"] for row in rows)


def _audit_actions(values: dict[str, Any], row: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    actions: list[tuple[str, dict[str, Any]]] = []
    if "disabled_at" in values:
        actions.append(("principal.disabled" if values["disabled_at"] else "principal.enabled", {}))
    if "system_role" in values:
        actions.append(("principal.role_changed", {"system_role": row["system_role"]}))
    if "password_hash" in values:
        actions.append(("principal.password_set", {}))
    if "display_name" in values:
        actions.append(("principal.updated", {"display_name": row["display_name"]}))
    return actions
