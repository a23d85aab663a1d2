"""Hooks for imports: the sources a team's backlog is imported from."""

from __future__ import annotations

from collections.abc import Iterable

from .markers import hookspec
from .protocols import Importer


@hookspec
def buildmax_importers() -> Iterable[Importer] | None:
    """The sources a backlog can be imported from.

    Called by the imports plugin when it starts and when a command lists
    the formats, with no transaction open. Return :class:`Importer`
    objects, each with a ``name`` unique across plugins (``beads``,
    ``csv``, ``github``). An importer only reads: its ``read`` turns a file
    into :class:`SourceRecord` records and :class:`SourceProblem` entries,
    and never touches the database. The imports plugin checks each record
    against the queue's limits, previews it and applies it through the tasks
    plugin's API, so what an importer returns is never trusted further than
    a client's request. Two plugins offering the same name is an error
    named when the server starts.
    """
