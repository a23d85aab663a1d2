"""The connection a command of the tasks plugin works with: bound to one
space, with the tasks calls, printing nested objects flat."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import click

from buildmax.commands.identity import Remote, connected, render_record, render_table

from ..client import TasksClient
from .options import space_option


def _text(value: Any) -> Any:
    """A list or nested value as one table cell."""
    if isinstance(value, list):
        return ", ".join(str(v.get("id", v)) if isinstance(v, dict) else str(v) for v in value)
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return value


def _flat(item: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested objects as dotted keys (``policy.revision``), lists as text."""
    flat: dict[str, Any] = {}
    for key, value in item.items():
        if isinstance(value, dict) and key not in ("progress", "candidate", "evidence"):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = _text(value)
    return flat


@dataclass
class SpaceRemote(Remote):
    """A remote command's connection, bound to one space, with the tasks calls."""

    space: str
    tasks: TasksClient

    def show(self, item: dict[str, Any], fields: Sequence[str]) -> None:
        """Print one object (nested fields as ``outer.inner``, text of several
        lines indented under its first)."""
        if self.as_json:
            click.echo(json.dumps(item, indent=2))
            return
        indent = "\n" + " " * (max(len(field) for field in fields) + 2)
        flat = {
            key: value.replace("\n", indent) if isinstance(value, str) else value
            for key, value in _flat(item).items()
        }
        click.echo(render_record(flat, fields))

    def show_all(self, items: list[dict[str, Any]], columns: Sequence[str]) -> None:
        """Print a list of objects (nested fields as ``outer.inner``)."""
        if self.as_json:
            click.echo(json.dumps(items, indent=2))
        else:
            click.echo(render_table([_flat(item) for item in items], columns))


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
