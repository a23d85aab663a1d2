"""Typed calls for the tasks plugin's routes, on top of :mod:`buildmax.client`.

:class:`TasksClient` wraps a kernel :class:`~buildmax.client.Client` (and
:class:`AsyncTasksClient` an :class:`~buildmax.client.AsyncClient`), so one
connection, with its retries, idempotency keys and paging, serves the
kernel's calls and these::

    with Client() as bmx:
        tasks = TasksClient(bmx)
        claim = tasks.claim_next("web", project="shop")
        if claim["task"] is not None:
            attempt = claim["attempt"]
            tasks.renew("web", attempt["id"], attempt["generation"], progress={"step": 1})
            tasks.submit("web", attempt["id"], attempt["generation"], "fixed the login form",
                         candidate={"commit": "3f2a9c1", "branch": "fix-login"})

Every call names the space (id or slug) first. Attempt calls carry the
attempt's ``generation``: a stale one is refused (:class:`StaleGeneration`).
A claim's ``token`` is scoped to its attempt and shown once; whoever should
act on that attempt and nothing else gets a client of its own,
``TasksClient(Client(url, claim["token"]))``.

Importing this module gives the plugin's problems typed exceptions, each a
subclass of the kernel's :class:`~buildmax.client.Conflict`,
:class:`~buildmax.client.Forbidden` or
:class:`~buildmax.client.ValidationError`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, TypeVar

from buildmax.client import (
    BuildMaxError,
    Calls,
    Conflict,
    Forbidden,
    OverAsyncClient,
    OverClient,
    ValidationError,
    present,
    space_path,
)
from buildmax.client import (
    NameTaken as NameTaken,  # the kernel's, raised for a project or agent name too
)
from buildmax.fulltext import MARK_END as MARK_END
from buildmax.fulltext import MARK_START as MARK_START
from buildmax_tasks import problems

# -- errors -------------------------------------------------------------------


class _NamesHolder(BuildMaxError):
    """A refusal because another attempt holds what was asked for."""

    @property
    def holder(self) -> dict[str, Any] | None:
        """The holding attempt (``attempt_id``, ``principal_id``,
        ``lease_expires_at``), as the server named it."""
        holder = self.body.get("holder") if isinstance(self.body, dict) else None
        return holder if isinstance(holder, dict) else None

    def __str__(self) -> str:
        holder = self.holder
        if holder is None:
            return super().__str__()
        return (
            f"{super().__str__()} (attempt {holder.get('attempt_id')} of "
            f"{holder.get('principal_id')}, lease until {holder.get('lease_expires_at')})"
        )


class TaskNotClaimable(Conflict, answers=problems.TaskNotClaimable):
    """the task is not ready."""


class TaskClaimed(_NamesHolder, Conflict, answers=problems.TaskClaimed):
    """another attempt holds the task (see ``holder``)."""


class ResourceReserved(_NamesHolder, Conflict, answers=problems.ResourceReserved):
    """a resource the task needs is reserved (see ``holder``)."""


class TaskParked(Conflict, answers=problems.TaskParked):
    """the task waits for a decision."""


class TaskHeld(Forbidden, answers=problems.TaskHeld):
    """a hold refuses claims (or, when stopped, renewals)."""

    @property
    def hold(self) -> dict[str, Any] | None:
        """The refusing hold (``id``, ``scope``, ``strength``, ``reason``)."""
        hold = self.body.get("hold") if isinstance(self.body, dict) else None
        return hold if isinstance(hold, dict) else None

    def __str__(self) -> str:
        hold = self.hold
        return f"{super().__str__()} (hold {hold.get('id')})" if hold else super().__str__()


class ClaimVetoed(Forbidden, answers=problems.ClaimVetoed):
    """a claim check refused the claim."""


class StageNotLoaded(Conflict, answers=problems.StageNotLoaded):
    """the work belongs to a stage whose plugin is not loaded."""


class RunEnvironmentUnresolved(ValidationError, answers=problems.RunEnvironmentUnresolved):
    """no run environment for the claim."""


class StaleGeneration(Conflict, answers=problems.StaleGeneration):
    """the attempt's generation is not the one sent."""


class LeaseLapsed(Conflict, answers=problems.LeaseLapsed):
    """the attempt's lease ran out."""


class AttemptEnded(Conflict, answers=problems.AttemptEnded):
    """the attempt was submitted, released, failed or canceled."""


class NotAttemptOwner(Forbidden, answers=problems.NotAttemptOwner):
    """only the attempt's owner may do this."""


class DependencyCycle(Conflict, answers=problems.DependencyCycle):
    """the prerequisite would close a cycle."""


class RevisionConflict(Conflict, answers=problems.RevisionConflict):
    """the record changed since it was read."""


class InvalidState(Conflict, answers=problems.InvalidState):
    """the record's state does not allow this."""


class SourceTaken(Conflict, answers=problems.SourceTaken):
    """a task of the space already comes from this source record (see ``task``)."""

    @property
    def task(self) -> str | None:
        """The id of the task made from the record, as the server named it."""
        task = self.body.get("task") if isinstance(self.body, dict) else None
        return task if isinstance(task, str) else None


class SubmissionRefused(ValidationError, answers=problems.SubmissionRefused):
    """a plugin refused the submission (for
    example an artifact it names is not evidence of its task)."""


class AgentRevisionRefused(ValidationError, answers=problems.AgentRevisionRefused):
    """a plugin refused the agent revision."""


#: The plugin's exception classes, one per problem of :mod:`buildmax_tasks.problems`.
ERRORS: tuple[type[BuildMaxError], ...] = (
    TaskNotClaimable,
    TaskClaimed,
    ResourceReserved,
    TaskParked,
    TaskHeld,
    ClaimVetoed,
    StageNotLoaded,
    RunEnvironmentUnresolved,
    StaleGeneration,
    LeaseLapsed,
    AttemptEnded,
    NotAttemptOwner,
    DependencyCycle,
    RevisionConflict,
    InvalidState,
    SourceTaken,
    SubmissionRefused,
    AgentRevisionRefused,
)


# -- the calls ------------------------------------------------------------------

_One = TypeVar("_One")
_Many = TypeVar("_Many")
_Done = TypeVar("_Done")


def _listed(values: Sequence[str] | None) -> list[str] | None:
    return None if values is None else list(values)


class _TaskRoutes(Calls[_One, _Many, _Done]):
    """Typed calls for the tasks plugin's routes, shared by both clients.

    ``_One``, ``_Many`` and ``_Done`` are what a call returns: a dict, a list
    of dicts and nothing for :class:`TasksClient`; awaitables of those for
    :class:`AsyncTasksClient`. Optional arguments left at ``None`` are not
    sent, so the server's defaults apply.
    """

    # -- projects and policies --

    def create_project(
        self,
        space: str,
        name: str,
        description: str | None = None,
        repository_url: str | None = None,
        target_branch: str | None = None,
    ) -> _One:
        """Create a project (members); the name is unique in the space."""
        body = present(
            name=name,
            description=description,
            repository_url=repository_url,
            target_branch=target_branch,
        )
        return self._one("POST", space_path(space, "projects"), json=body)

    def list_projects(self, space: str) -> _Many:
        """The space's projects, by name, each with its current policy."""
        return self._many(space_path(space, "projects"))

    def get_project(self, space: str, project: str) -> _One:
        """A project by id or name."""
        return self._one("GET", space_path(space, "projects", project))

    def update_project(
        self, space: str, project: str, expected_revision: int, **changes: Any
    ) -> _One:
        """Change ``description``, ``repository_url`` or ``target_branch``
        (members); 409 :class:`RevisionConflict` unless the project is at
        ``expected_revision``."""
        body = {"expected_revision": expected_revision, **changes}
        return self._one("PATCH", space_path(space, "projects", project), json=body)

    def set_policy(
        self,
        space: str,
        project: str,
        approvals_required: int,
        human_review_required: bool | None = None,
        integration: str | None = None,
        expected_revision: int | None = None,
    ) -> _One:
        """A new workflow policy revision (space admins); ``integration`` is
        ``automatic`` or ``human``; ``expected_revision`` (0 before the
        first) refuses a concurrent change."""
        body = present(
            approvals_required=approvals_required,
            human_review_required=human_review_required,
            integration=integration,
            expected_revision=expected_revision,
        )
        return self._one("POST", space_path(space, "projects", project, "policy"), json=body)

    def list_policies(self, space: str, project: str) -> _Many:
        """Every policy revision of a project, newest (current) first."""
        return self._many(space_path(space, "projects", project, "policies"))

    # -- tasks --

    def create_task(
        self,
        space: str,
        project: str,
        title: str,
        body: str | None = None,
        criteria: str | None = None,
        *,
        kind: str | None = None,
        priority: int | None = None,
        labels: Sequence[str] | None = None,
        agent: str | None = None,
        max_attempts: int | None = None,
        resources: Sequence[str] | None = None,
        prerequisites: Sequence[str] | None = None,
        source: Mapping[str, str] | None = None,
        state: str | None = None,
        outcome_reason: str | None = None,
        links: Sequence[Mapping[str, str]] | None = None,
    ) -> _One:
        """Create a task (members): ready at once, or open until every
        prerequisite (task ids) is done. ``resources`` are claimed exclusively
        (``repo:<url>@<branch>``, ``path:<repo>/<dir>/``). ``source``
        (``{"system": "beads", "id": "bd-12"}``) names the record of another
        tool it is made from (409 :class:`SourceTaken` when a task of the
        space already is); such a task may be created ``state="done"`` or
        ``"canceled"``. ``links`` (``[{"kind": "parent", "task": id}]``) tie
        it to other tasks of the space."""
        fields = present(
            project=project,
            title=title,
            body=body,
            criteria=criteria,
            kind=kind,
            priority=priority,
            labels=_listed(labels),
            agent=agent,
            max_attempts=max_attempts,
            resources=_listed(resources),
            prerequisites=_listed(prerequisites),
            source=None if source is None else dict(source),
            state=state,
            outcome_reason=outcome_reason,
            links=None if links is None else [dict(link) for link in links],
        )
        return self._one("POST", space_path(space, "tasks"), json=fields)

    def list_tasks(
        self,
        space: str,
        *,
        state: str | None = None,
        kind: str | None = None,
        label: str | None = None,
        project: str | None = None,
        agent: str | None = None,
        q: str | None = None,
    ) -> _Many:
        """Tasks matching every filter given, newest first; with ``q``, a
        search (:meth:`search_tasks`)."""
        params = present(state=state, kind=kind, label=label, project=project, agent=agent, q=q)
        return self._many(space_path(space, "tasks"), params)

    def search_tasks(
        self,
        space: str,
        text: str,
        *,
        state: str | None = None,
        kind: str | None = None,
        label: str | None = None,
        project: str | None = None,
        agent: str | None = None,
    ) -> _Many:
        """Tasks whose title and acceptance criteria hold every word (stemmed)
        and ``"quoted phrase"`` of ``text``, and match every filter given:
        the most relevant first (ties: newest first), among the newest 1,000
        that match. Each has ``match["snippet"]``, its matched words between
        :data:`MARK_START` and :data:`MARK_END`. A ``text`` with no word is
        refused (:class:`~buildmax.client.ValidationError`)."""
        return self.list_tasks(
            space, state=state, kind=kind, label=label, project=project, agent=agent, q=text
        )

    def list_ready(
        self,
        space: str,
        *,
        kind: str | None = None,
        label: str | None = None,
        project: str | None = None,
        agent: str | None = None,
    ) -> _Many:
        """The ready queue: claimable tasks by priority, then age (held and
        parked ones left out)."""
        params = present(kind=kind, label=label, project=project, agent=agent)
        return self._many(space_path(space, "ready"), params)

    def get_task(self, space: str, task: str) -> _One:
        """A task with its state, why it is parked, its stage and current attempt."""
        return self._one("GET", space_path(space, "tasks", task))

    def update_task(
        self,
        space: str,
        task: str,
        expected_revision: int,
        *,
        override_reason: str | None = None,
        **changes: Any,
    ) -> _One:
        """Revise ``title``, ``body``, ``criteria``, ``priority``, ``labels``,
        ``agent`` (``None`` unassigns), ``max_attempts`` or ``resources``
        (members); 409 :class:`RevisionConflict` unless the task is at
        ``expected_revision``. A task another principal holds needs a space
        admin and ``override_reason``."""
        body = {
            "expected_revision": expected_revision,
            **present(override_reason=override_reason),
            **changes,
        }
        return self._one("PATCH", space_path(space, "tasks", task), json=body)

    def list_task_revisions(self, space: str, task: str) -> _Many:
        """A task's title, body and criteria revisions, newest first."""
        return self._many(space_path(space, "tasks", task, "revisions"))

    def list_dependencies(self, space: str, task: str) -> _One:
        """``prerequisites`` and ``dependents`` of a task, each with its state."""
        return self._one("GET", space_path(space, "tasks", task, "dependencies"))

    def add_dependency(self, space: str, task: str, prerequisite: str) -> _One:
        """Make ``prerequisite`` a prerequisite of ``task`` (members); 409
        :class:`DependencyCycle` when it would close a cycle. Answers as
        :meth:`list_dependencies`."""
        body = {"prerequisite": prerequisite}
        return self._one("POST", space_path(space, "tasks", task, "dependencies"), json=body)

    def set_links(self, space: str, task: str, links: Sequence[Mapping[str, str]]) -> _One:
        """Replace the links of ``task`` to other tasks of the space
        (members; any state): ``[{"kind": "related", "task": id}]``."""
        body = {"links": [dict(link) for link in links]}
        return self._one("PUT", space_path(space, "tasks", task, "links"), json=body)

    def remove_dependency(self, space: str, task: str, prerequisite: str) -> _Done:
        """Remove a prerequisite of ``task`` (members)."""
        return self._done("DELETE", space_path(space, "tasks", task, "dependencies", prerequisite))

    def cancel_task(
        self, space: str, task: str, reason: str, override_reason: str | None = None
    ) -> _One:
        """Cancel a task for good (members), with its active attempt and
        unfinished stage work."""
        body = present(reason=reason, override_reason=override_reason)
        return self._one("POST", space_path(space, "tasks", task, "cancel"), json=body)

    def retry_task(self, space: str, task: str) -> _One:
        """Make a failed or canceled task ready again with a fresh attempt
        budget (space admins)."""
        return self._one("POST", space_path(space, "tasks", task, "retry"))

    # -- claims and attempts --

    def claim(self, space: str, task: str, lease_seconds: int | None = None) -> _One:
        """Claim a task (members): ``task``, ``attempt`` and the attempt's
        one-time ``token``. Refusals: :class:`TaskClaimed`,
        :class:`ResourceReserved`, :class:`TaskNotClaimable`,
        :class:`TaskParked`, :class:`TaskHeld`, :class:`ClaimVetoed`,
        :class:`StageNotLoaded`, :class:`RunEnvironmentUnresolved`."""
        body = present(lease_seconds=lease_seconds)
        return self._one("POST", space_path(space, "tasks", task, "claim"), json=body)

    def claim_next(
        self,
        space: str,
        *,
        project: str | None = None,
        kind: str | None = None,
        label: str | None = None,
        agent: str | None = None,
        lease_seconds: int | None = None,
    ) -> _One:
        """Claim the next ready task matching the filters, as :meth:`claim`
        answers; ``task`` is ``None`` when nothing is claimable. ``skipped``
        counts candidates passed over."""
        body = present(
            project=project, kind=kind, label=label, agent=agent, lease_seconds=lease_seconds
        )
        return self._one("POST", space_path(space, "claims"), json=body)

    def get_attempt(self, space: str, attempt: str) -> _One:
        """An attempt with its lease, run environment and last progress."""
        return self._one("GET", space_path(space, "attempts", attempt))

    def renew(
        self,
        space: str,
        attempt: str,
        generation: int,
        *,
        lease_seconds: int | None = None,
        progress: Any = None,
    ) -> _One:
        """Extend the attempt's lease from now (the owner), recording
        ``progress`` (any JSON value) when given."""
        body = present(generation=generation, lease_seconds=lease_seconds, progress=progress)
        return self._one("POST", space_path(space, "attempts", attempt, "renew"), json=body)

    def checkpoint(self, space: str, attempt: str, generation: int, data: Any) -> _One:
        """Record a checkpoint (any JSON value) on the attempt (the owner)."""
        body = {"generation": generation, "data": data}
        return self._one("POST", space_path(space, "attempts", attempt, "checkpoint"), json=body)

    def release(
        self,
        space: str,
        attempt: str,
        generation: int,
        reason: str | None = None,
        *,
        override_reason: str | None = None,
    ) -> _One:
        """Give the task back to the queue, uncharged (the owner)."""
        body = present(generation=generation, reason=reason, override_reason=override_reason)
        return self._one("POST", space_path(space, "attempts", attempt, "release"), json=body)

    def fail(
        self,
        space: str,
        attempt: str,
        generation: int,
        reason: str,
        *,
        override_reason: str | None = None,
    ) -> _One:
        """Fail the attempt (the owner): charged against the task's
        ``max_attempts``; the task fails once they are spent."""
        body = present(generation=generation, reason=reason, override_reason=override_reason)
        return self._one("POST", space_path(space, "attempts", attempt, "fail"), json=body)

    def submit(
        self,
        space: str,
        attempt: str,
        generation: int,
        summary: str,
        *,
        candidate: dict[str, Any] | None = None,
        evidence: dict[str, Any] | None = None,
        artifacts: Sequence[str] | None = None,
        extensions: dict[str, Any] | None = None,
    ) -> _One:
        """Hand in the attempt's work (the owner): ``submission``, ``task``
        and the workflow ``stage`` it entered (``None`` when it is done).
        ``artifacts`` are the ids of the artifacts handed in as evidence (of
        this attempt or its task; others are refused with
        :class:`SubmissionRefused`). ``extensions`` carries data for other
        plugins by the name each declared, committed with the submission."""
        body = present(
            generation=generation,
            summary=summary,
            candidate=candidate,
            evidence=evidence,
            artifacts=_listed(artifacts),
            extensions=extensions or None,
        )
        return self._one("POST", space_path(space, "attempts", attempt, "submit"), json=body)

    def cancel_attempt(
        self,
        space: str,
        attempt: str,
        generation: int,
        reason: str,
        *,
        override_reason: str | None = None,
    ) -> _One:
        """End the attempt for good (the owner, or a space admin with
        ``override_reason``); the task is ready again."""
        body = present(generation=generation, reason=reason, override_reason=override_reason)
        return self._one("POST", space_path(space, "attempts", attempt, "cancel"), json=body)

    def list_attempts(self, space: str, task: str) -> _Many:
        """A task's attempts by generation, ended ones included."""
        return self._many(space_path(space, "tasks", task, "attempts"))

    def list_submissions(self, space: str, task: str) -> _Many:
        """A task's submissions, oldest first."""
        return self._many(space_path(space, "tasks", task, "submissions"))

    def get_submission(self, space: str, submission: str) -> _One:
        """A submission: the immutable candidate an attempt handed in."""
        return self._one("GET", space_path(space, "submissions", submission))

    # -- holds --

    def place_hold(
        self, space: str, scope: str, strength: str, reason: str, target: str | None = None
    ) -> _One:
        """Hold the ``space``, a ``project`` or a ``task`` (``scope``; name it
        in ``target``) as ``suspended`` (no new claims) or ``stopped`` (no
        renewals either) (space admins)."""
        body = present(scope=scope, strength=strength, reason=reason, target=target)
        return self._one("POST", space_path(space, "holds"), json=body)

    def lift_hold(self, space: str, hold: str) -> _One:
        """Lift a hold (space admins): its scope is claimable again."""
        return self._one("POST", space_path(space, "holds", hold, "lift"))

    def list_holds(self, space: str, include_lifted: bool = False) -> _Many:
        """Live holds, newest first (lifted ones too with ``include_lifted``)."""
        return self._many(space_path(space, "holds"), {"all": "true"} if include_lifted else None)

    # -- decisions --

    def ask_decision(
        self,
        space: str,
        task: str,
        question: str,
        options: Sequence[str],
        *,
        answerable_by: str | None = None,
        expires_in_seconds: int | None = None,
    ) -> _One:
        """Ask a decision about a task (members); it parks the task until
        answered. ``answerable_by``: ``human`` (the default) or ``member``."""
        body = present(
            question=question,
            options=list(options),
            answerable_by=answerable_by,
            expires_in_seconds=expires_in_seconds,
        )
        return self._one("POST", space_path(space, "tasks", task, "decisions"), json=body)

    def list_decisions(
        self, space: str, state: str | None = None, task: str | None = None
    ) -> _Many:
        """Decisions, newest first: pending ones unless ``state`` is
        ``answered`` or ``all``."""
        return self._many(space_path(space, "decisions"), present(state=state, task=task))

    def answer_decision(
        self, space: str, decision: str, answer: str, comment: str | None = None
    ) -> _One:
        """Answer with one of the decision's options (a human member, or any
        member when the decision allows)."""
        body = present(answer=answer, comment=comment)
        return self._one("POST", space_path(space, "decisions", decision, "answer"), json=body)

    # -- agent definitions --

    def create_agent(
        self,
        space: str,
        name: str,
        instructions: str | None = None,
        plugins: Sequence[str] | None = None,
    ) -> _One:
        """Define an agent (space admins): revision 1 with its instructions
        and plugin selection (plugin names)."""
        body = present(name=name, instructions=instructions, plugins=_listed(plugins))
        return self._one("POST", space_path(space, "agents"), json=body)

    def revise_agent(
        self,
        space: str,
        agent: str,
        instructions: str,
        plugins: Sequence[str],
        expected_revision: int | None = None,
    ) -> _One:
        """A new current revision of an agent (space admins); 409
        :class:`RevisionConflict` unless it is at ``expected_revision``."""
        body = present(
            instructions=instructions, plugins=list(plugins), expected_revision=expected_revision
        )
        return self._one("POST", space_path(space, "agents", agent, "revisions"), json=body)

    def list_agents(self, space: str) -> _Many:
        """The space's agents by name, each with its current revision."""
        return self._many(space_path(space, "agents"))

    def get_agent(self, space: str, agent: str) -> _One:
        """An agent by id or name, with its current revision."""
        return self._one("GET", space_path(space, "agents", agent))

    def list_agent_revisions(self, space: str, agent: str) -> _Many:
        """An agent's revisions, newest first."""
        return self._many(space_path(space, "agents", agent, "revisions"))


class TasksClient(OverClient, _TaskRoutes[dict[str, Any], list[dict[str, Any]], None]):
    """The tasks plugin's calls over a synchronous :class:`~buildmax.client.Client`
    (which the caller opens and closes)."""

    ERRORS = ERRORS


class AsyncTasksClient(
    OverAsyncClient,
    _TaskRoutes[Awaitable[dict[str, Any]], Awaitable[list[dict[str, Any]]], Awaitable[None]],
):
    """The asynchronous twin of :class:`TasksClient`, over an
    :class:`~buildmax.client.AsyncClient`: the same calls, awaited."""

    ERRORS = ERRORS
