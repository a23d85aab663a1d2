"""Lessons a submission carries (``extensions.lessons``): checked before
the submission is recorded and made in its transaction, so they commit
with it or not at all.

Each is a :class:`~.schemas.CarriedLesson`: it lives in the task's project
(``common: true`` puts it in the space's common collection) and its
sources start with the task, the attempt and the submission; an artifact
it names must be one the submission hands in.
"""

from __future__ import annotations

from typing import Any

from buildmax_hookspecs import Actor, App, AttemptRef, SubmissionRef, TaskRef, Transaction, Verdict
from marshmallow import ValidationError

from buildmax.spaces import space_pk

from . import lessons as domain
from .problems import BadSource
from .schemas import MAX_CARRIED, CarriedLesson

#: The name under which a submission carries lessons.
EXTENSION = "lessons"


def _parsed(value: Any) -> list[dict[str, Any]]:
    """The carried lessons, validated; ``ValueError`` saying what is wrong."""
    if not isinstance(value, list):
        raise ValueError("extensions.lessons is a list of lessons")
    if len(value) > MAX_CARRIED:
        raise ValueError(f"a submission carries at most {MAX_CARRIED} lessons")
    try:
        return list(CarriedLesson(many=True).load(value))
    except ValidationError as exc:
        raise ValueError(f"extensions.lessons does not validate: {exc.messages}") from None


async def check(
    app: App, tx: Transaction, task: TaskRef, submission: SubmissionRef
) -> Verdict | None:
    """Refuse a submission whose lessons do not validate, or name records
    that are not its space's (artifacts: not the submission's)."""
    if EXTENSION not in submission.extensions:
        return None
    try:
        carried = _parsed(submission.extensions[EXTENSION])
    except ValueError as exc:
        return Verdict("deny", str(exc))
    for lesson in carried:
        for source in lesson["sources"]:
            if source["type"] == "artifact" and source["id"] not in submission.artifacts:
                return Verdict(
                    "deny", f"lesson source artifact {source['id']!r} is not one this submits"
                )
        named = [s for s in lesson["sources"] if s.get("id") != submission.id]
        try:
            await domain.check_sources(app, tx, task.space_id, named)
        except BadSource as exc:
            return Verdict("deny", f"a lesson's source: {exc.detail}")
    return None


async def record(
    app: App,
    tx: Transaction,
    task: TaskRef,
    attempt: AttemptRef,
    submission: SubmissionRef,
    actor: Actor,
) -> None:
    """Make the submission's lessons, in its transaction."""
    if EXTENSION not in submission.extensions:
        return
    carried = _parsed(submission.extensions[EXTENSION])
    found = await space_pk(tx, task.space_id)
    assert found is not None, "a submitted task's space exists"
    own = [
        {"type": "task", "id": task.id},
        {"type": "attempt", "id": attempt.id},
        {"type": "submission", "id": submission.id},
    ]
    for lesson in carried:
        given = [s for s in lesson["sources"] if s not in own]
        data = {**lesson, "sources": own + given}
        await domain.create(
            app,
            tx,
            actor,
            (found, task.space_id),
            None if lesson["common"] else task.project_id,
            data,
            via={"submission_id": submission.id, "task_id": task.id},
        )
