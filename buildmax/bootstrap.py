"""Bootstrapping the first admin of a fresh installation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from buildmax_hookspecs import SYSTEM_ACTOR

from .database.locks import lock
from .passwords import hash_password
from .principals import count_admins, create_principal
from .tokens import IssuedToken, issue_token

if TYPE_CHECKING:
    from .app import BuildMax


class AlreadyBootstrapped(Exception):
    """An enabled admin exists already."""


async def bootstrap_admin(
    app: BuildMax, *, name: str = "admin", password: str | None = None
) -> IssuedToken:
    """Create the first admin (a human) and an API token for it.

    Refused once any enabled admin exists, so running it twice cannot mint
    a second all-powerful account by accident."""
    password_hash = await hash_password(password) if password else None
    async with app.db.write() as tx:
        await lock(tx, "bootstrap")  # two first starts at once: one admin
        if await count_admins(tx) > 0:
            raise AlreadyBootstrapped("an admin exists already; use `buildmax token create`")
        now = app.clock.now_ms()
        principal = await create_principal(
            tx,
            kind="human",
            name=name,
            display_name="Administrator",
            system_role="admin",
            password_hash=password_hash,
            now=now,
        )
        issued = await issue_token(tx, principal_pk=principal["id"], now=now, name="bootstrap")
        await app.audit.record(
            tx,
            SYSTEM_ACTOR,
            "admin.bootstrapped",
            target_type="principal",
            target_id=principal["public_id"],
            details={"name": name},
        )
        await app.audit.record(
            tx,
            SYSTEM_ACTOR,
            "token.created",
            target_type="token",
            target_id=issued.public_id,
            details={"principal_id": principal["public_id"], "name": "bootstrap"},
        )
    return issued
