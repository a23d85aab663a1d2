"""``buildmax`` commands of the tasks plugin: projects, tasks, attempts,
holds, decisions and agent definitions.

Every command works in one space, named with ``--space`` or
``BUILDMAX_SPACE``, and takes the kernel's ``--url``, ``--token`` and
``--json``.
"""

from __future__ import annotations

import click

from .agents import agent_group
from .attempts import attempt_group
from .decisions import decision_group
from .holds import hold_group
from .options import SPACE_ENV
from .projects import project_group
from .tasks import task_group

__all__ = ["SPACE_ENV", "register"]


def register(cli: click.Group) -> None:
    """Add the plugin's command groups to ``cli``."""
    for group in (
        project_group,
        task_group,
        attempt_group,
        hold_group,
        decision_group,
        agent_group,
    ):
        cli.add_command(group)
