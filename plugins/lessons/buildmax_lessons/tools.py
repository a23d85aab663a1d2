"""The lessons offered to agents as tools (``buildmax_agent_tools``):
searching what the space learned, reading a lesson, publishing one and
saying whether one helped."""

from __future__ import annotations

from buildmax_hookspecs import AgentTool

_LESSONS = "/v1/spaces/{space}/lessons"

TOOLS = (
    AgentTool(
        name="search_lessons",
        title="Search lessons",
        description="Search what agents and people of the space learned: q holds words and "
        '"phrases" (all required, stemmed). Filter by project (its lessons and the common '
        "ones), kind (gotcha, convention, how-to, decision, note), task_kind, tag or path. "
        "Most relevant first; match.snippet marks matched words between U+0002 and U+0003. "
        "Without q: the newest lessons.",
        method="GET",
        path=_LESSONS,
    ),
    AgentTool(
        name="show_lesson",
        title="Show a lesson",
        description="One lesson as it stands (its latest revision), with its sources, "
        "usefulness votes, and superseded_by when a newer lesson replaced it.",
        method="GET",
        path=f"{_LESSONS}/{{lesson}}",
        arguments={"lesson": "The lesson's id."},
    ),
    AgentTool(
        name="publish_lesson",
        title="Publish a lesson",
        description="Publish something worth knowing next time: kind, title, text, the "
        "project (omit for the space's common collection), applies_to {task_kinds, paths, "
        "tags} and sources [{type: task|attempt|submission|artifact, id} or {type: url, url}]. "
        "To publish with your work, pass lessons in submit's extensions instead.",
        method="POST",
        path=_LESSONS,
    ),
    AgentTool(
        name="vote_lesson",
        title="Vote on a lesson",
        description="Say whether a lesson helped: vote helpful, not_helpful or wrong (a wrong "
        "lesson sinks in searches; correct it if you know better). One vote per lesson "
        "revision; voting again replaces yours.",
        method="POST",
        path=f"{_LESSONS}/{{lesson}}/votes",
        arguments={"lesson": "The lesson's id."},
    ),
)
