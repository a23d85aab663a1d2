"""HTTP routes of the tasks plugin, under ``/v1/spaces/{space}/...``, and
what they share: the plugin's state on the app, lease bounds and override
rights."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from buildmax_hookspecs import Transaction
from quart import Blueprint, Response

from buildmax.access import SpaceAccess
from buildmax.app import BuildMax
from buildmax.auth import Caller
from buildmax.bodies import json_response
from buildmax.current import current_buildmax
from buildmax.pagination import page_body, page_request

from ..authority import Authority, authority
from ..engine import StageEngine, stage_engine
from ..records import task_or_404
from ..rows import TaskRow
from ..settings import TaskSettings, task_settings
from ..views import render_tasks


@dataclass(frozen=True)
class TasksState:
    """The stage engine and settings of one app."""

    engine: StageEngine
    settings: TaskSettings


def tasks_state(app: BuildMax) -> TasksState:
    """The plugin's state on ``app`` (built on first use)."""
    return TasksState(stage_engine(app), task_settings(app))


def caller_authority(access: SpaceAccess, caller: Caller, reason: str | None) -> Authority:
    """The caller's authority over tasks and attempts of the space
    (``reason``: the override reason its body gave, if any)."""
    return authority(caller.principal_pk, caller.actor, access.role, reason)


def lease_ms(settings: TaskSettings, requested: int | None) -> int:
    """The lease to grant, in milliseconds: ``requested`` (which the body's
    schema bounds by the configured maximum) or the configured default."""
    if requested is None:
        return settings.lease_seconds * 1000
    return requested * 1000


async def render_one(conn: Transaction, task: TaskRow, now: int) -> dict[str, Any]:
    """One task as the API shows it."""
    app = current_buildmax()
    return (await render_tasks(conn, [task], now, tasks_state(app).engine))[0]


async def task_children(
    access: SpaceAccess,
    task: str,
    rows_of: Callable[[int], Any],
    key: Any,
    render: Callable[[Mapping[str, Any]], dict[str, Any]],
    *,
    newest_first: bool = False,
) -> Response:
    """A page of one task's rows (attempts, submissions, revisions) for a
    viewer: ``rows_of(task_pk)`` selects them, ``key`` (an integer column)
    orders and pages them; ``render`` shows one row as read."""
    app = current_buildmax()
    page = page_request((int,))
    async with app.db.read() as conn:
        row = await task_or_404(conn, access.pk, task)
        query = rows_of(row.pk).order_by(key.desc() if newest_first else key)
        query = query.limit(page.limit + 1)
        if page.after is not None:
            query = query.where(key < page.after[0] if newest_first else key > page.after[0])
        rows = list(await conn.fetch_all(query))
    items = [render(r) for r in rows]
    return json_response(page_body(items, rows, page.limit, lambda r: (r[key.name],)))


def blueprints() -> list[Blueprint]:
    """Every blueprint of the plugin."""
    from . import agents, attempts, decisions, holds, projects, tasks

    return [
        projects.blueprint,
        tasks.blueprint,
        attempts.blueprint,
        holds.blueprint,
        decisions.blueprint,
        agents.blueprint,
    ]
