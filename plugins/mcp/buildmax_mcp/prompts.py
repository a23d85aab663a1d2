"""The prompt that explains the agent's loop in a space, naming the tools
this server offers (a step whose tool is not installed is left out)."""

from __future__ import annotations

from collections.abc import Mapping

import mcp_types as types
from mcp.shared.exceptions import MCPError

from .catalog import Catalog

LOOP_PROMPT = types.Prompt(
    name="work_loop",
    title="Work the BuildMax queue",
    description="How to take work in a space, keep it, hand it in and review others' work.",
    arguments=[
        types.PromptArgument(
            name="space", description="The space to work in (slug or id)", required=True
        )
    ],
)

#: The loop, step by step: each step names the tool it needs.
_STEPS: tuple[tuple[str, str], ...] = (
    ("list_ready", "See what is ready: `list_ready` with space={space}."),
    (
        "claim_next",
        "Claim work: `claim_next` with space={space} (or `claim_task` for one task). Keep "
        "the result's attempt.id and attempt.generation: every later call about this work "
        "needs both. An answer with task null means nothing is claimable now.",
    ),
    ("show_task", "Read the task: `show_task` gives its criteria and state."),
    (
        "renew",
        "While you work, call `renew` (attempt, generation) before attempt.lease_expires_at; "
        "a lapsed lease hands the task to someone else and your later calls are refused "
        "(lease-lapsed, stale-generation).",
    ),
    ("checkpoint", "Record progress worth keeping with `checkpoint`."),
    ("upload_artifact", "Attach a file (a patch, a log) with `upload_artifact`."),
    (
        "submit",
        "Hand the work in with `submit` (attempt, generation, summary, candidate, artifacts); "
        "pass an idempotency_key so that a retry cannot hand it in twice.",
    ),
    ("release", "If you cannot finish, `release` the attempt so another agent can take it."),
    (
        "ask_decision",
        "If you need a person's answer, `ask_decision`; read it later with `list_decisions`.",
    ),
    (
        "claim_review",
        "Review others' work: `claim_review`, read the submission, then `record_review` "
        "with approve, request_changes or reject and your findings. You cannot review "
        "your own work.",
    ),
    ("list_findings", "After a review asks for changes, `list_findings` shows what to fix."),
)


def loop_prompt(arguments: Mapping[str, str], catalog: Catalog) -> types.GetPromptResult:
    """The loop for the space ``arguments["space"]``."""
    space = arguments.get("space")
    if not space:
        raise MCPError(types.INVALID_PARAMS, "the work_loop prompt needs a space")
    steps = [text for tool, text in _STEPS if tool in catalog.bindings]
    text = "\n".join(
        [f"You work in the BuildMax space {space}. The loop:"]
        + [f"{n}. {step.format(space=space)}" for n, step in enumerate(steps, 1)]
        + ["Errors are tool errors naming a slug and a detail: read them, do not retry blindly."]
    )
    return types.GetPromptResult(
        description=LOOP_PROMPT.description,
        messages=[
            types.PromptMessage(role="user", content=types.TextContent(type="text", text=text))
        ],
    )
