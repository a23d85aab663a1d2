"""Hooks of the server's life: start-up, routes, commands, schema, services."""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Mapping
from typing import Any

from .kernel import App
from .markers import hookspec
from .records import Migration


@hookspec
def buildmax_startup(app: App) -> Awaitable[None] | None:
    """Start the plugin's background work (reapers, sweeps, caches).

    Called by the kernel once per server process, after the database is
    connected and migrations are checked, before the first request is
    served. No transaction is open; open your own with ``app.db.write()``.
    Return ``None`` or an awaitable; the kernel awaits it. An exception
    aborts start-up.
    """


@hookspec
def buildmax_shutdown(app: App) -> Awaitable[None] | None:
    """Stop the plugin's background work.

    Called by the kernel once when the process stops, after in-flight
    requests finished and before the database is closed. No transaction is
    open. Return ``None`` or an awaitable; the kernel awaits it. Exceptions
    are logged and do not stop the other plugins' shutdown.
    """


@hookspec
def buildmax_blueprints(app: App) -> Iterable[Any] | None:
    """Quart blueprints this plugin serves.

    Called once by the app factory while the app is built, before start-up.
    No transaction. Return an iterable of ``quart.Blueprint`` objects; their
    routes are part of ``/v1/openapi.json``.
    """


@hookspec
def buildmax_register_commands(cli: Any) -> None:
    """Add click commands or groups to the ``buildmax`` command line.

    Called once when the ``buildmax`` command starts, with the root
    ``click.Group``; call ``cli.add_command(...)``. No app or transaction
    exists yet. The return value is ignored.
    """


@hookspec
def buildmax_migrations() -> Iterable[Migration] | None:
    """The plugin's ordered schema migrations.

    Called by the kernel on ``buildmax db migrate``, ``buildmax db status``
    and at server start. Return :class:`~buildmax_hookspecs.Migration`
    records, all with the same ``plugin`` namespace and versions 1, 2, ...
    Each pending migration is applied in its own write transaction.
    """


@hookspec
def buildmax_services(app: App) -> Mapping[type, Any] | None:
    """Implementations of contract Protocols this plugin provides.

    Called once by the app factory after every plugin is registered. Return a
    mapping of Protocol class to implementation (for example
    ``{TaskQueue: MyQueue(app)}``). Consumers look them up with
    ``app.services.get(Protocol)``. Two plugins providing the same Protocol
    is a start-up error naming both.
    """
