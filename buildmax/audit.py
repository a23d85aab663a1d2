"""The kernel side of the audit trail: declared actions, target links,
canonical JSON and ``record``.

Every mutation calls :meth:`AuditLog.record` inside its own transaction.
The kernel validates the event against the declared actions (an unknown
action, a target of another type than the action declared, a detail key the
action did not declare, or a detail value JSON cannot carry is a programming
error) and hands it to ``buildmax_audit_record``; the audit plugin persists
it.
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


def canonical_json(value: Any) -> bytes:
    """The one canonical JSON encoding of the audit trail: keys sorted, no
    whitespace, UTF-8 (not ``\\u`` escapes), no NaN or infinity. Raises
    ``TypeError``/``ValueError`` for what JSON cannot carry."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


class AuditLog:
    """Declared actions, and the function that records an event."""

    def __init__(
        self,
        app: BuildMax,
        actions: Iterable[AuditAction],
        targets: Iterable[Mapping[str, str]] = (),
    ) -> None:
        self._app = app
        self.actions: dict[str, AuditAction] = {}
        for action in actions:
            if action.name in self.actions:
                raise AuditError(f"audit action {action.name!r} is declared twice")
            self.actions[action.name] = action
        #: URL path templates of the audit targets, by target type.
        self.target_links: dict[str, str] = {}
        for mapping in targets:
            for target_type, template in mapping.items():
                if target_type in self.target_links:
                    raise AuditError(f"audit target type {target_type!r} is claimed twice")
                self.target_links[target_type] = template

    def link(
        self, target_type: str | None, target_id: str | None, space_id: str | None
    ) -> str | None:
        """The URL path where an event's target can be read, when its type
        has a template (and the template's placeholders have values)."""
        template = self.target_links.get(target_type or "")
        if template is None or target_id is None:
            return None
        if "{space}" in template and space_id is None:
            return None
        return template.format(id=target_id, space=space_id)

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
        if declared.target_type is not None and target_type != declared.target_type:
            raise AuditError(
                f"audit action {action!r} names {declared.target_type!r} targets, "
                f"not {target_type!r}"
            )
        details = dict(details or {})
        unknown = set(details) - declared.detail_keys
        if unknown:
            raise AuditError(f"audit action {action!r} does not declare {sorted(unknown)}")
        try:
            size = len(canonical_json(details))
        except (TypeError, ValueError) as exc:
            raise AuditError(f"audit details of {action!r} are not plain JSON: {exc}") from None
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
        await self._app.hooks.audit_record(tx, event)
        return event
