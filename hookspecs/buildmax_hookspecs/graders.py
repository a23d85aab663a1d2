"""Hooks for graders: the checks a qualification journey runs."""

from __future__ import annotations

from collections.abc import Mapping

from .markers import hookspec
from .protocols import GraderFactory


@hookspec
def buildmax_graders() -> Mapping[str, GraderFactory] | None:
    """Grader factories by name.

    Called once by the qualification runner (``buildmax qualify``), outside
    the server and with no transaction open. Return a mapping such as
    ``{"status": StatusGrader}``. A journey file names a grader in a check
    (``grader = "status"``); the runner calls ``factory(spec)`` with the
    check's table when it loads the journey, so a factory should raise
    ``ValueError`` naming the bad key for a spec it cannot use, and later
    awaits ``grader.grade(context)`` for a :class:`~buildmax_hookspecs.Grade`.
    Two plugins offering the same name is an error the runner reports.
    """
