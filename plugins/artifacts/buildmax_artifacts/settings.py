"""The artifacts plugin's settings, from the ``[plugins.artifacts]`` table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from buildmax_hookspecs import App

from buildmax.config import ConfigError, integer_settings, plugin_settings

MIB = 2**20


@dataclass(frozen=True)
class ArtifactSettings:
    """Size limit and quotas, in bytes."""

    #: The largest artifact accepted.
    max_bytes: int = 16 * MIB
    #: Bytes all spaces together may store (reserved uploads included).
    quota_bytes: int = 10 * 1024 * MIB
    #: Bytes one space may store; 0: only the deployment's quota applies.
    space_quota_bytes: int = 0
    #: Orphaned bytes and reservations younger than this are left to uploads
    #: that may still be in flight.
    gc_grace_seconds: int = 3600
    #: Unpinned artifacts older than this many days expire; 0 keeps them.
    retention_days: int = 90
    #: How often each server applies retention and collects garbage.
    sweep_interval_seconds: int = 3600

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> ArtifactSettings:
        """Settings from a ``[plugins.artifacts]`` table; unknown keys are refused."""
        settings = integer_settings(cls, "artifacts", raw, minimum=0)
        if (
            settings.max_bytes < 1
            or settings.quota_bytes < 1
            or settings.sweep_interval_seconds < 1
        ):
            raise ConfigError(
                "[plugins.artifacts] max_bytes, quota_bytes and sweep_interval_seconds "
                "must be positive"
            )
        return settings


def artifact_settings(app: App) -> ArtifactSettings:
    """The app's artifacts settings (parsed once, kept on the app)."""
    return plugin_settings(app, "artifacts", ArtifactSettings.from_mapping)
