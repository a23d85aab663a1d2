"""The tasks plugin in a restore's new epoch.

Every attempt active in the backup belongs to an agent whose token the
restore revoked: it is ended (``expired``, not charged to the task's
attempts) and its task goes back to the queue, where the next claim
recovers it. Every task's generation is raised by the restore's stride, so
the next claim's generation is past any handed out between the backup and
the restore (a fenced writer never sees a generation twice).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa
from buildmax_hookspecs import SYSTEM_ACTOR, Restoration, Transaction

from .change import Change
from .lifecycle import after_attempt, end_attempt
from .records import ATTEMPT_SELECT, load_task_by_pk
from .rows import AttemptRow
from .tables import attempts, tasks

if TYPE_CHECKING:
    from buildmax.app import BuildMax

REASON = "the deployment was restored from a backup: a new authority epoch began"


async def enter_epoch(app: BuildMax, tx: Transaction, restoration: Restoration) -> list[str]:
    """End every active attempt and raise every generation (see the module docstring)."""
    rows = await tx.fetch_all(
        ATTEMPT_SELECT.where(attempts.c.state == "active").order_by(attempts.c.id)
    )
    for attempt in map(AttemptRow.of, rows):
        ch = Change(app, tx, SYSTEM_ACTOR, attempt.space_pk, attempt.space_id, restoration.now)
        task = await load_task_by_pk(tx, attempt.task_pk, for_update=True)
        await end_attempt(ch, attempt, "expired", REASON, charge=False)
        await ch.audit(
            "attempt.expired",
            "attempt",
            attempt.id,
            task_id=task.id,
            generation=attempt.generation,
            charged=False,
            reason=REASON,
        )
        await ch.event("attempt.expired", attempt_id=attempt.id, task_id=task.id)
        if task.state == "claimed" and task.current_attempt_pk == attempt.pk:
            await after_attempt(ch, task, charged=False)
    raised = len(
        await tx.fetch_all(
            sa.update(tasks)
            .values(generation=tasks.c.generation + restoration.generation_stride)
            .returning(tasks.c.id)
        )
    )
    return [
        f"tasks: {len(rows)} active attempt(s) ended, their tasks back in the queue; "
        f"the generation of {raised} task(s) raised by {restoration.generation_stride}"
    ]
