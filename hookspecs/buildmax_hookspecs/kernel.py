"""What the kernel gives a plugin: the :class:`App` and its parts.

Hooks that need the app receive it as ``app`` (name the argument in your
implementation to get it; pluggy passes only what an implementation names).
Code that runs in a background task, a command or a hook has no request, so
it must use the ``app`` it was given, never the app of "the current request".
Every member is read-only: a plugin uses the parts, it does not replace them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, Protocol, TypeVar

from .protocols import Transaction
from .records import Actor

T = TypeVar("T")


class Clock(Protocol):
    """Something that tells the time in UTC epoch milliseconds."""

    def now_ms(self) -> int:
        """The current time in UTC epoch milliseconds."""


class Database(Protocol):
    """The database, whichever engine serves it."""

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""

    def write(self) -> AbstractAsyncContextManager[Transaction]:
        """A write transaction: committed on success, rolled back on any
        exception. One at a time per task: pass ``tx`` down instead of
        opening another inside it."""

    def read(self, *, background: bool = False) -> AbstractAsyncContextManager[Transaction]:
        """A read connection (autocommit; no multi-statement snapshot).
        ``background=True`` is for long reads (exports)."""


class ServiceRegistry(Protocol):
    """The services plugins provide through ``buildmax_services``."""

    def get(self, protocol: type[T]) -> T:
        """The implementation of ``protocol``; ``LookupError`` naming the
        missing capability when no loaded plugin provides it."""

    def __contains__(self, protocol: type) -> bool:
        """Whether a loaded plugin provides ``protocol``."""


class AuditTrail(Protocol):
    """The hash-chained audit trail."""

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
    ) -> Any:
        """Record one event of a declared action (``buildmax_audit_actions``)
        inside ``tx``: it commits if and only if the change does."""


class EventStream(Protocol):
    """The per-space event streams clients follow (``/events``)."""

    async def publish_many(
        self, tx: Transaction, space_pk: int, batch: Sequence[tuple[str, Mapping[str, Any]]]
    ) -> None:
        """Append ``(type, data)`` events to the space's stream inside ``tx``,
        in order. They get their sequence numbers as the transaction commits
        and are in the stream by the time it has ended. Call it late
        (``tx.before_commit``): on SQLite it takes the space's next numbers."""


class Settings(Protocol):
    """The server's configuration, as far as plugins read it."""

    @property
    def data_path(self) -> Path:
        """The server's data folder (the SQLite file, file blobs, scratch)."""

    @property
    def plugins(self) -> Mapping[str, Mapping[str, Any]]:
        """The ``[plugins.<name>]`` tables of the configuration, by plugin name."""


class App(Protocol):
    """A BuildMax server as plugins see it."""

    @property
    def db(self) -> Database:
        """The database."""

    @property
    def clock(self) -> Clock:
        """The clock every timestamp comes from (a test may move it)."""

    @property
    def services(self) -> ServiceRegistry:
        """The services of the loaded plugins."""

    @property
    def audit(self) -> AuditTrail:
        """The audit trail."""

    @property
    def events(self) -> EventStream:
        """The spaces' event streams."""

    @property
    def settings(self) -> Settings:
        """The configuration."""

    @property
    def extensions(self) -> dict[str, Any]:
        """State a plugin keeps for the life of this app (parsed settings,
        caches), under keys that start with the plugin's name."""
