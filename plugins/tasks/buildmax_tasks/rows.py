"""The plugin's rows as its code reads them: one frozen dataclass per kind.

One naming rule holds in every row: ``pk`` is the row's numeric key and
``id`` its public id; a numeric key of another row ends in ``_pk``
(``task_pk``, ``claimant_pk``) and a public id in ``_id`` (``task_id``).
Numeric keys never leave the server; public ids are what the API and the
contract's records carry. JSON columns stay text here (they are parsed
where they are shown).

Each row is read with a SELECT of :mod:`buildmax_tasks.records` whose
column labels are the dataclass's fields; :func:`buildmax.tables.keyed`
labels a table's own columns by the rule above.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class TaskRow:
    """A task with its current revision's body and criteria and the public
    ids of everything it points at."""

    pk: int
    id: str
    space_pk: int
    space_id: str
    project_pk: int
    project_id: str
    kind: str
    title: str
    priority: int
    labels: str
    resources: str
    agent_pk: int | None
    agent_id: str | None
    state: str
    stage: str | None
    #: Linked stage work: the task and submission it examines, its slot.
    subject_task_pk: int | None
    subject_task_id: str | None
    subject_submission_pk: int | None
    subject_submission_id: str | None
    slot: int | None
    human_only: int
    max_attempts: int
    attempts_used: int
    generation: int
    revision: int
    current_attempt_pk: int | None
    current_attempt_id: str | None
    current_submission_pk: int | None
    current_submission_id: str | None
    finding_ids: str
    outcome_reason: str | None
    ready_at: int | None
    created_at: int
    created_by_pk: int | None
    updated_at: int
    source_system: str | None
    source_id: str | None
    links: str
    body: str
    criteria: str

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> TaskRow:
        """A row read with :data:`buildmax_tasks.records.TASK_SELECT`."""
        return cls(**row)


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """An attempt with the public ids of its task, space, claimant and
    agent revision, and its task's subject (stage work locks it first)."""

    pk: int
    id: str
    task_pk: int
    task_id: str
    subject_task_pk: int | None
    space_pk: int
    space_id: str
    generation: int
    claimant_pk: int
    claimant_id: str
    claimant_kind: str
    agent_revision_pk: int | None
    agent_revision_id: str | None
    state: str
    lease_expires_at: int
    run_environment: str
    progress: str | None
    token_id: str | None
    hold_refused_at: int | None
    charged: int
    end_reason: str | None
    created_at: int
    renewed_at: int | None
    ended_at: int | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> AttemptRow:
        """A row read with :data:`buildmax_tasks.records.ATTEMPT_SELECT`."""
        return cls(**row)


@dataclass(frozen=True, slots=True)
class SubmissionRow:
    """A submission with the public ids it points at and the artifacts it
    names (a JSON array, or ``None`` when it names none)."""

    pk: int
    id: str
    task_pk: int
    task_id: str
    attempt_pk: int
    attempt_id: str
    generation: int
    task_revision: int
    submitted_by_pk: int
    submitted_by_id: str
    summary: str
    candidate: str
    evidence: str
    verdict: str | None
    created_at: int
    artifact_ids: str | None
    #: What other plugins take from a hand-in in progress; never stored.
    extensions: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> SubmissionRow:
        """A row read with :data:`buildmax_tasks.records.SUBMISSION_SELECT`."""
        return cls(**row)


@dataclass(frozen=True, slots=True)
class AgentRow:
    """An agent definition; its current revision is ``current_revision_pk``."""

    pk: int
    id: str
    space_pk: int
    name: str
    current_revision_pk: int | None
    created_at: int
    created_by_pk: int | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> AgentRow:
        """A row read with :data:`buildmax_tasks.records.AGENT_SELECT`."""
        return cls(**row)


@dataclass(frozen=True, slots=True)
class AgentRevisionRow:
    """A revision of an agent definition with its agent and space."""

    pk: int
    id: str
    agent_pk: int
    agent_id: str
    agent_name: str
    space_id: str
    number: int
    instructions: str
    plugins: str
    created_at: int
    created_by_pk: int | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> AgentRevisionRow:
        """A row read with :data:`buildmax_tasks.records.AGENT_REVISION_SELECT`."""
        return cls(**row)


@dataclass(frozen=True, slots=True)
class ProjectRow:
    """A project; ``policy_pk`` is its current review policy's revision row."""

    pk: int
    id: str
    space_pk: int
    name: str
    description: str
    repository_url: str | None
    target_branch: str | None
    policy_pk: int | None
    revision: int
    created_at: int
    created_by_pk: int | None
    updated_at: int

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> ProjectRow:
        """A row read with :data:`buildmax_tasks.records.PROJECT_SELECT`."""
        return cls(**row)


@dataclass(frozen=True, slots=True)
class HoldRow:
    """A hold on the space, a project or a task (``scope_pk``: the
    project's or task's numeric key, ``None`` for the space), with who
    placed and lifted it."""

    pk: int
    id: str
    space_pk: int
    scope_type: str
    scope_pk: int | None
    strength: str
    reason: str
    created_by_pk: int | None
    created_by_id: str | None
    created_at: int
    lifted_by_pk: int | None
    lifted_by_id: str | None
    lifted_at: int | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> HoldRow:
        """A row read with :data:`buildmax_tasks.records.HOLD_SELECT`."""
        return cls(**row)


@dataclass(frozen=True, slots=True)
class DecisionRow:
    """A decision that parks a task until it is answered, with the public
    ids of its task and of who opened and answered it."""

    pk: int
    id: str
    space_pk: int
    task_pk: int
    task_id: str
    question: str
    options: str
    answerable_by: str
    state: str
    answer: str | None
    comment: str | None
    opened_by_pk: int | None
    opened_by_id: str | None
    answered_by_pk: int | None
    answered_by_id: str | None
    created_at: int
    expires_at: int | None
    answered_at: int | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> DecisionRow:
        """A row read with :data:`buildmax_tasks.records.DECISION_SELECT`."""
        return cls(**row)
