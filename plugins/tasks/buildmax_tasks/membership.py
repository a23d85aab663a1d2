"""A principal who may no longer run work in a space leaves no run behind.

Only members (``member`` and above) claim and report on attempts. When a
principal is removed from a space, or demoted to ``viewer``, the kernel
announces it through ``buildmax_member_changed``, and every active attempt
the principal holds in that space is released in the same transaction: not
charged against its task, the task ready again at once for someone else
(rather than stranded until the lease lapses), the attempt's run tokens
revoked and its reservations ended, each audited as ``attempt.released``
by whoever changed the membership, with the reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa
from buildmax_hookspecs import Actor, Transaction

from buildmax.access import role_at_least
from buildmax.tables import principals, spaces

from .attempts import give_up, locked
from .change import Change
from .tables import attempts

if TYPE_CHECKING:
    from buildmax.app import BuildMax

_ACTIVE_OF = (
    sa.select(attempts.c.public_id.label("id"))
    .join(principals, principals.c.id == attempts.c.claimant_id)
    .where(
        attempts.c.space_id == sa.bindparam("space_pk"),
        principals.c.public_id == sa.bindparam("principal_id"),
        attempts.c.state == "active",
    )
    .order_by(attempts.c.task_id)
)


def _reason(role: str | None) -> str:
    if role is None:
        return "its claimant is no longer a member of the space"
    return f"its claimant's role in the space is now {role}, which runs no work"


async def member_changed(
    app: BuildMax, tx: Transaction, space_id: str, principal_id: str, role: str | None, actor: Actor
) -> None:
    """Release every active attempt ``principal_id`` holds in ``space_id``
    when its new ``role`` (``None``: gone) runs no work."""
    if role_at_least(role, "member"):
        return
    space_pk = await tx.fetch_val(sa.select(spaces.c.id).where(spaces.c.public_id == space_id))
    held = await tx.fetch_all(_ACTIVE_OF, {"space_pk": space_pk, "principal_id": principal_id})
    ch = Change(app, tx, actor, space_pk, space_id, app.clock.now_ms())
    for row in held:
        attempt, task = await locked(ch, row["id"])
        if attempt.state == "active":
            await give_up(ch, attempt, task, "released", _reason(role))
