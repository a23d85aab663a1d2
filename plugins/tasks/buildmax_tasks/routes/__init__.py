"""HTTP routes of the tasks plugin, under ``/v1/spaces/{space}/...``, and
what they share: the plugin's state on the app, a :class:`Change` per
write, lease bounds and override rights."""

from __future__ import annotations

from dataclasses import dataclass

from buildmax_hookspecs import Transaction
from quart import Blueprint

from buildmax.access import SpaceAccess
from buildmax.app import BuildMax
from buildmax.auth import Caller

from ..change import Change
from ..engine import StageEngine, stage_engine
from ..settings import TaskSettings, task_settings


@dataclass(frozen=True)
class TasksState:
    """The stage engine and settings of one app."""

    engine: StageEngine
    settings: TaskSettings


def tasks_state(app: BuildMax) -> TasksState:
    """The plugin's state on ``app`` (built on first use)."""
    return TasksState(stage_engine(app), task_settings(app))


def change(app: BuildMax, tx: Transaction, caller: Caller, access: SpaceAccess) -> Change:
    """A :class:`Change` for a write in ``access``'s space."""
    return Change(
        app=app,
        tx=tx,
        actor=caller.actor,
        space_pk=access.pk,
        space_id=access.public_id,
        now=app.clock.now_ms(),
        admin_override=access.admin_override,
    )


def may_override(access: SpaceAccess, caller: Caller) -> bool:
    """Space admins and owners (and system admins) may act on others' attempts."""
    return access.role in ("admin", "owner") or caller.is_admin


def lease_ms(settings: TaskSettings, requested: int | None) -> int:
    """The lease to grant, in milliseconds: ``requested`` (which the body's
    schema bounds by the configured maximum) or the configured default."""
    if requested is None:
        return settings.lease_seconds * 1000
    return requested * 1000


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
