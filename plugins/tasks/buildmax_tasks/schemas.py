"""marshmallow schemas of the tasks plugin's request bodies and responses."""

from __future__ import annotations

import json
from typing import Any

from buildmax_hookspecs import (
    LABEL_PATTERN,
    SOURCE_ID_CHARS,
    TASK_KINDS,
    TASK_LABELS,
    TASK_LINKS,
    TASK_PRIORITIES,
    TASK_TEXT_CHARS,
    TASK_TITLE_CHARS,
    WORD_PATTERN,
    App,
)
from marshmallow import EXCLUDE, Schema, ValidationError, fields, validate

from buildmax.fulltext import MAX_QUERY_CHARS, MAX_QUERY_TERMS
from buildmax.schemas import (
    NAME_PATTERN,
    BoundedInteger,
    Pattern,
    StrictBoolean,
    Timestamp,
    revision_number,
)

from .settings import task_settings
from .tables import HOLD_SCOPES, HOLD_STRENGTHS, INTEGRATION_MODES, TASK_STATES

LABEL = fields.String(validate=Pattern(LABEL_PATTERN))
RESOURCE = fields.String(validate=Pattern(r"^[a-z]+:\S{1,500}$"))
MAX_JSON_TEXT = 64 * 1024
#: A decision may stay open at most a year.
MAX_DECISION_SECONDS = 366 * 24 * 3600
#: A task named by a client (its id).
TASK_REF = validate.Length(min=1, max=200)
#: Reasons are recorded on the audit trail, whose details are bounded.
#: The longest reason a person or an import gives.
REASON_CHARS = 1000
REASON = validate.Length(min=1, max=REASON_CHARS)


class _Strict(Schema):
    """Unknown fields are refused (the default), named here for readers."""


class Override(_Strict):
    override_reason = fields.String(
        load_default=None, allow_none=True, validate=validate.Length(min=1, max=1000)
    )


# -- projects and policies ---------------------------------------------------


class ProjectCreate(_Strict):
    name = fields.String(required=True, validate=Pattern(NAME_PATTERN))
    description = fields.String(load_default="", validate=validate.Length(max=10_000))
    repository_url = fields.String(
        load_default=None, allow_none=True, validate=validate.Length(min=1, max=2000)
    )
    target_branch = fields.String(
        load_default=None, allow_none=True, validate=validate.Length(min=1, max=200)
    )


class ProjectUpdate(_Strict):
    expected_revision = revision_number(required=True)
    description = fields.String(validate=validate.Length(max=10_000))
    repository_url = fields.String(allow_none=True, validate=validate.Length(min=1, max=2000))
    target_branch = fields.String(allow_none=True, validate=validate.Length(min=1, max=200))


class PolicyBody(_Strict):
    expected_revision = revision_number(load_default=None, allow_none=True)
    approvals_required = BoundedInteger(0, 10, required=True)
    human_review_required = StrictBoolean(load_default=False)
    integration = fields.String(
        load_default="automatic", validate=validate.OneOf(INTEGRATION_MODES)
    )


class PolicyOut(Schema):
    revision = fields.Integer()
    approvals_required = fields.Integer()
    human_review_required = fields.Boolean()
    integration = fields.String()
    created_at = Timestamp(allow_none=True)


class ProjectOut(Schema):
    id = fields.String()
    name = fields.String()
    description = fields.String()
    repository_url = fields.String(allow_none=True)
    target_branch = fields.String(allow_none=True)
    revision = fields.Integer()
    policy = fields.Nested(PolicyOut)
    created_at = Timestamp()
    updated_at = Timestamp()


class ProjectPage(Schema):
    items = fields.List(fields.Nested(ProjectOut))
    next_cursor = fields.String(allow_none=True)


# -- tasks -------------------------------------------------------------------

#: A source's name and a link's kind: a short lowercase word.
WORD = Pattern(WORD_PATTERN)
#: The states a task may be created in: closed ones only with a source.
CREATED_STATES = ("ready", "done", "canceled")


class TaskSource(_Strict):
    system = fields.String(required=True, validate=WORD)
    id = fields.String(required=True, validate=validate.Length(min=1, max=SOURCE_ID_CHARS))


class LinkedTask(_Strict):
    kind = fields.String(required=True, validate=WORD)
    task = fields.String(required=True, validate=TASK_REF)


def _links(**kwargs: Any) -> fields.List[Any]:
    return fields.List(
        fields.Nested(LinkedTask), validate=validate.Length(max=TASK_LINKS), **kwargs
    )


class TaskCreate(_Strict):
    project = fields.String(required=True, validate=validate.Length(min=1, max=200))
    title = fields.String(required=True, validate=validate.Length(min=1, max=TASK_TITLE_CHARS))
    body = fields.String(load_default="", validate=validate.Length(max=TASK_TEXT_CHARS))
    criteria = fields.String(load_default="", validate=validate.Length(max=TASK_TEXT_CHARS))
    kind = fields.String(load_default="code", validate=validate.OneOf(TASK_KINDS))
    priority = BoundedInteger(*TASK_PRIORITIES, load_default=0)
    labels = fields.List(LABEL, load_default=list, validate=validate.Length(max=TASK_LABELS))
    agent = fields.String(load_default=None, allow_none=True)
    max_attempts = BoundedInteger(1, 100, load_default=3)
    resources = fields.List(RESOURCE, load_default=list, validate=validate.Length(max=20))
    prerequisites = fields.List(
        fields.String(validate=TASK_REF),
        load_default=list,
        validate=validate.Length(max=TASK_LINKS),
    )
    source = fields.Nested(TaskSource, load_default=None, allow_none=True)
    state = fields.String(load_default="ready", validate=validate.OneOf(CREATED_STATES))
    outcome_reason = fields.String(load_default=None, allow_none=True, validate=REASON)
    links = _links(load_default=list)


class TaskLinks(_Strict):
    links = _links(required=True)


class TaskUpdate(Override):
    expected_revision = revision_number(required=True)
    title = fields.String(validate=validate.Length(min=1, max=TASK_TITLE_CHARS))
    body = fields.String(validate=validate.Length(max=TASK_TEXT_CHARS))
    criteria = fields.String(validate=validate.Length(max=TASK_TEXT_CHARS))
    priority = BoundedInteger(*TASK_PRIORITIES)
    labels = fields.List(LABEL, validate=validate.Length(max=TASK_LABELS))
    agent = fields.String(allow_none=True)
    max_attempts = BoundedInteger(1, 100)
    resources = fields.List(RESOURCE, validate=validate.Length(max=20))


class Reason(Override):
    reason = fields.String(required=True, validate=REASON)


class DependencyBody(_Strict):
    prerequisite = fields.String(required=True, validate=TASK_REF)


class HoldRef(Schema):
    id = fields.String()
    scope = fields.Dict()
    strength = fields.String()
    reason = fields.String()


class TaskOut(Schema):
    id = fields.String()
    project_id = fields.String()
    kind = fields.String()
    title = fields.String()
    body = fields.String()
    criteria = fields.String()
    revision = fields.Integer()
    priority = fields.Integer()
    labels = fields.List(fields.String())
    agent_id = fields.String(allow_none=True)
    state = fields.String(validate=validate.OneOf(TASK_STATES))
    parked = fields.Boolean()
    held_by = fields.List(fields.Nested(HoldRef))
    pending_decisions = fields.List(fields.String())
    stage = fields.String(allow_none=True)
    stage_missing = fields.Boolean()
    slot = fields.Integer(allow_none=True)
    human_only = fields.Boolean()
    subject_task_id = fields.String(allow_none=True)
    submission_id = fields.String(allow_none=True)
    generation = fields.Integer()
    max_attempts = fields.Integer()
    attempts_used = fields.Integer()
    current_attempt_id = fields.String(allow_none=True)
    current_submission_id = fields.String(allow_none=True)
    finding_ids = fields.List(fields.String())
    outcome_reason = fields.String(allow_none=True)
    resources = fields.List(fields.String())
    source = fields.Nested(TaskSource, allow_none=True)
    links = fields.List(fields.Nested(LinkedTask))
    ready_at = Timestamp(allow_none=True)
    created_at = Timestamp()
    updated_at = Timestamp()


class TaskPage(Schema):
    items = fields.List(fields.Nested(TaskOut))
    next_cursor = fields.String(allow_none=True)


class TaskMatch(Schema):
    snippet = fields.String(
        metadata={
            "description": "A few words of the title or criteria around what matched, each "
            "matched word between U+0002 and U+0003 (control characters no title or criteria "
            "shows there otherwise): escape the snippet, then mark them"
        }
    )


class ListedTask(TaskOut):
    match = fields.Nested(
        TaskMatch, metadata={"description": "Why a search found the task (only with q)"}
    )


class TaskListPage(Schema):
    items = fields.List(fields.Nested(ListedTask))
    next_cursor = fields.String(allow_none=True)


class TaskCountQuery(Schema):
    """Which tasks are counted."""

    class Meta:
        unknown = EXCLUDE

    project = fields.String(metadata={"description": "Only this project's tasks (id or name)"})


class TaskCounts(Schema):
    states = fields.Dict(
        keys=fields.String(),
        values=fields.Integer(),
        metadata={"description": "Tasks in each state (every state named, 0 when none)"},
    )
    total = fields.Integer()


class RevisionOut(Schema):
    number = fields.Integer()
    title = fields.String()
    body = fields.String()
    criteria = fields.String()
    created_at = Timestamp()


class RevisionPage(Schema):
    items = fields.List(fields.Nested(RevisionOut))
    next_cursor = fields.String(allow_none=True)


class TaskLink(Schema):
    id = fields.String()
    state = fields.String()
    title = fields.String()


class DependenciesOut(Schema):
    prerequisites = fields.List(fields.Nested(TaskLink))
    dependents = fields.List(fields.Nested(TaskLink))


# -- claims and attempts -----------------------------------------------------


def _lease_max_seconds(app: App) -> int:
    return task_settings(app).lease_max_seconds


def lease_seconds() -> BoundedInteger:
    """A lease a claim or renewal asks for: up to the configured maximum."""
    return BoundedInteger(1, _lease_max_seconds, load_default=None, allow_none=True)


class ClaimBody(_Strict):
    lease_seconds = lease_seconds()


class ClaimNextBody(ClaimBody):
    project = fields.String(load_default=None, allow_none=True)
    kind = fields.String(load_default=None, allow_none=True, validate=validate.OneOf(TASK_KINDS))
    label = LABEL
    agent = fields.String(load_default=None, allow_none=True)


class AttemptOut(Schema):
    id = fields.String()
    task_id = fields.String()
    generation = fields.Integer()
    claimant_id = fields.String()
    agent_revision_id = fields.String(allow_none=True)
    state = fields.String()
    lease_expires_at = Timestamp()
    run_environment = fields.Dict()
    progress = fields.Raw(allow_none=True)
    end_reason = fields.String(allow_none=True)
    created_at = Timestamp()
    renewed_at = Timestamp(allow_none=True)
    ended_at = Timestamp(allow_none=True)


class AttemptPage(Schema):
    items = fields.List(fields.Nested(AttemptOut))
    next_cursor = fields.String(allow_none=True)


class ClaimOut(Schema):
    task = fields.Nested(TaskOut, allow_none=True)
    attempt = fields.Nested(AttemptOut, allow_none=True)
    token = fields.String(allow_none=True)
    token_id = fields.String(allow_none=True)
    skipped = fields.Integer()


class Generation(Override):
    generation = revision_number(required=True)


class RenewBody(Generation):
    lease_seconds = lease_seconds()
    progress = fields.Raw(load_default=None, allow_none=True)


class CheckpointBody(Generation):
    data = fields.Raw(required=True)


class ReleaseBody(Generation):
    reason = fields.String(load_default=None, allow_none=True, validate=validate.Length(max=1000))


class FailBody(Generation):
    reason = fields.String(required=True, validate=REASON)


class CancelAttemptBody(Generation):
    reason = fields.String(required=True, validate=REASON)


#: The most artifacts one submission names.
MAX_SUBMISSION_ARTIFACTS = 100


#: The most bytes of JSON a submission carries for other plugins (``extensions``).
MAX_SUBMISSION_EXTENSION_BYTES = 64 * 1024


def _distinct(values: list[str]) -> None:
    if len(set(values)) != len(values):
        raise ValidationError("Each artifact is named once.")


def _extensions_size(value: dict[str, Any]) -> None:
    try:
        size = len(json.dumps(value, separators=(",", ":")).encode())
    except RecursionError:
        raise ValidationError("The extensions are nested too deeply.") from None
    if size > MAX_SUBMISSION_EXTENSION_BYTES:
        raise ValidationError(
            f"The extensions take {size} bytes of JSON; at most "
            f"{MAX_SUBMISSION_EXTENSION_BYTES} are accepted."
        )


class SubmitBody(Generation):
    summary = fields.String(required=True, validate=validate.Length(min=1, max=20_000))
    candidate = fields.Dict(load_default=dict)
    evidence = fields.Dict(load_default=dict)
    artifacts = fields.List(
        fields.String(validate=validate.Length(min=1, max=64)),
        load_default=list,
        validate=[validate.Length(max=MAX_SUBMISSION_ARTIFACTS), _distinct],
        metadata={"description": "Public ids of the artifacts handed in as evidence"},
    )
    extensions = fields.Dict(
        keys=fields.String(validate=validate.Length(min=1, max=64)),
        values=fields.Raw(allow_none=True),
        load_default=dict,
        validate=_extensions_size,
        metadata={
            "description": "Data for other plugins, by the name each declared (for example "
            "lessons learned); committed with the submission or not at all"
        },
    )


class SubmissionOut(Schema):
    id = fields.String()
    task_id = fields.String()
    attempt_id = fields.String()
    generation = fields.Integer()
    task_revision = fields.Integer()
    submitted_by = fields.String()
    summary = fields.String()
    candidate = fields.Dict()
    evidence = fields.Dict()
    artifacts = fields.List(fields.String())
    verdict = fields.String(allow_none=True)
    created_at = Timestamp()


class SubmissionPage(Schema):
    items = fields.List(fields.Nested(SubmissionOut))
    next_cursor = fields.String(allow_none=True)


class SubmitOut(Schema):
    submission = fields.Nested(SubmissionOut)
    task = fields.Nested(TaskOut)
    stage = fields.String(allow_none=True)
    work_ids = fields.List(fields.String())


class CheckpointOut(Schema):
    attempt_id = fields.String()
    number = fields.Integer()
    created_at = Timestamp()


class CheckpointItem(Schema):
    number = fields.Integer(metadata={"description": "Its place among the attempt's, from 1"})
    data = fields.Raw(metadata={"description": "The JSON value the owner recorded"})
    created_at = Timestamp()


class CheckpointPage(Schema):
    items = fields.List(fields.Nested(CheckpointItem))
    next_cursor = fields.String(allow_none=True)


# -- holds, decisions, agents -------------------------------------------------


class HoldCreate(_Strict):
    scope = fields.String(required=True, validate=validate.OneOf(HOLD_SCOPES))
    target = fields.String(load_default=None, allow_none=True)
    strength = fields.String(required=True, validate=validate.OneOf(HOLD_STRENGTHS))
    reason = fields.String(required=True, validate=REASON)


class HoldOut(Schema):
    id = fields.String()
    scope = fields.Dict()
    strength = fields.String()
    reason = fields.String()
    created_by = fields.String(allow_none=True)
    created_at = Timestamp()
    lifted_by = fields.String(allow_none=True)
    lifted_at = Timestamp(allow_none=True)


class HoldPage(Schema):
    items = fields.List(fields.Nested(HoldOut))
    next_cursor = fields.String(allow_none=True)


class DecisionCreate(_Strict):
    question = fields.String(required=True, validate=validate.Length(min=1, max=5000))
    options = fields.List(
        fields.String(validate=validate.Length(min=1, max=200)),
        required=True,
        validate=validate.Length(min=1, max=20),
    )
    answerable_by = fields.String(
        load_default="human", validate=validate.OneOf(("human", "member"))
    )
    expires_in_seconds = BoundedInteger(1, MAX_DECISION_SECONDS, load_default=None, allow_none=True)


class DecisionAnswer(_Strict):
    answer = fields.String(required=True, validate=validate.Length(min=1, max=200))
    comment = fields.String(load_default=None, allow_none=True, validate=validate.Length(max=5000))


class DecisionOut(Schema):
    id = fields.String()
    task_id = fields.String()
    question = fields.String()
    options = fields.List(fields.String())
    answerable_by = fields.String()
    state = fields.String()
    answer = fields.String(allow_none=True)
    comment = fields.String(allow_none=True)
    opened_by = fields.String(allow_none=True)
    answered_by = fields.String(allow_none=True)
    created_at = Timestamp()
    expires_at = Timestamp(allow_none=True)
    answered_at = Timestamp(allow_none=True)


class DecisionPage(Schema):
    items = fields.List(fields.Nested(DecisionOut))
    next_cursor = fields.String(allow_none=True)


class AgentCreate(_Strict):
    name = fields.String(required=True, validate=Pattern(NAME_PATTERN))
    instructions = fields.String(load_default="", validate=validate.Length(max=100_000))
    plugins = fields.List(
        fields.String(validate=Pattern(NAME_PATTERN)),
        load_default=list,
        validate=validate.Length(max=50),
    )


class AgentRevise(_Strict):
    expected_revision = revision_number(load_default=None, allow_none=True)
    instructions = fields.String(required=True, validate=validate.Length(max=100_000))
    plugins = fields.List(
        fields.String(validate=Pattern(NAME_PATTERN)),
        required=True,
        validate=validate.Length(max=50),
    )


class AgentRevisionOut(Schema):
    id = fields.String()
    number = fields.Integer()
    instructions = fields.String()
    plugins = fields.List(fields.String())
    created_at = Timestamp()


class AgentOut(Schema):
    id = fields.String()
    name = fields.String()
    revision = fields.Nested(AgentRevisionOut)
    created_at = Timestamp()


class AgentPage(Schema):
    items = fields.List(fields.Nested(AgentOut))
    next_cursor = fields.String(allow_none=True)


class AgentRevisionPage(Schema):
    items = fields.List(fields.Nested(AgentRevisionOut))
    next_cursor = fields.String(allow_none=True)


class QueueQuery(Schema):
    """The filters of the ready queue."""

    class Meta:
        unknown = EXCLUDE  # the page's limit and cursor are read on their own

    project = fields.String(metadata={"description": "Only this project's tasks (id or name)"})
    kind = fields.String(
        validate=validate.OneOf(TASK_KINDS), metadata={"description": "Only tasks of this kind"}
    )
    label = fields.String(metadata={"description": "Only tasks carrying this label"})
    agent = fields.String(metadata={"description": "Only tasks for this agent (id or name)"})


class TaskListQuery(QueueQuery):
    """The filters of the task list."""

    state = fields.String(
        validate=validate.OneOf(TASK_STATES), metadata={"description": "Only tasks in this state"}
    )
    q = fields.String(
        validate=validate.Length(max=MAX_QUERY_CHARS),
        metadata={
            "description": "Full-text search of the title and acceptance criteria: words "
            '(stemmed: "fail" finds "failing") and "quoted phrases", every one of which must '
            "match; anything else is only text. Answers in relevance order (ties: newest "
            "first), each item with match.snippet; at most "
            f"{MAX_QUERY_TERMS} words and phrases. Empty: no search"
        },
    )
    min_priority = BoundedInteger(
        *TASK_PRIORITIES,
        text=True,
        metadata={"description": "Only tasks of at least this priority"},
    )


class DecisionListQuery(Schema):
    """The filters of the decision list."""

    class Meta:
        unknown = EXCLUDE

    state = fields.String(
        load_default="pending",
        validate=validate.OneOf(("pending", "answered", "all")),
        metadata={"description": "pending (the default), answered or all"},
    )
    task = fields.String(metadata={"description": "Only this task's decisions"})
