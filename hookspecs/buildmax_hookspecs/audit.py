"""Hooks for the audit trail."""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Mapping

from .kernel import App
from .markers import hookspec
from .protocols import Transaction
from .records import AuditAction, AuditEvent


@hookspec
def buildmax_audit_actions() -> Iterable[AuditAction] | None:
    """The audit actions this plugin emits, each with its allowed detail keys.

    Called once by the app factory. Return :class:`AuditAction` records. The
    kernel refuses to record an action nobody declared, or details with a
    key the action did not declare. A name declared twice is a start-up
    error.
    """


@hookspec
def buildmax_audit_targets() -> Mapping[str, str] | None:
    """Where the audit targets this plugin names can be read, by target type.

    Return a mapping of target type (``"task"``) to a URL path template in
    which ``{id}`` is the target's public id and ``{space}`` the event's
    space (``"/v1/spaces/{space}/tasks/{id}"``). Audit readers link each
    event's target through it; a type with no template is shown unlinked.
    Called once by the app factory; a type claimed twice is a start-up error.
    """


@hookspec
def buildmax_audit_record(app: App, tx: Transaction, event: AuditEvent) -> Awaitable[None] | None:
    """Persist an audit event inside the caller's transaction.

    Called by the kernel's ``app.audit.record`` from inside the write
    transaction of the change the event describes, so the event is committed
    if and only if the change is. Return ``None`` or an awaitable; an
    exception rolls the whole change back. With no implementation loaded,
    events are validated and dropped.
    """
