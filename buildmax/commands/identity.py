"""Commands that talk to a running server: login, principals, tokens, spaces."""

from __future__ import annotations

import click


def register(cli: click.Group) -> None:
    """Add these commands to the root group."""
