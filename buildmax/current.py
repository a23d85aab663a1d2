"""The app serving the current request, for code that runs inside one
(routes and what they call). It imports nothing of the kernel's, so any
module may use it without joining an import circle."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from quart import current_app

if TYPE_CHECKING:
    from .app import BuildMax


def current_buildmax() -> BuildMax:
    """The app of the current request, typed."""
    return cast("BuildMax", current_app._get_current_object())  # type: ignore[attr-defined]
