"""The kernel's HTTP routes, served by the essential internal plugin."""

from __future__ import annotations

from quart import Blueprint

from . import health, operations, principals, sessions, space_events, spaces, tokens


def kernel_blueprints() -> list[Blueprint]:
    """Every blueprint of the kernel, in registration order."""
    return [
        health.blueprint,
        operations.blueprint,
        sessions.blueprint,
        principals.blueprint,
        tokens.blueprint,
        spaces.blueprint,
        space_events.blueprint,
    ]
