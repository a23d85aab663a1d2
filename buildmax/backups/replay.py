"""What a restore re-applies of the kernel's actions recorded after its
backup (``--audit-export``): whatever took a right away, so the restore does
not give it back. A revoked token stays revoked (with ``--keep-tokens``; a
rotated token's predecessor too), a
disabled principal disabled, a changed system role changed, a removed
member removed, a changed member role changed; a password changed after the
backup is cleared (the backup's hash would let the old password in again:
the principal signs in once more after an admin sets it). Each re-applied
change is audited as the system's; what cannot be re-applied (the target is
not in the backup, or it would leave no admin) is reported, never guessed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from buildmax_hookspecs import SYSTEM_ACTOR, AuditEvent, Transaction

from ..access import SpaceAccess
from ..principals import change_principal, find_principal
from ..problems import LastAdmin, Problem
from ..spaces import end_membership, set_member
from ..tables import principals, spaces, tokens

if TYPE_CHECKING:
    from ..app import BuildMax

#: The kernel actions a restore re-applies.
REPLAYED = frozenset(
    {
        "token.revoked",
        "token.rotated",
        "principal.disabled",
        "principal.role_changed",
        "principal.password_set",
        "space.member.removed",
        "space.member.role_changed",
    }
)


async def _access(tx: Transaction, space_id: str | None) -> SpaceAccess | None:
    if space_id is None:
        return None
    row = await tx.fetch_one(sa.select(spaces).where(spaces.c.public_id == space_id))
    if row is None:
        return None
    return SpaceAccess(
        row["id"], row["public_id"], row["slug"], row["name"], row["created_at"], None, True
    )


async def _apply(app: BuildMax, tx: Transaction, event: AuditEvent, now: int) -> str | None:
    """Re-apply one event; a line saying what was done, or why not."""
    target = event.target_id or ""
    if event.action == "token.rotated":
        # The twin is not in the backup; the token it replaced must not work.
        target = str(event.details.get("replaces") or "")
    if event.action in ("token.revoked", "token.rotated"):
        done = await tx.fetch_all(
            sa.update(tokens)
            .where(tokens.c.public_id == target, tokens.c.revoked_at.is_(None))
            .values(revoked_at=now)
            .returning(tokens.c.id)
        )
        if done:
            await app.audit.record(
                tx,
                SYSTEM_ACTOR,
                "token.revoked",
                target_type="token",
                target_id=target,
                details={"principal_id": event.details.get("principal_id")},
            )
            return f"token {target} revoked again"
        return None
    principal = await find_principal(tx, target)
    if principal is None:
        return f"{event.action} of {target}: not in the backup, nothing to re-apply"
    if event.action == "principal.password_set":
        await tx.execute(
            sa.update(principals)
            .where(principals.c.id == principal["id"])
            .values(password_hash=None)
        )
        await app.audit.record(
            tx,
            SYSTEM_ACTOR,
            "principal.password_cleared",
            target_type="principal",
            target_id=target,
        )
        return (
            f"the password of {principal['name']} changed after the backup: cleared, set it again"
        )
    if event.action in ("principal.disabled", "principal.role_changed"):
        data: dict[str, Any] = (
            {"disabled": True}
            if event.action == "principal.disabled"
            else {"system_role": event.details.get("system_role")}
        )
        try:
            await change_principal(app, tx, SYSTEM_ACTOR, principal, data, None, keep_token_pk=-1)
        except LastAdmin:
            return f"{event.action} of {principal['name']} not re-applied: no admin would be left"
        return f"{event.action} of {principal['name']} re-applied"
    access = await _access(tx, event.space_id)
    if access is None:
        return f"{event.action} of {principal['name']}: its space is not in the backup"
    try:
        if event.action == "space.member.removed":
            await end_membership(app, tx, SYSTEM_ACTOR, access, principal, owner_rights=True)
        else:
            role = str(event.details.get("role"))
            await set_member(app, tx, SYSTEM_ACTOR, access, principal, role, owner_rights=True)
    except Problem as exc:
        return f"{event.action} of {principal['name']} in {access.slug} not re-applied: {exc}"
    return f"{event.action} of {principal['name']} in {access.slug} re-applied"


async def replay_kernel(
    app: BuildMax, tx: Transaction, events: Sequence[AuditEvent], now: int
) -> list[str]:
    """Re-apply, in order, the kernel's restrictive actions among ``events``."""
    lines = []
    for event in events:
        if event.action in REPLAYED:
            line = await _apply(app, tx, event, now)
            if line is not None:
                lines.append(line)
    return lines
