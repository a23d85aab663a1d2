"""Small frozen records that cross the plugin boundary.

Hooks pass these instead of a plugin's own row objects, so a plugin can
change its tables without breaking another plugin. Every id here is a public
id (an opaque string); numeric database keys never cross the boundary.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .protocols import Transaction

PrincipalKind = Literal["human", "agent", "service"]
SystemRole = Literal["admin", "operator"]


@dataclass(frozen=True)
class Actor:
    """Who is acting: an authenticated principal, or the system itself.

    ``scope_type``/``scope_id`` are set when the request came with a scoped
    token (for example a token scoped to one attempt); ``acting_through``
    then names that resource for the audit trail.
    """

    principal_id: str | None
    kind: PrincipalKind | Literal["system"]
    name: str
    system_role: SystemRole | None = None
    token_id: str | None = None
    scope_type: str | None = None
    scope_id: str | None = None

    @property
    def is_system(self) -> bool:
        """True for work the server does on its own (reapers, bootstrap)."""
        return self.kind == "system"

    @property
    def acting_through(self) -> str | None:
        """``"<scope_type>:<scope_id>"`` for a scoped token, else ``None``."""
        if self.scope_type is None:
            return None
        return f"{self.scope_type}:{self.scope_id}"


SYSTEM_ACTOR = Actor(principal_id=None, kind="system", name="system")


@dataclass(frozen=True)
class ResourceRef:
    """A thing a permission is asked about: its type, public id and space."""

    type: str
    id: str | None = None
    space_id: str | None = None


@dataclass(frozen=True)
class Verdict:
    """A plugin's judgement, with a reason a person can read.

    ``outcome`` is one of ``allow``/``deny`` (claim checks, activation
    policy) or ``pending``/``pass``/``changes``/``reject`` (stage verdicts).
    """

    outcome: str
    reason: str = ""
    finding_ids: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        """True when the verdict lets the action go ahead."""
        return self.outcome in ("allow", "pass")


@dataclass(frozen=True)
class AuditAction:
    """An audit action a plugin emits and the detail keys it may carry.

    The kernel refuses an audit event whose action was not declared or whose
    details carry a key outside ``detail_keys``: that allow-list is what keeps
    secrets and configuration values out of the trail.
    """

    name: str
    description: str
    detail_keys: frozenset[str] = frozenset()
    target_type: str | None = None


@dataclass(frozen=True)
class AuditEvent:
    """One audit event, handed to ``buildmax_audit_record`` in the transaction
    of the change it describes. ``time`` is UTC epoch milliseconds."""

    time: int
    action: str
    actor_id: str | None
    actor_kind: str
    space_id: str | None
    target_type: str | None
    target_id: str | None
    details: Mapping[str, Any] = field(default_factory=dict)
    acting_through: str | None = None
    request_id: str | None = None
    admin_override: bool = False


@dataclass(frozen=True)
class Migration:
    """One schema migration of one plugin.

    ``plugin`` is the migration namespace (normally the plugin's name); the
    kernel records applied ``(plugin, version)`` pairs and applies pending
    ones in ``version`` order, each in its own write transaction.
    ``apply(tx)`` runs SQLAlchemy DDL or Core statements through ``tx``.
    """

    plugin: str
    version: int
    name: str
    apply: Callable[[Transaction], Awaitable[None]]


@dataclass(frozen=True)
class BlobRef:
    """Where a blob lives in a store, its size in bytes and its sha256 (hex)."""

    key: str
    size: int
    sha256: str
