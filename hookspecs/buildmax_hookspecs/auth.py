"""Hooks for authorization: permissions, and changes of space membership."""

from __future__ import annotations

from collections.abc import Awaitable

from .kernel import App
from .markers import hookspec
from .protocols import Transaction
from .records import Actor, ResourceRef


@hookspec
def buildmax_permission(actor: Actor, action: str, resource: ResourceRef) -> bool | None:
    """Allow (``True``), deny (``False``) or have no opinion (``None``).

    Called by the kernel's role check on every request that needs a space
    role, after the actor is authenticated and before the handler runs,
    outside any transaction; keep it fast and synchronous. ``action`` is a
    dotted verb such as ``space.read`` or ``space.members.manage``. Any
    ``False`` denies; otherwise any ``True`` allows even without the role;
    otherwise the membership role decides.
    """


@hookspec
def buildmax_member_changed(
    app: App,
    tx: Transaction,
    space_id: str,
    principal_id: str,
    role: str | None,
    previous_role: str | None,
    actor: Actor,
) -> Awaitable[None] | None:
    """The principal ``principal_id`` joined space ``space_id``
    (``previous_role`` is ``None``), its role there changed, or it left or
    was removed (``role`` is ``None``). Roles are ``viewer``, ``member``,
    ``admin`` and ``owner``; ``actor`` made the change.

    Called by the kernel inside the write transaction of the change, after
    the membership row was written and before the change's event is
    published. A plugin ends here what the principal may no longer do in the
    space (the tasks plugin releases the attempts of a principal who may no
    longer run work there, which ends their run tokens); what it writes
    commits if and only if the change does, and an exception rolls the
    change back. May be ``async``.
    """
