"""What an operator watches of reviews: the review work waiting, per space,
and the work that has waited longer than ``attention_wait_seconds``.

Review work is waiting from the moment its work item is created until a
review is recorded on it, while the work item is still to be done (ready,
claimed or held back): what ``GET /v1/spaces/{s}/reviews?pending=true``
lists, for review work. Both readings start from ``review_waiting``, which
holds review work nothing was recorded on (see :mod:`.tables`), and ask the
task queue, a few hundred ids at a time, which of those work items are
still open: the cost follows the backlog, not the history.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import App, Attention, Gauge, TaskQueue, Transaction

from buildmax.diagnostics import MAX_SPACES, OTHER_SPACES, per_space_gauges
from buildmax.services import ServiceMissing

from .settings import review_settings
from .tables import activities, waiting

#: ``review.waiting`` items listed at most (the oldest first).
MAX_ITEMS = 100
#: Work item ids asked of the task queue at once.
BATCH = 500
#: Work item states in which nothing more will be recorded on it.
FINISHED = ("done", "canceled", "failed")

_WAITING = sa.select(
    waiting.c.activity_id,
    waiting.c.space_id,
    waiting.c.created_at,
    activities.c.work_task_id,
    activities.c.subject_task_id,
    activities.c.slot,
).select_from(waiting.join(activities, activities.c.id == waiting.c.activity_id))


async def gauges(app: App, conn: Transaction) -> list[Gauge]:
    """``buildmax_reviews_waiting`` per space: the :data:`MAX_SPACES`
    spaces with the most, by slug, and the rest summed under ``(other)``."""
    queue = _queue(app)
    if queue is None:
        return []
    rows = await conn.fetch_all(_WAITING)
    counts = Counter(int(r["space_id"]) for r in await _still_open(conn, queue, rows))
    return await per_space_gauges(
        conn,
        "buildmax_reviews_waiting",
        f"Review work waiting for its review, per space (the {MAX_SPACES} spaces with the "
        f"most; the rest as {OTHER_SPACES})",
        counts,
    )


async def attention(app: App, conn: Transaction, now: int, space_pk: int | None) -> list[Attention]:
    """``review.waiting``: review work that has waited longer than
    ``attention_wait_seconds``, at most :data:`MAX_ITEMS`, the oldest first.

    Members see it: members claim and record reviews."""
    queue = _queue(app)
    if queue is None:
        return []
    wait_ms = review_settings(app).attention_wait_seconds * 1000
    query = _WAITING.where(waiting.c.created_at <= now - wait_ms)
    if space_pk is not None:
        query = query.where(waiting.c.space_id == space_pk)
    query = query.order_by(waiting.c.created_at, waiting.c.activity_id).limit(MAX_ITEMS)
    found: list[Any] = []
    after: tuple[int, int] | None = None
    # Page on: a slot whose work item was canceled keeps its row, and is
    # skipped here rather than counted against the bound.
    while len(found) < MAX_ITEMS:
        page = query
        if after is not None:
            page = page.where(
                sa.tuple_(waiting.c.created_at, waiting.c.activity_id) > sa.tuple_(*after)
            )
        rows = await conn.fetch_all(page)
        found += await _still_open(conn, queue, rows)
        if len(rows) < MAX_ITEMS:
            break
        after = (rows[-1]["created_at"], rows[-1]["activity_id"])
    return [_waited(row, now) for row in found[:MAX_ITEMS]]


def _waited(row: Any, now: int) -> Attention:
    minutes = (now - int(row["created_at"])) // 60_000
    return Attention(
        "review.waiting",
        f"review work {row['work_task_id']} (slot {int(row['slot']) + 1}) of task "
        f"{row['subject_task_id']} has waited {minutes} minutes for its review",
        int(row["created_at"]),
        int(row["space_id"]),
        role="member",
        target=("task", row["work_task_id"]),
    )


def _queue(app: App) -> TaskQueue | None:
    try:
        return app.services.get(TaskQueue)
    except ServiceMissing:
        return None  # without the tasks plugin no review work is created


async def _still_open(conn: Transaction, queue: TaskQueue, rows: Sequence[Any]) -> list[Any]:
    """The ``rows`` whose work item is still to be done."""
    found = []
    for start in range(0, len(rows), BATCH):
        part = rows[start : start + BATCH]
        tasks = await queue.tasks(conn, [r["work_task_id"] for r in part])
        for row in part:
            task = tasks.get(row["work_task_id"])
            if task is not None and task.state not in FINISHED:
                found.append(row)
    return found
