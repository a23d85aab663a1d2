"""The dashboard plugin's hook implementations (entry point ``dashboard``)."""

from __future__ import annotations

from typing import Any

from buildmax_hookspecs import hookimpl

from buildmax.app import BuildMax


@hookimpl
def buildmax_blueprints(app: BuildMax) -> list[Any]:
    from . import (  # noqa: F401  (their routes join the blueprint)
        admin_pages,
        audit_pages,
        editing,
        pages,
        plugin_pages,
    )
    from .web import blueprint, root

    return [blueprint, root]
