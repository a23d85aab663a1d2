"""One mutation in progress: its transaction, actor, space and time.

Every write of the tasks plugin runs through a :class:`Change`, so each
audit event and outbox event carries the same actor, space and moment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from buildmax_hookspecs import Actor, Transaction

if TYPE_CHECKING:
    from buildmax.access import SpaceAccess
    from buildmax.app import BuildMax
    from buildmax.auth import Caller


@dataclass
class Change:
    """The context of one write transaction."""

    app: BuildMax
    tx: Transaction
    actor: Actor
    space_pk: int
    space_id: str
    now: int
    admin_override: bool = False
    #: Why an admin or owner acts on someone else's attempt (audited).
    override_reason: str | None = None
    _events: list[tuple[str, dict[str, Any]]] = field(default_factory=list, repr=False)

    def override(self, reason: str) -> None:
        """Mark this change as an admin or owner acting on someone else's
        attempt; every audit event of it says so, with the reason."""
        self.admin_override = True
        self.override_reason = reason

    async def audit(self, action: str, target_type: str, target_id: str, **details: Any) -> None:
        """Record one audit event about ``target`` in this transaction."""
        if self.override_reason is not None:
            details["override_reason"] = self.override_reason
        await self.app.audit.record(
            self.tx,
            self.actor,
            action,
            space_id=self.space_id,
            target_type=target_type,
            target_id=target_id,
            details=details,
            admin_override=self.admin_override,
        )

    async def event(self, type: str, **data: Any) -> None:
        """Append an event to the space's stream in this transaction.

        Events are published together just before COMMIT (on SQLite,
        publishing takes the space's next sequence numbers)."""
        if not self._events:
            self.tx.before_commit(self._publish)
        self._events.append((type, data))

    async def _publish(self) -> None:
        batch, self._events = self._events, []
        await self.app.events.publish_many(self.tx, self.space_pk, batch)


def change(app: BuildMax, tx: Transaction, caller: Caller, access: SpaceAccess) -> Change:
    """A :class:`Change` by ``caller`` in ``access``'s space, now."""
    return Change(
        app=app,
        tx=tx,
        actor=caller.actor,
        space_pk=access.pk,
        space_id=access.public_id,
        now=app.clock.now_ms(),
        admin_override=access.admin_override,
    )
