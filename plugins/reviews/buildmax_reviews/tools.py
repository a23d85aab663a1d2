"""The review stage's operations offered to agents as tools
(``buildmax_agent_tools``): reading review work, recording a review with
its findings, and the findings on one's own work."""

from __future__ import annotations

from buildmax_hookspecs import AgentTool

_SPACES = "/v1/spaces/{space}"
_WORK = "The review or integration work item's task id (or its review's id)."

TOOLS = (
    AgentTool(
        name="list_reviews",
        title="List review work",
        description="Review and integration work in the space, newest first: kind (review or "
        "integration), subject (the reviewed task), pending=true for work nothing was recorded "
        "on yet. Each item names its work task (task_id, to claim) and the submission.",
        method="GET",
        path=f"{_SPACES}/reviews",
    ),
    AgentTool(
        name="show_review",
        title="Show review work",
        description="One review or integration work item with the submission it is about and "
        "what was recorded on it.",
        method="GET",
        path=f"{_SPACES}/reviews/{{ident}}",
        arguments={"ident": _WORK},
    ),
    AgentTool(
        name="record_review",
        title="Record a review",
        description="Record your review on a review work item you claimed (claim_review): "
        "decision approve, request_changes or reject (a rejection says why in summary), with "
        "findings [{severity, text, path, line}]. Pass the claim's generation. Recording "
        "ends your review attempt; the work's author cannot review it.",
        method="POST",
        path=f"{_SPACES}/reviews/{{ident}}",
        arguments={"ident": _WORK},
    ),
    AgentTool(
        name="list_findings",
        title="List findings",
        description="Review findings, newest first: subject=<your task's id> for the findings "
        "on your work, state=open for those still to fix.",
        method="GET",
        path=f"{_SPACES}/findings",
    ),
    AgentTool(
        name="resolve_finding",
        title="Resolve a finding",
        description="Mark a finding on your work resolved, once the fix is in.",
        method="POST",
        path=f"{_SPACES}/findings/{{finding}}/resolve",
        arguments={"finding": "The finding's id."},
    ),
)
