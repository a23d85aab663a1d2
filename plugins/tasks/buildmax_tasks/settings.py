"""The tasks plugin's settings, from the ``[plugins.tasks]`` table of the
server's TOML file."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from buildmax_hookspecs import App

from buildmax.config import ConfigError, integer_settings, plugin_settings


@dataclass(frozen=True)
class TaskSettings:
    """Leases, the reaper and the claim-next search bound."""

    #: Lease of a claim when the claimant asks for none.
    lease_seconds: int = 600
    #: The longest lease a claim or renewal may ask for.
    lease_max_seconds: int = 3600
    #: How often the reaper looks for lapsed leases.
    reap_interval_seconds: int = 5
    #: Candidates claim-next looks at before giving up.
    claim_scan_limit: int = 100

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> TaskSettings:
        """Settings from a ``[plugins.tasks]`` table; unknown keys are refused."""
        settings = integer_settings(cls, "tasks", raw, minimum=1)
        if settings.lease_seconds > settings.lease_max_seconds:
            raise ConfigError("[plugins.tasks] lease_seconds exceeds lease_max_seconds")
        return settings


def task_settings(app: App) -> TaskSettings:
    """The app's tasks settings (parsed once, kept on the app)."""
    return plugin_settings(app, "tasks", TaskSettings.from_mapping)
