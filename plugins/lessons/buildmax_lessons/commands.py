"""``buildmax lesson``: publish, search, show, correct, supersede and vote
on lessons through a server's API."""

from __future__ import annotations

import click


@click.group("lesson")
def lesson_group() -> None:
    """Lessons: what agents and people of a space learned."""
