"""The artifacts a submission names: live artifacts of its own task.

The tasks plugin asks ``buildmax_submission_check`` before it records a
submission; this plugin refuses one naming an artifact that is not evidence
of that work. An artifact qualifies when it is live (not deleted or
expired) in the task's space, linked to the task, and either linked to the
submitting attempt or to no attempt (attached to the task by a member). An
artifact of another attempt of the same task is refused: it is not this
run's evidence. An artifact of another space is reported exactly like one
that does not exist.
"""

from __future__ import annotations

import sqlalchemy as sa
from buildmax_hookspecs import AttemptRef, Row, SubmissionRef, TaskRef, Transaction, Verdict

from buildmax.tables import spaces

from .tables import artifacts

_NAMED = sa.select(
    artifacts.c.public_id,
    artifacts.c.task_id,
    artifacts.c.attempt_id,
    artifacts.c.deleted_at,
).select_from(artifacts.join(spaces, spaces.c.id == artifacts.c.space_id))


def _refusal(row: Row | None, artifact_id: str, task: TaskRef, attempt: AttemptRef) -> str | None:
    """Why the artifact is not evidence of ``attempt``'s work, or ``None``."""
    if row is None:
        return f"no artifact {artifact_id} in this space"
    if row["deleted_at"] is not None:
        return f"artifact {artifact_id} was deleted"
    if row["task_id"] != task.id:
        return f"artifact {artifact_id} is not linked to this task"
    if row["attempt_id"] not in (None, attempt.id):
        return f"artifact {artifact_id} was attached to another attempt"
    return None


async def submission_check(
    tx: Transaction, task: TaskRef, attempt: AttemptRef, submission: SubmissionRef
) -> Verdict | None:
    """Refuse a submission naming an artifact that is not evidence of its
    work, naming every such artifact in the order given."""
    if not submission.artifacts:
        return None
    rows = await tx.fetch_all(
        _NAMED.where(
            spaces.c.public_id == task.space_id,
            artifacts.c.public_id.in_(list(submission.artifacts)),
        )
    )
    found = {row["public_id"]: row for row in rows}
    reasons = [
        reason
        for artifact_id in submission.artifacts
        if (reason := _refusal(found.get(artifact_id), artifact_id, task, attempt)) is not None
    ]
    return Verdict("deny", "; ".join(reasons)) if reasons else None
