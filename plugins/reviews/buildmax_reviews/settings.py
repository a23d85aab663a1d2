"""The reviews plugin's settings, from the ``[plugins.reviews]`` table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from buildmax_hookspecs import App

from buildmax.config import integer_settings, plugin_settings


@dataclass(frozen=True)
class ReviewSettings:
    """When waiting review work needs a person's attention."""

    #: Review work waiting longer than this joins the space's attention list
    #: (0: as soon as it waits, for a team that reviews everything at once).
    attention_wait_seconds: int = 3600

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> ReviewSettings:
        """Settings from a ``[plugins.reviews]`` table; unknown keys are refused."""
        return integer_settings(cls, "reviews", raw, minimum=0)


def review_settings(app: App) -> ReviewSettings:
    """The app's reviews settings (parsed once, kept on the app)."""
    return plugin_settings(app, "reviews", ReviewSettings.from_mapping)
