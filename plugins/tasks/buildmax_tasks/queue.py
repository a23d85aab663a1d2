"""The ``TaskQueue`` service: what other plugins may read and ask of the queue."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from buildmax_hookspecs import (
    Actor,
    AgentRevisionRef,
    AttemptRef,
    ImportedTask,
    ProjectRef,
    SourceRecord,
    SubmissionRef,
    TaskRef,
    Transaction,
)

from buildmax.problems import Forbidden, NotFound
from buildmax.spaces import member_role
from buildmax.tables import principals, spaces

from .attempts import fenced, submit
from .authority import Authority, authority
from .change import Change
from .claims import claim_named
from .decisions import open_decision
from .engine import policy_of_project, stage_engine
from .imported import add_links, import_record
from .problems import NotAttemptOwner, TaskNotClaimable
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
from .rows import AgentRevisionRow, AttemptRow, SubmissionRow, TaskRow
from .settings import task_settings
from .tables import (
    agent_plugins,
    agent_revisions,
    agents,
    attempts,
    projects,
    submissions,
    tasks,
)

if TYPE_CHECKING:
    from buildmax.app import BuildMax


class SqlTaskQueue:
    """:class:`buildmax_hookspecs.TaskQueue` over the tasks plugin's tables."""

    def __init__(self, app: BuildMax) -> None:
        self._app = app
        # The change each transaction imports in, by space, actor and
        # override: one per chunk, so its events are published together.
        self._imports: dict[int, dict[tuple[str, str | None, bool], tuple[Change, Authority]]] = {}

    async def task(self, conn: Transaction, task_id: str) -> TaskRef | None:
        row = await load_task(conn, task_id)
        return task_ref(row) if row is not None else None

    async def attempt(self, conn: Transaction, attempt_id: str) -> AttemptRef | None:
        row = await conn.fetch_one(ATTEMPT_SELECT.where(attempts.c.public_id == attempt_id))
        return attempt_ref(AttemptRow.of(row)) if row is not None else None

    async def submission(self, conn: Transaction, submission_id: str) -> SubmissionRef | None:
        row = await conn.fetch_one(
            SUBMISSION_SELECT.where(submissions.c.public_id == submission_id)
        )
        return submission_ref(SubmissionRow.of(row)) if row is not None else None

    async def submissions(self, conn: Transaction, task_id: str) -> Sequence[SubmissionRef]:
        rows = await conn.fetch_all(
            SUBMISSION_SELECT.where(tasks.c.public_id == task_id).order_by(submissions.c.id)
        )
        return [submission_ref(SubmissionRow.of(r)) for r in rows]

    async def project(self, conn: Transaction, space_id: str, ref: str) -> ProjectRef | None:
        row = await conn.fetch_one(
            sa.select(projects.c.public_id, projects.c.name)
            .join(spaces, spaces.c.id == projects.c.space_id)
            .where(
                spaces.c.public_id == space_id,
                sa.or_(projects.c.public_id == ref, projects.c.name == ref),
            )
        )
        return ProjectRef(row["public_id"], space_id, row["name"]) if row is not None else None

    async def policy(self, conn: Transaction, project_id: str) -> Mapping[str, Any]:
        policy = await policy_of_project(conn, project_id)
        if policy is None:
            raise LookupError(f"no project {project_id!r}")
        return policy

    async def agent_revision(self, conn: Transaction, revision_id: str) -> AgentRevisionRef | None:
        row = await conn.fetch_one(
            AGENT_REVISION_SELECT.where(agent_revisions.c.public_id == revision_id)
        )
        return agent_revision_ref(AgentRevisionRow.of(row)) if row is not None else None

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
        return [agent_revision_ref(AgentRevisionRow.of(r)) for r in rows]

    async def agents(self, conn: Transaction, space_id: str) -> Sequence[AgentRevisionRef]:
        rows = await conn.fetch_all(
            AGENT_REVISION_SELECT.where(
                spaces.c.public_id == space_id,
                agents.c.current_revision_id == agent_revisions.c.id,
            ).order_by(agents.c.name)
        )
        return [agent_revision_ref(AgentRevisionRow.of(r)) for r in rows]

    async def tasks(self, conn: Transaction, task_ids: Sequence[str]) -> Mapping[str, TaskRef]:
        if not task_ids:
            return {}
        rows = await conn.fetch_all(TASK_SELECT.where(tasks.c.public_id.in_(list(task_ids))))
        return {row["id"]: task_ref(TaskRow.of(row)) for row in rows}

    async def sourced(
        self, conn: Transaction, space_id: str, system: str, source_ids: Sequence[str]
    ) -> Mapping[str, TaskRef]:
        if not source_ids:
            return {}
        rows = await conn.fetch_all(
            TASK_SELECT.where(
                tasks.c.space_id
                == sa.select(spaces.c.id).where(spaces.c.public_id == space_id).scalar_subquery(),
                tasks.c.source_system == system,
                tasks.c.source_id.in_(sa.bindparam("ids", expanding=True)),
            ),
            {"ids": list(source_ids)},
        )
        return {row["source_id"]: task_ref(TaskRow.of(row)) for row in rows}

    async def attempts(self, conn: Transaction, task_id: str) -> Sequence[AttemptRef]:
        rows = await conn.fetch_all(
            ATTEMPT_SELECT.where(tasks.c.public_id == task_id).order_by(attempts.c.generation)
        )
        return [attempt_ref(AttemptRow.of(r)) for r in rows]

    async def fence(
        self,
        tx: Transaction,
        attempt_id: str,
        generation: int,
        *,
        actor: Actor,
        space_id: str,
        override_reason: str | None = None,
    ) -> AttemptRef:
        ch, principal_pk = await self._space_change(
            tx,
            space_id,
            actor,
            NotFound("no such attempt in this space"),
            NotAttemptOwner("only a principal acts on an attempt"),
        )
        role = await member_role(tx, ch.space_pk, principal_pk)
        row, _ = await fenced(
            ch, attempt_id, generation, authority(principal_pk, actor, role, override_reason)
        )
        return attempt_ref(row)

    async def hand_in(
        self,
        tx: Transaction,
        task_id: str,
        *,
        actor: Actor,
        summary: str,
        candidate: Mapping[str, Any],
        generation: int | None = None,
        extensions: Mapping[str, Any] | None = None,
    ) -> Mapping[str, Any]:
        # The caller checked the actor's role in the task's space.
        task = await load_task(tx, task_id)
        if task is None:
            raise NotFound("no such task")
        ch = self._change(tx, actor, task)
        principal_pk = await tx.fetch_val(
            sa.select(principals.c.id).where(principals.c.public_id == actor.principal_id)
        )
        if principal_pk is None:
            raise NotAttemptOwner("only a principal hands in work")
        # Hands in its own work only: nobody overrides here.
        by = replace(authority(principal_pk, actor, None, None), may_override=False)
        active = await tx.fetch_one(
            ATTEMPT_SELECT.where(attempts.c.task_id == task.pk, attempts.c.state == "active")
        )
        held = AttemptRow.of(active) if active is not None else None
        if held is not None and held.claimant_pk == principal_pk:
            attempt_id, at = held.id, generation or held.generation
        elif actor.kind == "human" and by.scope_id is None and generation is None:
            settings = task_settings(self._app)
            claim = await claim_named(ch, principal_pk, task_id, settings.lease_seconds * 1000)
            attempt_id, at = claim.attempt.id, claim.attempt.generation
        elif held is not None:
            raise NotAttemptOwner("another principal holds this task's attempt")
        else:
            raise TaskNotClaimable(
                "claim the task before handing in its work (only a human claims and hands "
                "in at once)",
                state=task.state,
            )
        row, locked = await fenced(ch, attempt_id, at, by)
        body = {
            "summary": summary,
            "candidate": dict(candidate),
            "evidence": {},
            "artifacts": [],
            "extensions": dict(extensions or {}),
        }
        submission, _ = await submit(ch, stage_engine(self._app), row, locked, body)
        after = await load_task(tx, task_id)
        assert after is not None
        return {
            "submission_id": submission.id,
            "attempt_id": attempt_id,
            "generation": row.generation,
            "task_state": after.state,
        }

    def _change(self, tx: Transaction, actor: Actor, task: TaskRow) -> Change:
        return Change(
            app=self._app,
            tx=tx,
            actor=actor,
            space_pk=task.space_pk,
            space_id=task.space_id,
            now=self._app.clock.now_ms(),
        )

    async def linked_work(self, conn: Transaction, submission_id: str) -> Sequence[TaskRef]:
        pk = await conn.fetch_val(
            sa.select(submissions.c.id).where(submissions.c.public_id == submission_id)
        )
        if pk is None:
            return []
        rows = await conn.fetch_all(
            TASK_SELECT.where(tasks.c.subject_submission_id == pk).order_by(tasks.c.id)
        )
        return [task_ref(TaskRow.of(row)) for row in rows]

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
        ch = self._change(tx, actor, task)
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

    async def import_record(
        self,
        tx: Transaction,
        record: SourceRecord,
        *,
        system: str,
        space_id: str,
        project_id: str,
        actor: Actor,
        task_id: str | None,
        revision: int | None,
        prerequisites: Sequence[str],
        links: Sequence[tuple[str, str]],
        hold: bool = True,
        admin_override: bool = False,
    ) -> ImportedTask:
        ch, importer = await self._importing(tx, space_id, actor, admin_override)
        return await import_record(
            ch,
            importer,
            record,
            system=system,
            project_id=project_id,
            task=None if task_id is None else (task_id, revision),
            prerequisites=prerequisites,
            links=links,
            hold=hold,
        )

    async def relink(
        self,
        tx: Transaction,
        task_id: str,
        links: Sequence[tuple[str, str]],
        *,
        actor: Actor,
        admin_override: bool = False,
    ) -> bool:
        task = await load_task(tx, task_id)
        if task is None:
            raise NotFound("no such task")
        ch, _ = await self._importing(tx, task.space_id, actor, admin_override)
        return await add_links(ch, task_id, links)

    async def _space_change(
        self,
        tx: Transaction,
        space_id: str,
        actor: Actor,
        no_space: Exception,
        no_principal: Exception,
    ) -> tuple[Change, int]:
        """A change in ``space_id`` by ``actor`` and the actor's principal;
        ``no_space`` or ``no_principal`` raised when either is missing."""
        space = await tx.fetch_one(
            sa.select(spaces.c.id, spaces.c.public_id).where(spaces.c.public_id == space_id)
        )
        if space is None:
            raise no_space
        principal_pk = await tx.fetch_val(
            sa.select(principals.c.id).where(principals.c.public_id == actor.principal_id)
        )
        if principal_pk is None:
            raise no_principal
        now = self._app.clock.now_ms()
        return Change(self._app, tx, actor, space["id"], space["public_id"], now), principal_pk

    def _forget(self, tx_id: int) -> Callable[[], Awaitable[None]]:
        """What forgets the import change of a transaction that rolled back."""

        async def forget() -> None:
            self._imports.pop(tx_id, None)

        return forget

    async def _importing(
        self, tx: Transaction, space_id: str, actor: Actor, admin_override: bool
    ) -> tuple[Change, Authority]:
        """A change by ``actor`` importing into ``space_id`` (the caller
        checked the role), who overrides no one's attempt: the same for
        every record a transaction imports."""
        key = (space_id, actor.principal_id, admin_override)
        if id(tx) not in self._imports:
            self._imports[id(tx)] = {}
            tx.after_commit(lambda: self._imports.pop(id(tx), None))
            tx.after_rollback(self._forget(id(tx)))
        made = self._imports[id(tx)]
        if key not in made:
            ch, principal_pk = await self._space_change(
                tx,
                space_id,
                actor,
                NotFound("no such space"),
                Forbidden("only a principal imports tasks"),
            )
            ch.admin_override = admin_override
            made[key] = (ch, Authority(principal_pk, may_override=False))
        return made[key]
