"""The kernel side of the audit trail: declared actions and ``record``.

Every mutation calls :meth:`AuditLog.record` inside its own transaction.
The kernel validates the event against the declared actions (an unknown
action, or a detail key the action did not declare, is a programming error)
and hands it to ``buildmax_audit_record``; the audit plugin persists it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from buildmax_hookspecs import Actor, AuditAction, AuditEvent, Transaction
from quart import g, has_request_context

if TYPE_CHECKING:
    from .app import BuildMax

MAX_DETAIL_BYTES = 8 * 1024


class AuditError(Exception):
    """An event does not match its declaration."""


class AuditLog:
    """Declared actions, and the function that records an event."""

    def __init__(self, app: BuildMax, actions: Iterable[AuditAction]) -> None:
        self._app = app
        self.actions: dict[str, AuditAction] = {}
        for action in actions:
            if action.name in self.actions:
                raise AuditError(f"audit action {action.name!r} is declared twice")
            self.actions[action.name] = action

    async def record(
        self,
        tx: Transaction,
        actor: Actor,
        action: str,
        *,
        space_id: str | None = None,
        target_type: str | None = None,
        target_id: str | None = None,
        details: Mapping[str, Any] | None = None,
        admin_override: bool = False,
    ) -> AuditEvent:
        """Validate and record one event in ``tx``; returns what was recorded."""
        declared = self.actions.get(action)
        if declared is None:
            raise AuditError(f"audit action {action!r} was never declared")
        details = dict(details or {})
        unknown = set(details) - declared.detail_keys
        if unknown:
            raise AuditError(f"audit action {action!r} does not declare {sorted(unknown)}")
        size = len(
            json.dumps(
                details, sort_keys=True, separators=(",", ":"), default=str, ensure_ascii=False
            ).encode()
        )
        if size > MAX_DETAIL_BYTES:
            raise AuditError(f"audit details of {action!r} exceed {MAX_DETAIL_BYTES} bytes")
        request_id = g.get("request_id") if has_request_context() else None
        event = AuditEvent(
            time=self._app.clock.now_ms(),
            action=action,
            actor_id=actor.principal_id,
            actor_kind=actor.kind,
            space_id=space_id,
            target_type=target_type,
            target_id=target_id,
            details=details,
            acting_through=actor.acting_through,
            request_id=request_id,
            admin_override=admin_override,
        )
        await self._app.plugins.acall("buildmax_audit_record", tx=tx, event=event)
        return event
