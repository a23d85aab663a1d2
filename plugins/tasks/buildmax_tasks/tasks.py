"""Tasks: creating, revising, linking, canceling and retrying them.

Each operation runs in the caller's :class:`Change`, checks what the task's
state allows, writes through :mod:`lifecycle` where a state changes, and
audits and announces what it did. The routes authorize, parse and render.
"""

from __future__ import annotations

import functools
import json
from typing import Any, NoReturn

import sqlalchemy as sa

from buildmax.conflicts import insert_ignoring_conflict
from buildmax.ids import new_id
from buildmax.problems import Forbidden, NotFound, ValidationFailed

from .attempts import cancel_task as end_task_and_attempt
from .authority import Authority
from .change import Change
from .engine import StageEngine, stranded
from .graph import add_dependency, lock_graph, remove_dependency
from .lifecycle import TERMINAL, cancel_linked_work, leave_stage, reopen, set_task
from .problems import InvalidState, RevisionConflict, SourceTaken
from .records import agent_pk, find_project, load_task, task_or_404
from .rows import TaskRow
from .search import index_task
from .tables import attempts, dependencies, task_revisions, tasks

#: What a new task's row is written with (each a bind parameter of its name).
_NEW_TASK = (
    "public_id",
    "space_id",
    "project_id",
    "kind",
    "title",
    "priority",
    "labels",
    "resources",
    "agent_id",
    "state",
    "outcome_reason",
    "max_attempts",
    "ready_at",
    "created_at",
    "created_by",
    "updated_at",
    "source_system",
    "source_id",
    "links",
)


@functools.cache
def _insert_task(dialect: str) -> Any:
    """A new task's insert, built once per engine: skipped (no id back)
    when its source record is another task's."""
    return (
        insert_ignoring_conflict(dialect, tasks)
        .values({name: sa.bindparam(name) for name in _NEW_TASK})
        .returning(tasks.c.id)
    )


_INSERT_FIRST_REVISION = task_revisions.insert().values(
    number=1,
    **{
        name: sa.bindparam(name)
        for name in ("task_id", "title", "body", "criteria", "created_at", "created_by")
    },
)


async def create_task(ch: Change, creator_pk: int, data: dict[str, Any]) -> str:
    """A new task of the project ``data["project"]`` (for the agent
    ``data["agent"]``, if any) with its first revision, prerequisites and
    links, indexed for search: ``ready``, or ``open`` until every
    prerequisite is done. A task imported from a record of another tool
    names it (``data["source"]``: one task per record in a space, 409
    otherwise) and may be created closed, ``done`` or ``canceled``, as the
    work was there. Its public id."""
    state, source = data["state"], data["source"]
    if state != "ready" and source is None:
        raise ValidationFailed(
            "a task is created done or canceled only as the record of work done "
            "elsewhere: name its source",
            errors={"state": ["Only a task with a source may be created closed."]},
        )
    if data["outcome_reason"] is not None and state == "ready":
        raise ValidationFailed(
            "an outcome reason is for a task created done or canceled",
            errors={"outcome_reason": ["Only a closed task has an outcome."]},
        )
    project = await find_project(ch.tx, ch.space_pk, data["project"])
    agent = await agent_pk(ch.tx, ch.space_pk, data["agent"])
    links = await _links(ch, data["links"])
    if data["prerequisites"]:
        await lock_graph(ch)
    prereqs = await _prerequisites(ch, data["prerequisites"])
    undone = any(p.state != "done" for p in prereqs)
    if state == "ready" and undone:
        state = "open"
    public_id = new_id("ta")
    # A source record another task came from skips the insert (the unique
    # index decides, also between creates that run at once).
    pk = await ch.tx.fetch_val(
        _insert_task(ch.tx.dialect),
        {
            "public_id": public_id,
            "space_id": ch.space_pk,
            "project_id": project.pk,
            "kind": data["kind"],
            "title": data["title"],
            "priority": data["priority"],
            "labels": json.dumps(sorted(set(data["labels"]))),
            "resources": json.dumps(sorted(set(data["resources"]))),
            "agent_id": agent,
            # A task's first state; every later one is lifecycle's to write.
            "state": state,
            "outcome_reason": data["outcome_reason"],
            "max_attempts": data["max_attempts"],
            "ready_at": ch.now,
            "created_at": ch.now,
            "created_by": creator_pk,
            "updated_at": ch.now,
            "source_system": None if source is None else source["system"],
            "source_id": None if source is None else source["id"],
            "links": json.dumps(links),
        },
    )
    if pk is None:
        assert source is not None, "only a task's source may be taken"
        await _refuse_taken(ch, source)
    await ch.tx.execute(
        _INSERT_FIRST_REVISION,
        {
            "task_id": pk,
            "title": data["title"],
            "body": data["body"],
            "criteria": data["criteria"],
            "created_at": ch.now,
            "created_by": creator_pk,
        },
    )
    await index_task(ch.tx, pk, ch.space_pk, data["title"], data["criteria"])
    for prereq in prereqs:
        await ch.tx.execute(
            dependencies.insert().values(task_id=pk, prerequisite_id=prereq.pk, created_at=ch.now)
        )
    await ch.audit(
        "task.created",
        "task",
        public_id,
        project_id=project.id,
        kind=data["kind"],
        priority=data["priority"],
        prerequisites=[p.id for p in prereqs],
        **({} if source is None else {"source": f"{source['system']}:{source['id']}"}),
        **({"state": state} if state in TERMINAL else {}),
    )
    await ch.event("task.created", task_id=public_id, project_id=project.id)
    return public_id


async def _refuse_taken(ch: Change, source: dict[str, str]) -> NoReturn:
    taken = await ch.tx.fetch_val(
        sa.select(tasks.c.public_id).where(
            tasks.c.space_id == ch.space_pk,
            tasks.c.source_system == source["system"],
            tasks.c.source_id == source["id"],
        )
    )
    raise SourceTaken(
        f"task {taken} of this space comes from {source['system']} record {source['id']}",
        task=taken,
    )


async def _links(ch: Change, asked: list[dict[str, str]]) -> list[dict[str, str]]:
    """The links ``asked`` (each once, in order), every target a task of
    the space; a prerequisite is not a link."""
    links = [
        {"kind": kind, "task": task}
        for kind, task in dict.fromkeys((link["kind"], link["task"]) for link in asked)
    ]
    if any(link["kind"] == "prerequisite" for link in links):
        raise ValidationFailed(
            "a prerequisite is not a link: name it in prerequisites",
            errors={"links": ["No link is of kind prerequisite."]},
        )
    targets = {link["task"] for link in links}
    if targets:
        found = await ch.tx.fetch_all(
            sa.select(tasks.c.public_id).where(
                tasks.c.space_id == ch.space_pk,
                tasks.c.public_id.in_(sa.bindparam("targets", expanding=True)),
            ),
            {"targets": sorted(targets)},
        )
        missing = sorted(targets - {row["public_id"] for row in found})
        if missing:
            raise ValidationFailed(
                f"no task {', '.join(missing)} in this space to link to",
                errors={"links": [f"No such task in this space: {', '.join(missing)}."]},
            )
    return links


async def set_links(ch: Change, task_id: str, asked: list[dict[str, str]]) -> bool:
    """Replace the links of ``task_id`` with ``asked`` (in any state: a
    link says how tasks relate, not what the task is); whether they
    changed. A task links to itself never."""
    row = await task_or_404(ch.tx, ch.space_pk, task_id, for_update=True)
    links = await _links(ch, asked)
    if any(link["task"] == row.id for link in links):
        raise ValidationFailed(
            "a task does not link to itself", errors={"links": ["A task links to other tasks."]}
        )
    if json.loads(row.links) != links:
        await set_task(ch, row.pk, links=json.dumps(links))
        await ch.audit(
            "task.links.set",
            "task",
            row.id,
            links=[f"{link['kind']}:{link['task']}" for link in links],
        )
        await ch.event("task.links.set", task_id=row.id)
        return True
    return False


async def _prerequisites(ch: Change, refs: list[str]) -> list[TaskRow]:
    """The tasks ``refs`` name, locked; 422 naming one that is not in the space."""
    found = []
    for ref in dict.fromkeys(refs):
        task = await load_task(ch.tx, ref, space_pk=ch.space_pk, for_update=True)
        if task is None:
            raise ValidationFailed(
                f"no task {ref!r} in this space",
                errors={"prerequisites": [f"No task {ref!r} in this space."]},
            )
        found.append(task)
    return found


async def require_editable(ch: Change, task: TaskRow, editor: Authority) -> None:
    """Members edit unowned work; a task another principal holds needs an
    admin or owner override with a reason."""
    if task.state != "claimed":
        return
    holder = await ch.tx.fetch_val(
        sa.select(attempts.c.claimant_id).where(
            attempts.c.task_id == task.pk, attempts.c.state == "active"
        )
    )
    if holder is None or holder == editor.principal_pk:
        return
    if not editor.may_override:
        raise Forbidden("another principal's attempt holds this task; only its owner edits it")
    if not editor.override_reason:
        raise ValidationFailed(
            "editing a task someone else holds needs override_reason",
            errors={"override_reason": ["Required to override the attempt's owner."]},
        )
    ch.override(editor.override_reason)


async def revise_task(
    ch: Change,
    task_id: str,
    expected_revision: int,
    editor: Authority,
    changes: dict[str, Any],
) -> None:
    """Apply ``changes`` (title, body, criteria, priority, labels,
    resources, agent, max_attempts) as the next revision, indexed again
    for search when its title or criteria change; 409 when the task is not
    at ``expected_revision``."""
    row = await task_or_404(ch.tx, ch.space_pk, task_id, for_update=True)
    if row.revision != expected_revision:
        raise RevisionConflict(
            f"the task is at revision {row.revision}, not {expected_revision}",
            revision=row.revision,
        )
    if row.state in TERMINAL:
        raise InvalidState(f"the task is {row.state}; retry it before editing")
    await require_editable(ch, row, editor)
    values: dict[str, Any] = {"revision": row.revision + 1}
    if "agent" in changes:
        values["agent_id"] = await agent_pk(ch.tx, ch.space_pk, changes["agent"])
    for name in ("priority", "max_attempts", "title"):
        if name in changes:
            values[name] = changes[name]
    for name in ("labels", "resources"):
        if name in changes:
            values[name] = json.dumps(sorted(set(changes[name])))
    title, criteria = changes.get("title", row.title), changes.get("criteria", row.criteria)
    await ch.tx.execute(
        task_revisions.insert().values(
            task_id=row.pk,
            number=values["revision"],
            title=title,
            body=changes.get("body", row.body),
            criteria=criteria,
            created_at=ch.now,
            created_by=editor.principal_pk,
        )
    )
    await set_task(ch, row.pk, **values)
    if ("title" in changes or "criteria" in changes) and row.subject_task_pk is None:
        await index_task(ch.tx, row.pk, row.space_pk, title, criteria)
    await ch.audit(
        "task.revised",
        "task",
        row.id,
        revision=values["revision"],
        fields=sorted(changes),
    )
    await ch.event("task.revised", task_id=row.id, revision=values["revision"])


async def add_prerequisite(ch: Change, task_id: str, prerequisite_id: str) -> tuple[TaskRow, bool]:
    """Make ``prerequisite_id`` a prerequisite of ``task_id`` (409 for a
    cycle); the task, and whether the link is new (``False`` when it was
    one already)."""
    await lock_graph(ch)
    await task_or_404(ch.tx, ch.space_pk, task_id)
    # The prerequisite's row first: completing it locks it, then its dependents.
    prereq = await load_task(ch.tx, prerequisite_id, space_pk=ch.space_pk, for_update=True)
    if prereq is None:
        raise ValidationFailed(
            "no such prerequisite task in this space",
            errors={"prerequisite": ["No such task in this space."]},
        )
    row = await task_or_404(ch.tx, ch.space_pk, task_id, for_update=True)
    added = await add_dependency(ch, row, prereq)
    if added:
        await ch.audit("task.dependency.added", "task", row.id, prerequisite_id=prereq.id)
        await ch.event("task.dependency.added", task_id=row.id, prerequisite_id=prereq.id)
    return row, added


async def remove_prerequisite(ch: Change, task_id: str, prerequisite_id: str) -> None:
    """Remove ``prerequisite_id`` from the task's prerequisites (404 when
    it is not one)."""
    await lock_graph(ch)  # before any task row: the order every graph edit takes
    row = await task_or_404(ch.tx, ch.space_pk, task_id, for_update=True)
    prereq = await task_or_404(ch.tx, ch.space_pk, prerequisite_id)
    if not await remove_dependency(ch, row, prereq):
        raise NotFound("the task has no such prerequisite")
    await ch.audit("task.dependency.removed", "task", row.id, prerequisite_id=prereq.id)
    await ch.event("task.dependency.removed", task_id=row.id, prerequisite_id=prereq.id)


async def cancel(ch: Change, task_id: str, reason: str, editor: Authority) -> None:
    """Cancel a task for good, with its active attempt and unfinished stage
    work; stage work only by someone who may override."""
    row = await task_or_404(ch.tx, ch.space_pk, task_id, for_update=True)
    if row.state in TERMINAL:
        raise InvalidState(f"the task is already {row.state}")
    if row.subject_task_pk is not None and not editor.may_override:
        raise Forbidden("stage work belongs to its workflow stage; only a space admin cancels it")
    await require_editable(ch, row, editor)
    await end_task_and_attempt(ch, row, reason)


async def retry(ch: Change, task_id: str, engine: StageEngine) -> None:
    """A failed or canceled task, or one waiting in a stage no loaded
    plugin supplies, is ready (or open) again with a fresh attempt budget."""
    row = await task_or_404(ch.tx, ch.space_pk, task_id, for_update=True)
    waiting = row.state == "waiting" and stranded(engine, row)
    if row.state not in ("failed", "canceled") and not waiting:
        raise InvalidState(
            "only failed or canceled tasks, or tasks waiting in a stage no loaded plugin "
            f"supplies, are retried; this one is {row.state}"
        )
    if waiting and row.current_submission_pk is not None:
        await cancel_linked_work(ch, row.current_submission_pk, "the task was retried")
    state = await reopen(ch, row, attempts_used=0, outcome_reason=None, **leave_stage(row))
    await ch.audit("task.retried", "task", row.id, previous_state=row.state, state=state)
