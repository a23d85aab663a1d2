"""``buildmax`` commands of the tasks plugin."""

from __future__ import annotations

import click


def register(cli: click.Group) -> None:
    """Add the plugin's command groups to ``cli``."""
