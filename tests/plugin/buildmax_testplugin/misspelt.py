"""A plugin with a misspelt hook name, registered by a test to prove the
kernel's ``check_pending`` refuses it."""

from __future__ import annotations

from typing import Any

from buildmax_hookspecs import hookimpl


@hookimpl
def buildmax_blueprint(app: Any) -> list[Any]:
    return []
