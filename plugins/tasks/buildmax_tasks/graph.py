"""Task dependencies: edges task -> prerequisite, checked for cycles inside
the write transaction that adds them.

The cycle check is one recursive query over the whole graph (everything the
new prerequisite depends on, transitively). Edits of one space's graph take
a named lock, so two concurrent edges cannot close a cycle between them on
PostgreSQL; the prerequisite's row is locked too, so its completion cannot
slip between the readiness check and the commit.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from buildmax.database.locks import lock

from .change import Change
from .lifecycle import reopen, set_task
from .problems import DependencyCycle, InvalidState
from .rows import TaskRow
from .tables import dependencies, tasks

#: Tasks whose prerequisites may still change.
EDITABLE = ("open", "ready")


async def reaches(ch: Change, start_pk: int, target_pk: int) -> bool:
    """True when ``target_pk`` is ``start_pk`` or one of its transitive prerequisites."""
    if start_pk == target_pk:
        return True
    reach = (
        sa.select(dependencies.c.prerequisite_id.label("id"))
        .where(dependencies.c.task_id == start_pk)
        .cte("reach", recursive=True)
    )
    step = sa.select(dependencies.c.prerequisite_id).join(
        reach, dependencies.c.task_id == reach.c.id
    )
    reach = reach.union(step)
    query = sa.select(reach.c.id).where(reach.c.id == target_pk).limit(1)
    if ch.tx.dialect != "postgresql":
        return await ch.tx.fetch_val(query) is not None
    # Each step must be an index lookup of the last step's ids. Without
    # statistics on the table (a graph loaded faster than autovacuum
    # analyses it) PostgreSQL hash-joins a full scan of the edges at every
    # step instead: quadratic, seconds on a 5,000-task chain.
    for setting in ("enable_hashjoin", "enable_mergejoin"):
        await ch.tx.execute(sa.text(f"SET LOCAL {setting} = off"))
    found = await ch.tx.fetch_val(query)
    for setting in ("enable_hashjoin", "enable_mergejoin"):
        await ch.tx.execute(sa.text(f"SET LOCAL {setting} TO DEFAULT"))
    return found is not None


async def add_dependency(ch: Change, task: TaskRow, prerequisite: TaskRow) -> bool:
    """Add ``task -> prerequisite``; ``False`` when the edge already exists.
    The caller holds :func:`lock_graph`, taken before any task row.

    Refuses a cycle (409) and a task that is no longer open or ready."""
    if task.state not in EDITABLE:
        raise InvalidState(
            f"the task is {task.state}; prerequisites change only while it is open or ready"
        )
    exists = await ch.tx.fetch_val(
        sa.select(dependencies.c.task_id).where(
            dependencies.c.task_id == task.pk,
            dependencies.c.prerequisite_id == prerequisite.pk,
        )
    )
    if exists is not None:
        return False
    if await reaches(ch, prerequisite.pk, task.pk):
        raise DependencyCycle(
            "the prerequisite already depends on this task, directly or through others",
            task_id=task.id,
            prerequisite_id=prerequisite.id,
        )
    await ch.tx.execute(
        dependencies.insert().values(
            task_id=task.pk, prerequisite_id=prerequisite.pk, created_at=ch.now
        )
    )
    if prerequisite.state != "done" and task.state == "ready":
        await set_task(ch, task.pk, state="open")
        await ch.event("task.state", task_id=task.id, state="open")
    return True


async def remove_dependency(ch: Change, task: TaskRow, prerequisite: TaskRow) -> bool:
    """Remove ``task -> prerequisite``; ``False`` when there was no such edge.
    The caller holds :func:`lock_graph`, taken before any task row."""
    if task.state not in EDITABLE:
        raise InvalidState(
            f"the task is {task.state}; prerequisites change only while it is open or ready"
        )
    removed = await ch.tx.fetch_all(
        sa.delete(dependencies)
        .where(
            dependencies.c.task_id == task.pk,
            dependencies.c.prerequisite_id == prerequisite.pk,
        )
        .returning(dependencies.c.task_id)
    )
    if not removed:
        return False
    if task.state == "open":
        await reopen(ch, task)
    return True


async def lock_graph(ch: Change) -> None:
    """Take the space's graph lock (task creation with prerequisites)."""
    await lock(ch.tx, "task_graph", ch.space_pk)


def prerequisite_ids_query(task_pk: int) -> Any:
    """The public ids and states of a task's prerequisites."""
    prereq = tasks.alias("prereq")
    return (
        sa.select(prereq.c.public_id, prereq.c.state, prereq.c.title)
        .select_from(dependencies.join(prereq, prereq.c.id == dependencies.c.prerequisite_id))
        .where(dependencies.c.task_id == task_pk)
        .order_by(prereq.c.public_id)
    )


def dependent_ids_query(task_pk: int) -> Any:
    """The public ids and states of the tasks that depend on a task."""
    dependent = tasks.alias("dependent")
    return (
        sa.select(dependent.c.public_id, dependent.c.state, dependent.c.title)
        .select_from(dependencies.join(dependent, dependent.c.id == dependencies.c.task_id))
        .where(dependencies.c.prerequisite_id == task_pk)
        .order_by(dependent.c.public_id)
    )
