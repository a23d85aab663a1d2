"""Tasks imported from another tool's records (``TaskQueue.import_record``).

A record is checked as a create body is (:class:`~.schemas.TaskCreate`),
then becomes a task through the operations of :mod:`.tasks`, :mod:`.holds`
and :mod:`.lifecycle`, so an import writes, audits and announces exactly
what the same edits through the API would. What a record asks and the
queue does not do (reopen a task closed here, revise or close a task
someone holds) is left as it is and said in the outcome's notes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import ImportedTask, SourceRecord

from buildmax.bodies import validate

from .authority import Authority
from .change import Change
from .graph import EDITABLE, add_dependency, lock_graph
from .holds import place_hold
from .lifecycle import TERMINAL, complete, finish
from .problems import DependencyCycle, RevisionConflict
from .records import load_task, task_or_404
from .schemas import REASON_CHARS, TaskCreate
from .tables import holds
from .tasks import create_task, revise_task, set_links

#: The fields of a task an import revises, as a create body names them.
REVISED = ("title", "body", "criteria", "priority", "labels")
#: Every record is checked as a create body is (one schema, built once).
_CREATE = TaskCreate()
#: The hold that keeps work in progress elsewhere from being claimed here.
HELD = "suspended"


def _body(
    record: SourceRecord,
    system: str,
    project_id: str,
    prerequisites: Sequence[str],
    links: Sequence[tuple[str, str]],
) -> dict[str, Any]:
    """The record as a create body, checked as one (422 naming the field)."""
    closed = record.state in ("done", "canceled")
    reason = (record.close_reason or "").strip()[:REASON_CHARS] or None
    return validate(
        _CREATE,
        {
            "project": project_id,
            "title": record.title,
            "body": record.body,
            "criteria": record.criteria,
            "kind": record.kind,
            "priority": record.priority,
            "labels": list(record.labels),
            "prerequisites": list(prerequisites),
            "source": {"system": system, "id": record.source_id},
            "state": record.state if closed else "ready",
            "outcome_reason": reason if closed else None,
            "links": [{"kind": kind, "task": task} for kind, task in links],
        },
    )


async def import_record(
    ch: Change,
    importer: Authority,
    record: SourceRecord,
    *,
    system: str,
    project_id: str,
    task: tuple[str, int | None] | None,
    prerequisites: Sequence[str],
    links: Sequence[tuple[str, str]],
    hold: bool = True,
) -> ImportedTask:
    """The task of ``record`` made to say what it says (the protocol's
    ``TaskQueue.import_record``); ``task`` is the task and the revision the
    caller saw, or ``None`` to create one."""
    data = _body(record, system, project_id, prerequisites, links)
    if task is None:
        return await _create(ch, importer, record, data)
    return await _update(ch, importer, record, task, data, hold)


async def _create(
    ch: Change, importer: Authority, record: SourceRecord, data: dict[str, Any]
) -> ImportedTask:
    public_id = await create_task(ch, importer.principal_pk, data)
    changes = ["created"]
    if record.state == "held":
        await _hold(ch, importer, record, public_id)
        changes.append("held")
    return await _outcome(ch, public_id, changes, [])


async def _hold(ch: Change, importer: Authority, record: SourceRecord, task_id: str) -> None:
    reason = record.state_reason or f"{record.source_state or 'in progress'} in the source"
    await place_hold(ch, importer.principal_pk, "task", task_id, HELD, reason[:REASON_CHARS])


async def _held(ch: Change, task_pk: int) -> bool:
    """Whether a live hold is on the task itself."""
    found = await ch.tx.fetch_val(
        sa.select(holds.c.id).where(
            holds.c.scope_type == "task", holds.c.scope_pk == task_pk, holds.c.lifted_at.is_(None)
        )
    )
    return found is not None


async def _update(
    ch: Change,
    importer: Authority,
    record: SourceRecord,
    task: tuple[str, int | None],
    data: dict[str, Any],
    hold: bool,
) -> ImportedTask:
    task_id, expected = task
    changes: list[str] = []
    notes: list[str] = []
    applied = True
    if data["prerequisites"]:
        await lock_graph(ch)  # before any task row: the order every graph edit takes
    row = await task_or_404(ch.tx, ch.space_pk, task_id, for_update=True)
    if expected is not None and row.revision != expected:
        raise RevisionConflict(
            f"task {row.id} is at revision {row.revision}, not {expected}: it changed since",
            revision=row.revision,
        )
    if row.state in TERMINAL:
        if _revised(row, data) or record.state not in ("done", "canceled"):
            notes.append(f"{row.state} here: it stays closed and is not revised")
    elif row.state not in EDITABLE:
        notes.append(f"{row.state} here: someone holds it, so it is not revised or closed yet")
        applied = False
    else:
        revised = _revised(row, data)
        if revised:
            await revise_task(ch, task_id, row.revision, importer, revised)
            changes.append("revised")
        if data["kind"] != row.kind:
            notes.append(f"{data['kind']} in the source: a task's kind stays {row.kind}")
        if await _add_prerequisites(ch, task_id, data["prerequisites"], notes):
            changes.append("prerequisites")
        row = await task_or_404(ch.tx, ch.space_pk, task_id, for_update=True)
        held = await _held(ch, row.pk)
        if record.state == "held" and hold and not held:
            await _hold(ch, importer, record, task_id)
            changes.append("held")
        elif record.state == "ready" and held:
            notes.append("held here: lift the hold when the work is free")
        if record.state == "done":
            await complete(ch, row)
            changes.append("closed")
        elif record.state == "canceled":
            reason = data["outcome_reason"] or "canceled in the source"
            await finish(ch, row, "canceled", reason)
            changes.append("closed")
    wanted = [(link["kind"], link["task"]) for link in data["links"]]
    if await add_links(ch, task_id, wanted):
        changes.append("links")
    return await _outcome(ch, task_id, changes, notes, applied)


async def add_links(ch: Change, task_id: str, links: Sequence[tuple[str, str]]) -> bool:
    """Add to the task's links those of ``links`` (``(kind, task id)``) it
    lacks (an import adds links, and removes none a person made); whether
    any was added."""
    row = await task_or_404(ch.tx, ch.space_pk, task_id)
    now = [(link["kind"], link["task"]) for link in json.loads(row.links)]
    wanted = list(dict.fromkeys([*now, *links]))
    if wanted == now:
        return False
    await set_links(ch, task_id, [{"kind": kind, "task": task} for kind, task in wanted])
    return True


def _revised(row: Any, data: dict[str, Any]) -> dict[str, Any]:
    """What of ``data`` differs from the task's current revision."""
    now = {
        "title": row.title,
        "body": row.body,
        "criteria": row.criteria,
        "priority": row.priority,
        "labels": json.loads(row.labels),
    }
    wanted = {**data, "labels": sorted(set(data["labels"]))}
    return {name: wanted[name] for name in REVISED if wanted[name] != now[name]}


async def _add_prerequisites(
    ch: Change, task_id: str, prerequisites: Sequence[str], notes: list[str]
) -> bool:
    """Add the prerequisites the task lacks; a cycle through edges made
    here is left out and noted. Whether any was added."""
    added = False
    for ref in prerequisites:
        prereq = await task_or_404(ch.tx, ch.space_pk, ref, for_update=True)
        row = await task_or_404(ch.tx, ch.space_pk, task_id, for_update=True)
        try:
            if await add_dependency(ch, row, prereq):
                added = True
                await ch.audit("task.dependency.added", "task", row.id, prerequisite_id=prereq.id)
                await ch.event("task.dependency.added", task_id=row.id, prerequisite_id=prereq.id)
        except DependencyCycle:
            notes.append(f"prerequisite {prereq.id} left out: it waits for this task here")
    return added


async def _outcome(
    ch: Change, task_id: str, changes: list[str], notes: list[str], applied: bool = True
) -> ImportedTask:
    row = await load_task(ch.tx, task_id, space_pk=ch.space_pk)
    assert row is not None, "the task was just written"
    return ImportedTask(row.id, row.revision, row.state, tuple(changes), tuple(notes), applied)
