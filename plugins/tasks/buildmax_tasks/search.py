"""Task search: a full-text index of each task's title and acceptance
criteria (:mod:`buildmax.fulltext`), kept in the transaction that creates
or revises the task, and the ranked search the task list answers ``q``
with.

Stage work (the review and integration items the stage engine creates for
a submission) is not indexed: its title names its subject task, which is,
and indexing it would cost every submission a statement per item. The
index is never a second source of truth: :func:`rebuild` makes it again
from the tables (``buildmax task reindex``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Transaction

from buildmax.fulltext import Query, TextIndex

from .tables import task_revisions, tasks

#: The index of tasks' current title and criteria (title weighs most).
TASK_SEARCH = TextIndex("task_search", ("title", "criteria"))

#: Every indexed task's key, space, title and current criteria: what
#: :func:`rebuild` indexes.
_INDEXED = (
    sa.select(tasks.c.id, tasks.c.space_id, tasks.c.title, task_revisions.c.criteria)
    .select_from(
        tasks.join(
            task_revisions,
            sa.and_(
                task_revisions.c.task_id == tasks.c.id,
                task_revisions.c.number == tasks.c.revision,
            ),
        )
    )
    .where(tasks.c.subject_task_id.is_(None))
)


async def index_task(
    tx: Transaction, task_pk: int, space_pk: int, title: str, criteria: str
) -> None:
    """Index (or index again) a task with its current title and criteria:
    one statement, in the caller's transaction."""
    await TASK_SEARCH.put(tx, task_pk, space_pk, {"title": title, "criteria": criteria})


async def create_index(tx: Transaction) -> None:
    """Create the index and index every task there is (a migration's step)."""
    await TASK_SEARCH.create(tx)
    await TASK_SEARCH.fill(tx, _INDEXED)


async def rebuild(tx: Transaction) -> int:
    """Empty the index and index every task again from the tables; how
    many tasks it holds now."""
    await TASK_SEARCH.clear(tx)
    await TASK_SEARCH.fill(tx, _INDEXED)
    count = await tx.fetch_val(sa.select(sa.func.count()).select_from(sa.table(TASK_SEARCH.name)))
    return int(count)


async def ranked_matches(
    conn: Transaction,
    space_pk: int,
    query: Query,
    conditions: Sequence[Any],
    project_pk: int | None,
    offset: int,
    limit: int,
) -> list[int]:
    """The keys of the space's tasks matching ``query`` and every one of
    ``conditions`` (and of project ``project_pk``), most relevant first
    (ties: the newer first) among the newest
    :data:`~buildmax.fulltext.RANKED_MATCHES` of them: ``limit`` from
    ``offset``. :func:`snippets` gives those of the matches shown."""
    if project_pk is not None:
        conditions = [*conditions, tasks.c.project_id == project_pk]
    matches = TASK_SEARCH.matches(
        conn.dialect, space_pk, query, key=tasks.c.id, space=tasks.c.space_id, conditions=conditions
    )
    ranked = (
        sa.select(matches.c.key)
        .order_by(matches.c.rank.desc(), matches.c.key.desc())
        .limit(limit)
        .offset(offset)
    )
    return [int(row["key"]) for row in await conn.fetch_all(ranked)]


async def snippets(
    conn: Transaction, space_pk: int, query: Query, task_pks: Sequence[int]
) -> dict[int, str]:
    """The snippet of each of the tasks ``task_pks`` (of space
    ``space_pk``) that match ``query``, by key."""
    return await TASK_SEARCH.snippets(conn, space_pk, query, task_pks)
