"""The stage engine: what happens to a task after its work is handed in.

With no stage loaded, a submission completes its task. Otherwise the task
waits while each stage, in order, gets linked work items (one per slot)
created for the submission; when linked work is handed in, the stage's
plugin returns a :class:`Verdict` from ``buildmax_attempt_submitted`` and the
engine applies it: ``pending`` waits for more, ``pass`` moves to the next
stage or completes the subject, ``changes`` reopens the subject with the
verdict's finding ids, ``reject`` fails it. Only the engine writes task state.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from buildmax_hookspecs import StageSpec, Verdict

from buildmax.ids import new_id
from buildmax.tables import bound_insert

from .change import Change
from .lifecycle import TERMINAL, cancel_linked_work, complete, finish, reopen, set_task
from .records import (
    PROJECT_SELECT,
    attempt_ref,
    load_task,
    load_task_by_pk,
    submission_ref,
    task_ref,
)
from .rows import AttemptRow, ProjectRow, SubmissionRow, TaskRow
from .tables import policies, projects, submissions, task_revisions, tasks

if TYPE_CHECKING:
    from buildmax.app import BuildMax

VERDICTS = ("pending", "pass", "changes", "reject")
#: A stage's reason is kept (on the task and the audit trail) up to this length.
MAX_REASON_CHARS = 1000


class StageError(Exception):
    """Stages are declared inconsistently, or a verdict is malformed."""


@dataclass(frozen=True)
class Stage:
    """A loaded stage and the plugin that supplied it."""

    spec: StageSpec
    plugin: str


class StageEngine:
    """The loaded stages, in order."""

    def __init__(self, stages: list[Stage], extensions: Mapping[str, str] | None = None) -> None:
        #: Who takes each name of a submission's ``extensions``: name -> plugin.
        self.extensions = dict(extensions or {})
        names: dict[str, str] = {}
        for stage in stages:
            if stage.spec.name in names:
                raise StageError(
                    f"stage {stage.spec.name!r} is supplied by both "
                    f"{names[stage.spec.name]!r} and {stage.plugin!r}"
                )
            names[stage.spec.name] = stage.plugin
        self.stages = sorted(stages, key=lambda s: (s.spec.order, s.spec.name))
        self._by_name = {s.spec.name: s for s in self.stages}

    @classmethod
    def from_plugins(cls, plugins: Any) -> StageEngine:
        """Collect the stages and the submission extensions of every loaded plugin."""
        found = []
        for plugin, specs in plugins.hooks.workflow_stages():
            for spec in specs:
                found.append(Stage(spec, plugin))
        extensions: dict[str, str] = {}
        for plugin, names in plugins.hooks.submission_extensions():
            if isinstance(names, str):
                raise StageError(
                    f"plugin {plugin!r} declares its submission extensions as a string; "
                    "return a list of names"
                )
            for name in names:
                if not isinstance(name, str) or not 1 <= len(name) <= 64:
                    raise StageError(
                        f"plugin {plugin!r} declares submission extension {name!r}: a name is "
                        "a string of 1 to 64 characters"
                    )
                if name in extensions:
                    raise StageError(
                        f"submission extension {name!r} is declared by both "
                        f"{extensions[name]!r} and {plugin!r}"
                    )
                extensions[name] = plugin
        return cls(found, extensions)

    def unknown_extensions(self, handed: Mapping[str, Any]) -> dict[str, list[str]]:
        """The names of a submission's ``extensions`` no loaded plugin takes,
        each with why (for a 422's ``errors``)."""
        return {
            name: ["no loaded plugin takes submission data under this name"]
            for name in handed
            if name not in self.extensions
        }

    def known(self, name: str | None) -> bool:
        """True when a stage of that name is loaded."""
        return name in self._by_name

    def after(self, name: str | None) -> list[Stage]:
        """The stages after ``name`` (all of them for ``None``)."""
        if name is None:
            return list(self.stages)
        current = self._by_name[name]
        key = (current.spec.order, current.spec.name)
        return [s for s in self.stages if (s.spec.order, s.spec.name) > key]

    async def submitted(
        self,
        ch: Change,
        task: TaskRow,
        attempt: AttemptRow,
        submission: SubmissionRow,
        values: dict[str, Any],
    ) -> dict[str, Any]:
        """Apply a fresh submission (already written) to task state, writing
        ``values`` to the submitted task with its new state; what happened."""
        subject = None
        if task.subject_task_pk is not None:
            # Serialises every hand-in of one subject's stage work: two
            # last approvals arriving together cannot both count as pending.
            subject = await load_task_by_pk(ch.tx, task.subject_task_pk, for_update=True)
            await complete(ch, task, **values)
            task = replace(task, state="done")
        verdicts = await ch.app.hooks.attempt_submitted(
            ch.tx,
            task=task_ref(task),
            attempt=attempt_ref(attempt),
            submission=submission_ref(submission),
            actor=ch.actor,
        )
        if subject is None:
            return await self._enter_next(ch, task, submission.pk, None, values)
        stage = task.stage
        assert stage is not None, "linked work belongs to a stage"
        verdict = _one_verdict(verdicts, stage)
        if verdict is None:
            return {"verdict": None}
        await ch.tx.execute(
            sa.update(submissions)
            .where(submissions.c.id == submission.pk)
            .values(verdict=verdict.outcome)
        )
        current = (
            subject.state == "waiting"
            and subject.current_submission_pk == task.subject_submission_pk
            and subject.stage == stage
        )
        if not current:
            # The subject moved on (another slot asked for changes): the
            # verdict is kept on the submission and changes nothing else.
            return {"verdict": verdict.outcome, "applied": False}
        await self._apply(ch, subject, stage, verdict)
        return {"verdict": verdict.outcome, "applied": True}

    async def _apply(self, ch: Change, subject: TaskRow, stage: str, verdict: Verdict) -> None:
        submission_pk = subject.current_submission_pk
        assert submission_pk is not None, "a subject waiting in a stage has a submission"
        if verdict.outcome == "pending":
            return
        if verdict.outcome == "pass":
            await self._enter_next(ch, subject, submission_pk, stage)
            return
        reason = (verdict.reason or f"the {stage} stage answered {verdict.outcome}")[
            :MAX_REASON_CHARS
        ]
        await cancel_linked_work(ch, submission_pk, reason)
        if verdict.outcome == "changes":
            findings = list(verdict.finding_ids)
            await reopen(
                ch, subject, stage=None, finding_ids=json.dumps(findings), outcome_reason=reason
            )
            await ch.audit(
                "task.reopened",
                "task",
                subject.id,
                stage=stage,
                finding_ids=findings,
                reason=reason,
            )
            return
        await finish(
            ch,
            replace(subject, current_submission_pk=None, current_submission_id=None),
            "failed",
            reason,
        )

    async def _enter_next(
        self,
        ch: Change,
        subject: TaskRow,
        submission_pk: int,
        after: str | None,
        values: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        remaining = self.after(after)
        policy = await current_policy(ch.tx, subject.project_pk) if remaining else {}
        for stage in remaining:
            slots = _slot_count(stage.spec, policy)
            if slots == 0:
                continue
            human = bool(stage.spec.human_slot and policy.get(stage.spec.human_slot))
            resources = await _target_resources(ch, subject) if stage.spec.reserves_target else []
            work = await _create_linked_work(
                ch, subject, submission_pk, stage.spec, slots, human, resources
            )
            await set_task(ch, subject.pk, state="waiting", stage=stage.spec.name, **(values or {}))
            await ch.app.hooks.stage_entered(
                ch.tx,
                subject=task_ref(replace(subject, state="waiting", stage=stage.spec.name)),
                stage=stage.spec.name,
                work=[task_ref(row) for row in await _loaded(ch, work)],
                actor=ch.actor,
            )
            await ch.audit(
                "task.stage_entered",
                "task",
                subject.id,
                stage=stage.spec.name,
                work_ids=work,
            )
            await ch.event(
                "task.state",
                task_id=subject.id,
                state="waiting",
                stage=stage.spec.name,
            )
            return {"stage": stage.spec.name, "work_ids": work}
        released = await complete(ch, subject, **(values or {}))
        return {"stage": None, "released": released}


def _one_verdict(verdicts: list[Any], stage: str) -> Verdict | None:
    found = [v for v in verdicts if v is not None]
    if len(found) > 1:
        raise StageError(f"more than one plugin judged work of stage {stage!r}")
    if not found:
        return None
    verdict = found[0]
    if not isinstance(verdict, Verdict) or verdict.outcome not in VERDICTS:
        raise StageError(f"stage {stage!r} returned {verdict!r}, not a stage Verdict")
    return verdict


def _slot_count(spec: StageSpec, policy: dict[str, Any]) -> int:
    if isinstance(spec.slots, int):
        return spec.slots
    value = policy.get(spec.slots)
    if not isinstance(value, int):
        raise StageError(f"stage {spec.name!r} counts slots by unknown policy field {spec.slots!r}")
    return value


async def _target_resources(ch: Change, subject: TaskRow) -> list[str]:
    """The subject project's integration target, as a reservable resource."""
    project = await ch.tx.fetch_one(PROJECT_SELECT.where(projects.c.id == subject.project_pk))
    assert project is not None, "a task's project exists"
    return [integration_target(ProjectRow.of(project))]


def integration_target(project: ProjectRow) -> str:
    """``repo:<repository_url>@<target_branch>`` (``repo:<url>`` with no
    branch), or ``project:<id>`` for a project without a repository."""
    url = project.repository_url
    if not url:
        return f"project:{project.id}"
    branch = project.target_branch
    return f"repo:{url}@{branch}" if branch else f"repo:{url}"


async def _loaded(ch: Change, public_ids: list[str]) -> list[TaskRow]:
    rows = []
    for public_id in public_ids:
        row = await load_task(ch.tx, public_id)
        assert row is not None, "created in this transaction"
        rows.append(row)
    return rows


_INSERT_WORK = bound_insert(
    tasks,
    "public_id",
    "space_id",
    "project_id",
    "kind",
    "title",
    "priority",
    "labels",
    "resources",
    "state",
    "stage",
    "subject_task_id",
    "subject_submission_id",
    "slot",
    "human_only",
    "max_attempts",
    "ready_at",
    "created_at",
    "created_by",
    "updated_at",
).returning(tasks.c.id)
_INSERT_WORK_REVISION = bound_insert(
    task_revisions, "task_id", "number", "title", "body", "criteria", "created_at", "created_by"
)


async def _create_linked_work(
    ch: Change,
    subject: TaskRow,
    submission_pk: int,
    spec: StageSpec,
    slots: int,
    human_first: bool,
    resources: list[str],
) -> list[str]:
    """Create the stage's work items, once per (submission, stage, slot): the
    unique index refuses a second set, which rolls the transaction back."""
    created = []
    for slot in range(slots):
        public_id = new_id("ta")
        title = f"{spec.name} {slot + 1}/{slots}: {subject.title}"[:500]
        pk = await ch.tx.fetch_val(
            _INSERT_WORK,
            {
                "public_id": public_id,
                "space_id": subject.space_pk,
                "project_id": subject.project_pk,
                "kind": spec.work_kind,
                "title": title,
                "priority": subject.priority,
                "labels": "[]",
                "resources": json.dumps(resources),
                "state": "ready",
                "stage": spec.name,
                "subject_task_id": subject.pk,
                "subject_submission_id": submission_pk,
                "slot": slot,
                "human_only": int(human_first and slot == 0),
                "max_attempts": subject.max_attempts,
                "ready_at": ch.now,
                "created_at": ch.now,
                "created_by": None,
                "updated_at": ch.now,
            },
        )
        await ch.tx.execute(
            _INSERT_WORK_REVISION,
            {
                "task_id": pk,
                "number": 1,
                "title": title,
                "body": spec.description,
                "criteria": "",
                "created_at": ch.now,
                "created_by": None,
            },
        )
        await ch.event("task.created", task_id=public_id, stage=spec.name, slot=slot)
        created.append(public_id)
    return created


#: Where an app keeps its stage engine.
ENGINE_KEY = "buildmax_tasks.engine"


def stage_engine(app: BuildMax) -> StageEngine:
    """The app's stage engine (built from its plugins on first use)."""
    engine = app.extensions.get(ENGINE_KEY)
    if engine is None:
        engine = StageEngine.from_plugins(app.plugins)
        app.extensions[ENGINE_KEY] = engine
    return engine


def stranded(engine: StageEngine, row: TaskRow) -> bool:
    """True for a task that waits in, or is linked work of, a stage whose
    plugin is not loaded: it is reported, never completed by nobody."""
    if row.state == "waiting":
        return not engine.known(row.stage)
    linked = row.subject_task_pk is not None and row.state not in TERMINAL
    return linked and not engine.known(row.stage)


DEFAULT_POLICY = {
    "revision": 0,
    "approvals_required": 1,
    "human_review_required": False,
    "integration": "automatic",
}


#: A project's current policy revision, ``NULL`` columns before the first
#: (``project_pk``: its key; ``project_id``: its public id).
_POLICY = sa.select(
    projects.c.id.label("project_pk"),
    projects.c.public_id.label("project_id"),
    policies.c.revision,
    policies.c.approvals_required,
    policies.c.human_review_required,
    policies.c.integration,
    policies.c.created_at,
).select_from(projects.outerjoin(policies, policies.c.id == projects.c.policy_id))
_POLICY_BY_PK = _POLICY.where(projects.c.id == sa.bindparam("project_pk"))
_POLICY_BY_ID = _POLICY.where(projects.c.public_id == sa.bindparam("project_id"))


#: The policies a transaction has read, by project key and public id: a
#: hand-in reads its project's policy, then the reviews plugin asks for it
#: through the queue seam in the same transaction. Revising a policy forgets
#: them (:func:`forget_policies`).
_READ: weakref.WeakKeyDictionary[Any, dict[Any, dict[str, Any]]] = weakref.WeakKeyDictionary()


async def current_policy(conn: Any, project_pk: int) -> dict[str, Any]:
    """The project's current workflow policy (the defaults before any revision)."""
    found = await _policy(conn, ("pk", project_pk), _POLICY_BY_PK, {"project_pk": project_pk})
    return dict(DEFAULT_POLICY) if found is None else found


async def policy_of_project(conn: Any, project_id: str) -> dict[str, Any] | None:
    """:func:`current_policy` by the project's public id, in one statement;
    ``None`` when there is no such project."""
    return await _policy(conn, ("id", project_id), _POLICY_BY_ID, {"project_id": project_id})


async def _policy(
    conn: Any, key: tuple[str, Any], query: Any, params: dict[str, Any]
) -> dict[str, Any] | None:
    read = _READ.setdefault(conn, {})
    if key not in read:
        row = await conn.fetch_one(query, params)
        if row is None:
            return None
        policy = _policy_of(row)
        read[("pk", row["project_pk"])] = read[("id", row["project_id"])] = policy
    return dict(read[key])


def forget_policies(conn: Any) -> None:
    """Forget the policies ``conn`` has read (it has just revised one)."""
    _READ.pop(conn, None)


def _policy_of(row: Any) -> dict[str, Any]:
    if row["revision"] is None:
        return dict(DEFAULT_POLICY)
    policy = {name: row[name] for name in DEFAULT_POLICY}
    policy["created_at"] = row["created_at"]
    policy["human_review_required"] = bool(policy["human_review_required"])
    return policy
