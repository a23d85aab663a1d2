"""The marketplace plugin's settings, from the ``[plugins.marketplace]`` table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from buildmax_hookspecs import App

from buildmax.config import ConfigError, integer_settings, plugin_settings

from .package import Limits

MIB = 2**20


@dataclass(frozen=True)
class MarketplaceSettings:
    """Limits on published release archives."""

    #: The largest release archive accepted, in bytes.
    max_package_bytes: int = 64 * MIB
    #: Entries (files and directories) one release may hold.
    max_entries: int = 2000
    #: Bytes one release may hold once extracted.
    max_extracted_bytes: int = 256 * MIB
    #: Largest extracted/compressed size ratio (an archive bomb's signature).
    max_ratio: int = 200

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> MarketplaceSettings:
        """Settings from a ``[plugins.marketplace]`` table; unknown keys are refused."""
        settings = integer_settings(cls, "marketplace", raw, minimum=1)
        if settings.max_extracted_bytes < settings.max_package_bytes:
            raise ConfigError(
                "[plugins.marketplace] max_extracted_bytes must be at least max_package_bytes"
            )
        return settings

    @property
    def limits(self) -> Limits:
        """The hardened reader's limits."""
        return Limits(self.max_entries, self.max_extracted_bytes, self.max_ratio)


def marketplace_settings(app: App) -> MarketplaceSettings:
    """The app's marketplace settings (parsed once, kept on the app)."""
    return plugin_settings(app, "marketplace", MarketplaceSettings.from_mapping)
