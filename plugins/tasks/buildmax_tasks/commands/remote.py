"""The connection a command of the tasks plugin works with: bound to one
space, with the tasks calls."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from buildmax.commands.identity import Remote, connected

from ..client import TasksClient
from .options import space_option


@dataclass
class SpaceRemote(Remote):
    """A remote command's connection, bound to one space, with the tasks calls."""

    space: str
    tasks: TasksClient


def in_space(command: Callable[..., None]) -> Callable[..., None]:
    """Give ``command`` --space, --url, --token and --json and call it with a
    :class:`SpaceRemote`; problems are reported as one ``error:`` line."""

    @space_option
    @connected
    @functools.wraps(command)
    def run(remote: Remote, space: str, **arguments: Any) -> None:
        bound = SpaceRemote(remote.client, remote.as_json, space, TasksClient(remote.client))
        command(bound, **arguments)

    return run
