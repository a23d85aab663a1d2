"""Hooks for authorization."""

from __future__ import annotations

from .markers import hookspec
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
