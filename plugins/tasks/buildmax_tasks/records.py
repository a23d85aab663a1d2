"""Reading tasks, attempts, submissions, agent revisions, projects, holds
and decisions into their rows (:mod:`buildmax_tasks.rows`), and turning rows into the
contract's records (:class:`TaskRef`, :class:`AttemptRef`, ...).

Every lookup is scoped by space: a public id of another space finds nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import AgentRevisionRef, AttemptRef, SubmissionRef, TaskRef, Transaction

from buildmax.pagination import older_than
from buildmax.problems import NotFound, ValidationFailed
from buildmax.tables import keyed, principals, spaces

from .rows import (
    AgentRevisionRow,
    AgentRow,
    AttemptRow,
    ProjectRow,
    SubmissionRow,
    TaskRow,
)
from .tables import (
    TASK_STATES,
    agent_revisions,
    agents,
    attempts,
    decisions,
    holds,
    projects,
    submission_artifacts,
    submissions,
    task_revisions,
    tasks,
)

_subject = tasks.alias("subject")
_current_submission = submissions.alias("current_submission")


def _public_id(table: sa.FromClause, key: Any) -> Any:
    """The public id of the row of ``table`` whose key is ``key`` (``NULL``
    for none): a subquery of its own, not a join. PostgreSQL plans each
    such subquery apart, in a fraction of a millisecond, where the same
    lookups as joins took it 12-16 ms to plan for every task list."""
    return sa.select(table.c.public_id).where(table.c.id == key).scalar_subquery()


#: A task with the public ids of everything it points at (:class:`TaskRow`).
TASK_SELECT = sa.select(
    *keyed(tasks),
    _public_id(spaces, tasks.c.space_id).label("space_id"),
    projects.c.public_id.label("project_id"),
    _public_id(agents, tasks.c.agent_id).label("agent_id"),
    _public_id(_subject, tasks.c.subject_task_id).label("subject_task_id"),
    _public_id(submissions, tasks.c.subject_submission_id).label("subject_submission_id"),
    _public_id(attempts, tasks.c.current_attempt_id).label("current_attempt_id"),
    _public_id(_current_submission, tasks.c.current_submission_id).label("current_submission_id"),
    task_revisions.c.body,
    task_revisions.c.criteria,
).select_from(
    tasks.join(projects, projects.c.id == tasks.c.project_id).join(
        task_revisions,
        sa.and_(
            task_revisions.c.task_id == tasks.c.id, task_revisions.c.number == tasks.c.revision
        ),
    )
)


def task_list_statement(
    space_pk: int,
    conditions: Sequence[Any],
    limit: int,
    after: str | None,
    *,
    project_pk: int | None = None,
) -> Any:
    """A page of the space's tasks matching ``conditions``, newest first
    (``after``: the public id of the last task of the page before), read
    from an index in that order without sorting the space's history:
    ``task_tasks_space`` (or the state's), or with ``project_pk`` the
    project's (or the project's in a state). A project's tasks are kept to
    the space by the project's own space, not the task's, so that no engine
    walks the whole space (SQLite, which keeps no statistics, did) to find
    a small project's tasks."""
    if project_pk is None:
        where = [tasks.c.space_id == space_pk]
    else:
        where = [tasks.c.project_id == project_pk, projects.c.space_id == space_pk]
    query = TASK_SELECT.where(*where, *conditions).order_by(tasks.c.id.desc()).limit(limit)
    return query if after is None else query.where(older_than(tasks, after))


async def count_by_state(
    conn: Transaction, space_pk: int, project_pk: int | None = None
) -> dict[str, int]:
    """How many of the space's tasks (or one project's) are in each state,
    every state named (read from the ``(space, state)`` index)."""
    query = sa.select(tasks.c.state, sa.func.count().label("n")).where(tasks.c.space_id == space_pk)
    if project_pk is not None:
        query = query.where(tasks.c.project_id == project_pk)
    rows = await conn.fetch_all(query.group_by(tasks.c.state))
    counted = {row["state"]: int(row["n"]) for row in rows}
    return {state: counted.get(state, 0) for state in TASK_STATES}


def _task_lookup(key: Any, *, in_space: bool, for_update: bool) -> Any:
    query = TASK_SELECT.where(key)
    if in_space:
        query = query.where(tasks.c.space_id == sa.bindparam("space_pk"))
    return query.with_for_update(of=tasks) if for_update else query


#: Built once with bindparams, so each is compiled once: the claim path's lookups.
_BY_PUBLIC_ID = {
    (in_space, for_update): _task_lookup(
        tasks.c.public_id == sa.bindparam("public_id"), in_space=in_space, for_update=for_update
    )
    for in_space in (False, True)
    for for_update in (False, True)
}
_BY_PK = {
    for_update: _task_lookup(
        tasks.c.id == sa.bindparam("pk"), in_space=False, for_update=for_update
    )
    for for_update in (False, True)
}


async def load_task(
    conn: Transaction,
    public_id: str,
    *,
    space_pk: int | None = None,
    for_update: bool = False,
) -> TaskRow | None:
    """A task by public id (in ``space_pk`` when given), or ``None``.

    ``for_update`` locks the task row until the transaction ends (PostgreSQL;
    SQLite's writer lock already excludes other writers)."""
    params: dict[str, Any] = {"public_id": public_id}
    if space_pk is not None:
        params["space_pk"] = space_pk
    row = await conn.fetch_one(_BY_PUBLIC_ID[(space_pk is not None, for_update)], params)
    return TaskRow.of(row) if row is not None else None


async def load_task_by_pk(conn: Transaction, pk: int, *, for_update: bool = False) -> TaskRow:
    """A task by numeric key (for rows reached from another row, which a
    foreign key guarantees)."""
    row = await conn.fetch_one(_BY_PK[for_update], {"pk": pk})
    assert row is not None, f"task {pk} is referenced but missing"
    return TaskRow.of(row)


def task_ref(task: TaskRow) -> TaskRef:
    """The contract's view of a task."""
    return TaskRef(
        id=task.id,
        space_id=task.space_id,
        project_id=task.project_id,
        kind=task.kind,
        title=task.title,
        state=task.state,
        priority=task.priority,
        generation=task.generation,
        revision=task.revision,
        labels=tuple(json.loads(task.labels)),
        agent_id=task.agent_id,
        stage=task.stage,
        slot=task.slot,
        human_only=bool(task.human_only),
        subject_task_id=task.subject_task_id,
        submission_id=task.subject_submission_id,
        resources=tuple(json.loads(task.resources)),
        criteria_sha256=hashlib.sha256(task.criteria.encode()).hexdigest(),
    )


#: An attempt with its task's and claimant's public ids (:class:`AttemptRow`).
ATTEMPT_SELECT = sa.select(
    *keyed(attempts),
    tasks.c.public_id.label("task_id"),
    tasks.c.subject_task_id.label("subject_task_pk"),
    spaces.c.public_id.label("space_id"),
    principals.c.public_id.label("claimant_id"),
    principals.c.kind.label("claimant_kind"),
    agent_revisions.c.public_id.label("agent_revision_id"),
).select_from(
    attempts.join(tasks, tasks.c.id == attempts.c.task_id)
    .join(spaces, spaces.c.id == attempts.c.space_id)
    .join(principals, principals.c.id == attempts.c.claimant_id)
    .outerjoin(agent_revisions, agent_revisions.c.id == attempts.c.agent_revision_id)
)
_ATTEMPT_BY_ID = ATTEMPT_SELECT.where(attempts.c.public_id == sa.bindparam("public_id"))
_ATTEMPT_IN_SPACE = _ATTEMPT_BY_ID.where(attempts.c.space_id == sa.bindparam("space_pk"))


async def load_attempt(
    conn: Transaction, public_id: str, *, space_pk: int | None = None
) -> AttemptRow | None:
    """An attempt by public id (in ``space_pk`` when given), or ``None``.
    Lock its task's row to change it: that lock serialises every change to
    a task's attempts."""
    if space_pk is None:
        row = await conn.fetch_one(_ATTEMPT_BY_ID, {"public_id": public_id})
    else:
        row = await conn.fetch_one(
            _ATTEMPT_IN_SPACE, {"public_id": public_id, "space_pk": space_pk}
        )
    return AttemptRow.of(row) if row is not None else None


def attempt_ref(attempt: AttemptRow) -> AttemptRef:
    """The contract's view of an attempt."""
    return AttemptRef(
        id=attempt.id,
        task_id=attempt.task_id,
        space_id=attempt.space_id,
        generation=attempt.generation,
        claimant_id=attempt.claimant_id,
        claimant_kind=attempt.claimant_kind,
        state=attempt.state,
        lease_expires_at=attempt.lease_expires_at,
        agent_revision_id=attempt.agent_revision_id,
        run_environment=json.loads(attempt.run_environment or "{}"),
    )


#: A submission with the public ids it points at and the artifacts it names
#: (:class:`SubmissionRow`).
SUBMISSION_SELECT = sa.select(
    *keyed(submissions),
    tasks.c.public_id.label("task_id"),
    attempts.c.public_id.label("attempt_id"),
    principals.c.public_id.label("submitted_by_id"),
    submission_artifacts.c.artifact_ids,
).select_from(
    submissions.join(tasks, tasks.c.id == submissions.c.task_id)
    .join(attempts, attempts.c.id == submissions.c.attempt_id)
    .join(principals, principals.c.id == submissions.c.submitted_by)
    .outerjoin(submission_artifacts, submission_artifacts.c.submission_id == submissions.c.id)
)


def submission_artifact_ids(row: SubmissionRow) -> list[str]:
    """The artifact ids a submission names (none without a row of them)."""
    return list(json.loads(row.artifact_ids)) if row.artifact_ids else []


def submission_ref(row: SubmissionRow) -> SubmissionRef:
    """The contract's view of a submission."""
    return SubmissionRef(
        id=row.id,
        task_id=row.task_id,
        attempt_id=row.attempt_id,
        generation=row.generation,
        task_revision=row.task_revision,
        submitted_by=row.submitted_by_id,
        summary=row.summary,
        candidate=json.loads(row.candidate),
        evidence=json.loads(row.evidence),
        artifacts=tuple(submission_artifact_ids(row)),
        extensions=MappingProxyType(dict(row.extensions)),
    )


#: An agent definition (:class:`AgentRow`).
AGENT_SELECT = sa.select(*keyed(agents))


async def find_agent(
    conn: Transaction, space_pk: int, ref: str, *, for_update: bool = False
) -> AgentRow:
    """An agent of the space by public id or name, or 404."""
    query = AGENT_SELECT.where(
        agents.c.space_id == space_pk, sa.or_(agents.c.public_id == ref, agents.c.name == ref)
    )
    row = await conn.fetch_one(query.with_for_update() if for_update else query)
    if row is None:
        raise NotFound("no such agent in this space")
    return AgentRow.of(row)


#: An agent revision with its agent and space (:class:`AgentRevisionRow`).
AGENT_REVISION_SELECT = sa.select(
    *keyed(agent_revisions),
    agents.c.public_id.label("agent_id"),
    agents.c.name.label("agent_name"),
    spaces.c.public_id.label("space_id"),
).select_from(
    agent_revisions.join(agents, agents.c.id == agent_revisions.c.agent_id).join(
        spaces, spaces.c.id == agents.c.space_id
    )
)


def agent_revision_ref(row: AgentRevisionRow) -> AgentRevisionRef:
    """The contract's view of an agent revision."""
    return AgentRevisionRef(
        id=row.id,
        agent_id=row.agent_id,
        space_id=row.space_id,
        agent_name=row.agent_name,
        number=row.number,
        instructions=row.instructions,
        plugins=tuple(json.loads(row.plugins)),
    )


#: A project (:class:`ProjectRow`).
PROJECT_SELECT = sa.select(*keyed(projects))


_placer = principals.alias("placer")
_lifter = principals.alias("lifter")
#: A hold with who placed and lifted it (:class:`HoldRow`).
HOLD_SELECT = sa.select(
    *keyed(holds),
    _placer.c.public_id.label("created_by_id"),
    _lifter.c.public_id.label("lifted_by_id"),
).select_from(
    holds.outerjoin(_placer, _placer.c.id == holds.c.created_by).outerjoin(
        _lifter, _lifter.c.id == holds.c.lifted_by
    )
)
_opener = principals.alias("opener")
_answerer = principals.alias("answerer")
#: A decision with its task's public id and who opened and answered it
#: (:class:`DecisionRow`).
DECISION_SELECT = sa.select(
    *keyed(decisions),
    tasks.c.public_id.label("task_id"),
    _opener.c.public_id.label("opened_by_id"),
    _answerer.c.public_id.label("answered_by_id"),
).select_from(
    decisions.join(tasks, tasks.c.id == decisions.c.task_id)
    .outerjoin(_opener, _opener.c.id == decisions.c.opened_by)
    .outerjoin(_answerer, _answerer.c.id == decisions.c.answered_by)
)


async def find_project(conn: Transaction, space_pk: int, ref: str) -> ProjectRow:
    """A project of the space by public id or name, or 404."""
    row = await conn.fetch_one(
        PROJECT_SELECT.where(
            projects.c.space_id == space_pk,
            sa.or_(projects.c.public_id == ref, projects.c.name == ref),
        )
    )
    if row is None:
        raise NotFound("no such project in this space")
    return ProjectRow.of(row)


async def task_or_404(
    conn: Transaction, space_pk: int, ref: str, *, for_update: bool = False
) -> TaskRow:
    """A task of the space, or 404 (also for a task of another space)."""
    task = await load_task(conn, ref, space_pk=space_pk, for_update=for_update)
    if task is None:
        raise NotFound("no such task in this space")
    return task


async def agent_pk(conn: Transaction, space_pk: int, ref: str | None) -> int | None:
    """An agent of this space by public id or name; 422 for another space's."""
    if ref is None:
        return None
    pk = await conn.fetch_val(
        sa.select(agents.c.id).where(
            agents.c.space_id == space_pk, sa.or_(agents.c.public_id == ref, agents.c.name == ref)
        )
    )
    if pk is None:
        raise ValidationFailed(
            "no agent of that name or id in this space",
            errors={"agent": ["Not an agent of this space."]},
        )
    return int(pk)
