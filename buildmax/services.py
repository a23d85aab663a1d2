"""The service registry: contract Protocols mapped to their providers.

Plugins provide implementations through ``buildmax_services(app)``;
consumers call ``app.services.get(TaskQueue)`` and get a clear error naming
the missing capability when no loaded plugin provides it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")


class ServiceMissing(LookupError):
    """No loaded plugin provides the requested service."""


class ServiceConflict(Exception):
    """Two plugins provide the same service."""


class Services:
    """Protocol class -> implementation, with the providing plugin's name."""

    def __init__(self) -> None:
        self._impls: dict[type, tuple[str, Any]] = {}

    def provide(self, protocol: type, impl: Any, provider: str) -> None:
        """Register ``impl`` for ``protocol``; a second provider is an error."""
        if protocol in self._impls:
            other = self._impls[protocol][0]
            raise ServiceConflict(
                f"both {other!r} and {provider!r} provide {protocol.__name__}; disable one"
            )
        self._impls[protocol] = (provider, impl)

    def provide_all(self, mapping: Mapping[type, Any], provider: str) -> None:
        """Register every entry of a ``buildmax_services`` result."""
        for protocol, impl in mapping.items():
            self.provide(protocol, impl, provider)

    def get(self, protocol: type[T]) -> T:
        """The implementation of ``protocol``, or :class:`ServiceMissing`."""
        try:
            return self._impls[protocol][1]  # type: ignore[no-any-return]
        except KeyError:
            raise ServiceMissing(
                f"no loaded plugin provides the {protocol.__name__} service; "
                "install and enable the plugin that provides it (see `buildmax plugins`)"
            ) from None

    def provider(self, protocol: type) -> str | None:
        """The name of the plugin providing ``protocol``, if any."""
        entry = self._impls.get(protocol)
        return entry[0] if entry else None

    def __contains__(self, protocol: type) -> bool:
        return protocol in self._impls
