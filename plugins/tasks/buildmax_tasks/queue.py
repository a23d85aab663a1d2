"""The ``TaskQueue`` service: what other plugins may read and ask of the queue."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import (
    Actor,
    AgentRevisionRef,
    AttemptRef,
    SubmissionRef,
    TaskRef,
    Transaction,
)

from buildmax.schema import principals, spaces

from .change import Change
from .decisions import open_decision
from .engine import current_policy
from .records import (
    AGENT_REVISION_SELECT,
    ATTEMPT_SELECT,
    SUBMISSION_SELECT,
    TASK_SELECT,
    agent_revision_ref,
    attempt_ref,
    load_task,
    submission_ref,
    task_ref,
)
from .schema import agent_plugins, agent_revisions, agents, attempts, projects, submissions, tasks


class SqlTaskQueue:
    """:class:`buildmax_hookspecs.TaskQueue` over the tasks plugin's tables."""

    def __init__(self, app: Any) -> None:
        self._app = app

    async def task(self, conn: Transaction, task_id: str) -> TaskRef | None:
        row = await load_task(conn, task_id)
        return task_ref(row) if row is not None else None

    async def attempt(self, conn: Transaction, attempt_id: str) -> AttemptRef | None:
        row = await conn.fetch_one(ATTEMPT_SELECT.where(attempts.c.public_id == attempt_id))
        return attempt_ref(dict(row)) if row is not None else None

    async def submission(self, conn: Transaction, submission_id: str) -> SubmissionRef | None:
        row = await conn.fetch_one(
            SUBMISSION_SELECT.where(submissions.c.public_id == submission_id)
        )
        return submission_ref(dict(row)) if row is not None else None

    async def submissions(self, conn: Transaction, task_id: str) -> Sequence[SubmissionRef]:
        rows = await conn.fetch_all(
            SUBMISSION_SELECT.where(tasks.c.public_id == task_id).order_by(submissions.c.id)
        )
        return [submission_ref(dict(r)) for r in rows]

    async def policy(self, conn: Transaction, project_id: str) -> Mapping[str, Any]:
        pk = await conn.fetch_val(
            sa.select(projects.c.id).where(projects.c.public_id == project_id)
        )
        if pk is None:
            raise LookupError(f"no project {project_id!r}")
        return await current_policy(conn, pk)

    async def agent_revision(self, conn: Transaction, revision_id: str) -> AgentRevisionRef | None:
        row = await conn.fetch_one(
            AGENT_REVISION_SELECT.where(agent_revisions.c.public_id == revision_id)
        )
        return agent_revision_ref(dict(row)) if row is not None else None

    async def agents_naming(
        self, conn: Transaction, space_id: str, plugin: str
    ) -> Sequence[AgentRevisionRef]:
        rows = await conn.fetch_all(
            AGENT_REVISION_SELECT.join(
                agent_plugins, agent_plugins.c.revision_id == agent_revisions.c.id
            )
            .where(
                spaces.c.public_id == space_id,
                agent_plugins.c.plugin == plugin,
                agents.c.current_revision_id == agent_revisions.c.id,
            )
            .order_by(agents.c.name)
        )
        return [agent_revision_ref(dict(r)) for r in rows]

    async def linked_work(self, conn: Transaction, submission_id: str) -> Sequence[TaskRef]:
        pk = await conn.fetch_val(
            sa.select(submissions.c.id).where(submissions.c.public_id == submission_id)
        )
        if pk is None:
            return []
        rows = await conn.fetch_all(
            TASK_SELECT.where(tasks.c.subject_submission_id == pk).order_by(tasks.c.id)
        )
        return [task_ref(dict(row)) for row in rows]

    async def open_decision(
        self,
        tx: Transaction,
        task_id: str,
        *,
        question: str,
        options: Sequence[str],
        actor: Actor,
        answerable_by: str = "human",
        expires_at: int | None = None,
    ) -> str:
        task = await load_task(tx, task_id)
        if task is None:
            raise LookupError(f"no task {task_id!r}")
        ch = Change(
            app=self._app,
            tx=tx,
            actor=actor,
            space_pk=task["space_id"],
            space_id=task["space_public_id"],
            now=self._app.clock.now_ms(),
        )
        opener = None
        if actor.principal_id is not None:
            opener = await tx.fetch_val(
                sa.select(principals.c.id).where(principals.c.public_id == actor.principal_id)
            )
        return await open_decision(
            ch,
            task,
            question=question,
            options=list(options),
            answerable_by=answerable_by,
            expires_at=expires_at,
            opened_by=opener,
        )
