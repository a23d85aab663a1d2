"""The audit plugin's settings, from the ``[plugins.audit]`` table of the
server's TOML file."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from buildmax_hookspecs import App

from buildmax.config import ConfigError, integer_settings, plugin_settings

#: A retention longer than a century is a mistake, not a policy.
MAX_RETENTION_DAYS = 36_500


@dataclass(frozen=True)
class AuditSettings:
    """Retention and its sweep."""

    #: Events older than this many days are removed by the sweep; 0 keeps
    #: every event forever.
    retention_days: int = 0
    #: How often the retention sweep runs (when retention is set).
    sweep_interval_seconds: int = 3600

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> AuditSettings:
        """Settings from a ``[plugins.audit]`` table; unknown keys are refused."""
        settings = integer_settings(cls, "audit", raw, minimum=0)
        if settings.retention_days > MAX_RETENTION_DAYS:
            raise ConfigError(
                f"[plugins.audit] retention_days: at most {MAX_RETENTION_DAYS} (0 keeps forever)"
            )
        if settings.sweep_interval_seconds < 1:
            raise ConfigError("[plugins.audit] sweep_interval_seconds: expected at least 1")
        return settings


def audit_settings(app: App) -> AuditSettings:
    """The app's audit settings (parsed once, kept on the app)."""
    return plugin_settings(app, "audit", AuditSettings.from_mapping)
