"""Hooks of the work queue: stages, claim checks, submissions, run environments.

The tasks plugin owns task state and calls these hooks; stage plugins
(reviews, integration) and the marketplace answer them. Every hook that
takes ``tx`` is called inside the write transaction of the change, so what a
plugin writes there commits if and only if the change does. Every such hook
also receives ``app`` (:class:`~buildmax_hookspecs.App`): a hook may fire
from a background job as well as from a request, so an implementation uses
the app it is given for the clock, the audit trail and other plugins'
services.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable, Mapping, Sequence
from typing import Any

from .kernel import App
from .markers import hookspec
from .protocols import Transaction
from .records import (
    Actor,
    AgentRevisionRef,
    AttemptRef,
    ReleaseRef,
    StageSpec,
    SubmissionRef,
    TaskRef,
    Verdict,
)


@hookspec
def buildmax_workflow_stages() -> Iterable[StageSpec] | None:
    """The workflow stages this plugin supplies.

    Called by the tasks plugin once when the app is built. A submitted task
    passes through every loaded stage in ``order``; with no stage loaded,
    submit completes the task. Two stages with the same name are a start-up
    error.
    """


@hookspec
def buildmax_stage_entered(
    app: App, tx: Transaction, subject: TaskRef, stage: str, work: Sequence[TaskRef], actor: Actor
) -> Awaitable[None] | None:
    """A submission of ``subject`` entered ``stage``: ``work`` are the linked
    work items just created for it (by slot); ``actor`` handed in the work
    that moved it there.

    Called by the tasks plugin inside the write transaction that created
    them, for every stage entered. The stage's plugin may record its own
    rows and steer the work through ``TaskQueue`` (e.g. open a decision that
    parks a work item until a human answers); every other plugin ignores it.
    An exception rolls the submission back.
    """


@hookspec
def buildmax_claim_check(
    app: App, tx: Transaction, task: TaskRef, principal: Actor
) -> Verdict | Awaitable[Verdict | None] | None:
    """Refuse a claim of ``task`` by ``principal`` (e.g. a reviewer who
    submitted the work under review).

    Called by the tasks plugin inside the claim's write transaction, after
    readiness and holds were checked and before anything is written. Return
    ``Verdict("deny", reason)`` to refuse (a named claim answers 403 with
    the reason; claim-next skips to the next candidate), or ``None`` for no
    opinion. Do not write in ``tx``: a refused candidate must leave nothing.
    """


@hookspec
def buildmax_submission_check(
    app: App,
    tx: Transaction,
    task: TaskRef,
    attempt: AttemptRef,
    submission: SubmissionRef,
    actor: Actor,
) -> Verdict | Awaitable[Verdict | None] | None:
    """Refuse a submission before it is recorded (e.g. one naming artifacts
    that are not evidence of its task).

    Called by the tasks plugin inside the submit's write transaction, for
    every submission, after the attempt was fenced (owner, generation,
    lease) and before anything is written; ``submission`` carries the
    public id it will have and what was handed in (``artifacts``,
    ``candidate``, ``evidence``); ``actor`` is who hands it in. Return
    ``Verdict("deny", reason)`` to refuse: the submit answers 422
    ``submission-refused`` with the reasons of every refusing plugin, and
    nothing is recorded (the attempt stays active). ``None`` has no opinion.
    Do not write in ``tx``.
    """


@hookspec
def buildmax_submission_extensions() -> Iterable[str] | None:
    """The names under which a submission may carry this plugin's data.

    A submit body's ``extensions`` object maps such a name to any JSON
    value (64 KiB in all); a name no loaded plugin declares is refused (422
    ``validation-error``, nothing recorded). The data reaches
    ``buildmax_submission_check`` and ``buildmax_attempt_submitted`` as
    ``submission.extensions[name]``: refuse it in the first, record your own
    rows from it in the second, and they commit with the submission or not
    at all. The tasks plugin does not keep it. Called once when the app is
    built; a name declared by two plugins is a start-up error.
    """


@hookspec
def buildmax_attempt_submitted(
    app: App,
    tx: Transaction,
    task: TaskRef,
    attempt: AttemptRef,
    submission: SubmissionRef,
    actor: Actor,
) -> Verdict | Awaitable[Verdict | None] | None:
    """Judge work handed in.

    Called by the tasks plugin inside the submit's write transaction, after
    the submission row is written, for every submission. ``actor`` is who
    handed it in: the attempt's claimant, or a space admin overriding it
    (``attempt.claimant_id`` differs). For linked stage
    work (``task.subject_task_id`` set), the plugin owning ``task.stage``
    records its own rows (reviews, findings, integrations) and returns a
    :class:`Verdict` about the subject: ``pending`` (more work of the stage
    is still due), ``pass`` (the subject moves to the next stage, or is
    done), ``changes`` (the subject reopens with ``finding_ids`` visible to
    its next attempt) or ``reject`` (the subject fails with the reason).
    Every other plugin returns ``None``. Only the tasks plugin applies the
    verdict to task state. An exception rolls the submit back.
    """


@hookspec
def buildmax_run_environment(
    app: App,
    tx: Transaction,
    task: TaskRef,
    attempt: AttemptRef,
    agent_revision: AgentRevisionRef | None,
) -> Mapping[str, Any] | Awaitable[Mapping[str, Any] | None] | None:
    """What a run must have or should know, resolved when an attempt is
    claimed (plugin pins, lessons that apply to the task).

    Called by the tasks plugin inside the claim's write transaction, before
    the attempt row is written; ``task`` is the task being claimed and
    ``agent_revision`` the assigned agent's current revision, or ``None``
    for an agentless task. The claim answer and the attempt show what was
    recorded (``attempt.run_environment``), so keep an answer small: a
    claim is a hot path, and a plugin with nothing to add should return
    ``None`` without a statement where it can. Return a JSON-able
    mapping with keys of your own (e.g. ``{"plugins": [...]}``); the answers
    of every plugin are merged and recorded on the attempt, and a key
    returned by two plugins is an error. Raise :class:`RunEnvironmentRefused`
    when the run cannot be resolved: no attempt is created (a named claim
    answers 422 naming the cause; claim-next skips the candidate).
    """


@hookspec
def buildmax_agent_revision(
    app: App, tx: Transaction, space_id: str, revision: AgentRevisionRef, actor: Actor
) -> Verdict | Awaitable[Verdict | None] | None:
    """Validate an agent revision before it is saved.

    Called by the tasks plugin inside the write transaction that saves the
    revision; ``revision`` carries the public id it will have. Return
    ``Verdict("deny", reason)`` to refuse (the request answers 422 with the
    reason and nothing is saved), or ``None``. A plugin may write its own
    rows (e.g. activate a plugin a space in open mode may use).
    """


@hookspec
def buildmax_activation_policy(
    app: App, tx: Transaction, space_id: str, release: ReleaseRef, actor: Actor
) -> Verdict | Awaitable[Verdict | None] | None:
    """May ``release`` be activated in ``space_id`` (or a pin moved onto it)?

    Called by the marketplace plugin inside the write transaction of every
    activation, pin move and automatic activation (an open space's agent
    naming a plugin). Return ``Verdict("deny", reason)`` to refuse (nothing
    is written; the request answers 422 with the reason), or ``None``. The
    marketplace itself refuses a release that starts processes (hooks, MCP
    servers) unless a system admin marked it eligible for unattended use.
    """


class RunEnvironmentRefused(Exception):
    """Raised by a ``buildmax_run_environment`` implementation: this attempt
    cannot run (e.g. the agent names a plugin its space has not activated).
    The message is shown to the claimant."""
