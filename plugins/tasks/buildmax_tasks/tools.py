"""The task queue's operations offered to agents as tools
(``buildmax_agent_tools``): the agent's loop from the ready queue to
submit, and the questions it may ask a person."""

from __future__ import annotations

from buildmax_hookspecs import AgentTool

_SPACES = "/v1/spaces/{space}"
_TASK = "The task's id."
_ATTEMPT = "The attempt's id (attempt.id in the claim's result)."
#: What every report on an attempt needs, said once.
_FENCED = (
    " Pass the attempt's id and its generation from the claim's result; a stale generation "
    "(someone else holds the task now) is refused with stale-generation, a lapsed lease with "
    "lease-lapsed."
)

TOOLS = (
    AgentTool(
        name="list_ready",
        title="List ready work",
        description="The tasks that can be claimed now, highest priority first, then oldest. "
        "Filter by project, kind (code, review, integration, general), label or agent. "
        "Pages: pass the result's next_cursor as cursor.",
        method="GET",
        path=f"{_SPACES}/ready",
    ),
    AgentTool(
        name="claim_next",
        title="Claim the next task",
        description="Claim the next ready task matching the filters: you own it under a lease "
        "until you submit, release or fail it. The result has task, attempt (keep attempt.id "
        "and attempt.generation for every later call) and the attempt's lease_expires_at; "
        "task null means nothing is claimable. Any kind of work unless kind says which: pass "
        "kind=code for implementation work.",
        method="POST",
        path=f"{_SPACES}/claims",
    ),
    AgentTool(
        name="claim_task",
        title="Claim a task",
        description="Claim one task by id, as claim_next does. Refused with 409 when another "
        "attempt holds it.",
        method="POST",
        path=f"{_SPACES}/tasks/{{task}}/claim",
        arguments={"task": _TASK},
    ),
    AgentTool(
        name="claim_review",
        title="Claim the next review",
        description="Claim the next review work item: another agent's submission to review. "
        "Read it with show_submission (task.submission_id), then record_review. You are never "
        "given your own work to review.",
        method="POST",
        path=f"{_SPACES}/claims",
        fixed={"kind": "review"},
    ),
    AgentTool(
        name="claim_integration",
        title="Claim the next integration",
        description="Claim the next integration work item (where the project's policy makes "
        "integration an agent's work): merge the approved submission, then submit with "
        "candidate {outcome: merged|conflict|failed, before, after} (commits).",
        method="POST",
        path=f"{_SPACES}/claims",
        fixed={"kind": "integration"},
    ),
    AgentTool(
        name="show_task",
        title="Show a task",
        description="A task with its title, body, criteria, state, labels, holds, pending "
        "decisions, current attempt and submission.",
        method="GET",
        path=f"{_SPACES}/tasks/{{task}}",
        arguments={"task": _TASK},
        resource="buildmax://spaces/{space}/tasks/{task}",
    ),
    AgentTool(
        name="task_dependencies",
        title="A task's dependencies",
        description="A task's prerequisites and dependents, each with its state.",
        method="GET",
        path=f"{_SPACES}/tasks/{{task}}/dependencies",
        arguments={"task": _TASK},
    ),
    AgentTool(
        name="show_attempt",
        title="Show an attempt",
        description="An attempt with its lease, generation and run environment (the plugin "
        "releases pinned for this run: name, version, sha256).",
        method="GET",
        path=f"{_SPACES}/attempts/{{attempt}}",
        arguments={"attempt": _ATTEMPT},
    ),
    AgentTool(
        name="renew",
        title="Renew the lease",
        description="Keep your claim: extend the attempt's lease (lease_seconds from now, the "
        "server's default when omitted), optionally with progress (any JSON)." + _FENCED,
        method="POST",
        path=f"{_SPACES}/attempts/{{attempt}}/renew",
        arguments={"attempt": _ATTEMPT},
    ),
    AgentTool(
        name="checkpoint",
        title="Record a checkpoint",
        description="Record progress worth keeping (data: any JSON); checkpoints are kept in "
        "order." + _FENCED,
        method="POST",
        path=f"{_SPACES}/attempts/{{attempt}}/checkpoint",
        arguments={"attempt": _ATTEMPT},
    ),
    AgentTool(
        name="submit",
        title="Submit the work",
        description="Hand in the attempt's work: summary, candidate (e.g. {commit, branch}; for "
        "an integration {outcome, before, after}), evidence, and artifacts (ids from "
        "upload_artifact). The task then waits for review, or is done when no review "
        "applies. Pass an idempotency_key: a retry with it cannot hand in twice." + _FENCED,
        method="POST",
        path=f"{_SPACES}/attempts/{{attempt}}/submit",
        arguments={"attempt": _ATTEMPT},
    ),
    AgentTool(
        name="release",
        title="Release the task",
        description="Give the task back to the queue without charging an attempt (reason "
        "optional)." + _FENCED,
        method="POST",
        path=f"{_SPACES}/attempts/{{attempt}}/release",
        arguments={"attempt": _ATTEMPT},
    ),
    AgentTool(
        name="fail",
        title="Fail the attempt",
        description="Report that the attempt failed (reason required); it counts against the "
        "task's attempts, and the task fails once they are spent." + _FENCED,
        method="POST",
        path=f"{_SPACES}/attempts/{{attempt}}/fail",
        arguments={"attempt": _ATTEMPT},
    ),
    AgentTool(
        name="show_submission",
        title="Show a submission",
        description="A submission: its summary, candidate, evidence and artifacts (what a "
        "reviewer reviews).",
        method="GET",
        path=f"{_SPACES}/submissions/{{submission}}",
        arguments={"submission": "The submission's id (a review task's submission_id)."},
    ),
    AgentTool(
        name="ask_decision",
        title="Ask a person",
        description="Ask a decision about a task (question, options); the task is parked until "
        "a person answers. Read the answer with list_decisions.",
        method="POST",
        path=f"{_SPACES}/tasks/{{task}}/decisions",
        arguments={"task": _TASK},
    ),
    AgentTool(
        name="list_decisions",
        title="List decisions",
        description="Decisions in the space, newest first: pending ones by default, "
        "state=answered or all for the rest, task to see one task's (with their answers).",
        method="GET",
        path=f"{_SPACES}/decisions",
    ),
)
