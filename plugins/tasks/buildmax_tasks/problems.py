"""The tasks plugin's problem types (``urn:buildmax:problem:<slug>``).

A project or agent name used twice in a space is the kernel's 409
``name-taken`` (:class:`buildmax.problems.NameTaken`), as a principal's is.
"""

from __future__ import annotations

from buildmax.problems import Conflict, Forbidden, ValidationFailed


class TaskNotClaimable(Conflict):
    slug, title = "task-not-claimable", "The task is not ready to be claimed"


class TaskClaimed(Conflict):
    slug, title = "task-claimed", "Another attempt holds this task"


class ResourceReserved(Conflict):
    slug, title = "resource-reserved", "A resource the task needs is reserved by another attempt"


class TaskParked(Conflict):
    slug, title = "task-parked", "The task waits for a decision"


class TaskHeld(Forbidden):
    slug, title = "task-held", "A hold covers this task"


class StageNotLoaded(Conflict):
    slug, title = "stage-not-loaded", "The work belongs to a stage whose plugin is not loaded"


class ClaimVetoed(Forbidden):
    slug, title = "claim-vetoed", "A claim check refused this claim"


class RunEnvironmentUnresolved(ValidationFailed):
    slug, title = "run-environment-unresolved", "The run environment cannot be resolved"


class StaleGeneration(Conflict):
    slug, title = "stale-generation", "The attempt's generation is not current"


class LeaseLapsed(Conflict):
    slug, title = "lease-lapsed", "The attempt's lease has lapsed"


class AttemptEnded(Conflict):
    slug, title = "attempt-ended", "The attempt has ended"


class NotAttemptOwner(Forbidden):
    slug, title = "not-attempt-owner", "Only the attempt's owner may do this"


class DependencyCycle(Conflict):
    slug, title = "dependency-cycle", "The dependency would create a cycle"


class SourceTaken(Conflict):
    slug, title = "task-source-taken", "A task of the space already comes from this source record"


class RevisionConflict(Conflict):
    slug, title = "revision-conflict", "The record changed since you read it"


class InvalidState(Conflict):
    slug, title = "invalid-state", "The record is not in a state that allows this"


class SubmissionRefused(ValidationFailed):
    slug, title = "submission-refused", "A plugin refused the submission"


class AgentRevisionRefused(ValidationFailed):
    slug, title = "agent-revision-refused", "A plugin refused the agent revision"
