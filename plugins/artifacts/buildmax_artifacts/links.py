"""What an upload attaches its artifact to: a task, or one of its attempts.

Attaching bytes to an attempt is a write on that attempt, so it takes what
every write on an attempt takes: being its current owner at its current
generation while its lease runs, or a space admin's (or owner's) override
with a reason, audited. The tasks plugin decides through
``TaskQueue.fence``, asked once before the bytes stream (so a refused
upload stores nothing) and again in the transaction that writes the
artifact row (so an attempt that ended or changed hands meanwhile gets no
artifact). This plugin never imports the tasks plugin.
"""

from __future__ import annotations

from dataclasses import dataclass

from buildmax_hookspecs import TaskQueue

from buildmax.access import SpaceAccess
from buildmax.app import BuildMax
from buildmax.auth import Caller
from buildmax.problems import Forbidden, NotFound, ValidationFailed
from buildmax.services import ServiceMissing

#: Override reasons are recorded on the audit trail, whose details are bounded.
MAX_REASON = 1000


@dataclass(frozen=True)
class Link:
    """The task an artifact belongs to and, maybe, its attempt at a
    generation (with the reason of an admin attaching to someone else's)."""

    task_id: str | None = None
    attempt_id: str | None = None
    generation: int | None = None
    override_reason: str | None = None


def task_queue(app: BuildMax) -> TaskQueue:
    """The tasks plugin's service; 422 when it is not loaded."""
    try:
        return app.services.get(TaskQueue)
    except ServiceMissing:
        raise ValidationFailed("task and attempt need the tasks plugin") from None


async def requested_link(
    app: BuildMax,
    caller: Caller,
    access: SpaceAccess,
    *,
    task: str | None,
    attempt: str | None,
    generation: int | None,
    override_reason: str | None,
) -> Link:
    """The link an upload asks for, checked before any byte is stored.

    An upload naming ``attempt`` names its ``generation`` too. An attempt's
    token uploads for its own attempt only, which it need not name (the
    attempt's current generation is then meant)."""
    at, reason = generation, override_reason
    scope = caller.actor.scope_id if caller.actor.scope_type == "attempt" else None
    if scope is not None and attempt not in (None, scope):
        raise Forbidden("an attempt's token uploads for its own attempt only")
    if attempt is not None and at is None:
        raise ValidationFailed(
            "an upload naming an attempt names its generation too",
            errors={"generation": ["Required with attempt."]},
        )
    if attempt is None and at is not None:
        raise ValidationFailed(
            "generation goes with attempt", errors={"generation": ["Only with attempt."]}
        )
    attempt = attempt or scope
    if task is None and attempt is None:
        return Link()
    queue = task_queue(app)
    async with app.db.read() as conn:
        if attempt is None:
            ref = await queue.task(conn, str(task))
            if ref is None or ref.space_id != access.public_id:
                raise NotFound("no such task in this space")
            return Link(task_id=ref.id)
        if at is None:  # the attempt's own token, naming no attempt
            found = await queue.attempt(conn, attempt)
            if found is None:
                raise NotFound("no such attempt in this space")
            at = found.generation
        fenced = await queue.fence(
            conn, attempt, at, actor=caller.actor, space_id=access.public_id, override_reason=reason
        )
    if task is not None and task != fenced.task_id:
        raise ValidationFailed("the attempt belongs to another task")
    return Link(fenced.task_id, fenced.id, at, reason)
