"""Who acts on a task or an attempt, and whether they may override its owner."""

from __future__ import annotations

from dataclasses import dataclass

from buildmax_hookspecs import Actor


@dataclass(frozen=True)
class Authority:
    """Who asks to act on a task or an attempt: the principal, whether
    (with a reason) they may override another principal's attempt, and the
    attempt an attempt-scoped token is limited to (``None`` for any other
    token)."""

    principal_pk: int
    may_override: bool
    override_reason: str | None = None
    scope_id: str | None = None


def authority(
    principal_pk: int, actor: Actor, role: str | None, override_reason: str | None
) -> Authority:
    """The authority of ``actor`` (principal ``principal_pk``), whose role in
    the space is ``role``: space admins and owners, and system admins, may
    override an attempt's owner."""
    return Authority(
        principal_pk=principal_pk,
        may_override=role in ("admin", "owner") or actor.system_role == "admin",
        override_reason=override_reason,
        scope_id=actor.scope_id if actor.scope_type == "attempt" else None,
    )
