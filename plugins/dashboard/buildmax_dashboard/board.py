"""What each dashboard page shows, read through the API as the signed-in
person (never another plugin's tables or modules): the spaces and their
attention lists, a space, a project's board, a task, a review, the
decisions.

Path segments the person typed are quoted whole, so an id cannot reach
another route. A filter the API refuses is the API's 422, shown as such.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from buildmax.internal import InternalApi

from . import artifacts
from .web import optional, seg

#: The board's columns, in the order work moves through them.
STATES = ("open", "ready", "claimed", "waiting", "done", "failed", "canceled")
#: The task kinds a board filters on.
KINDS = ("code", "review", "integration", "general")
#: Tasks a column shows before "more" (a column of its own, paged).
COLUMN_SIZE = 25
#: Tasks a one-state board shows per page.
PAGE_SIZE = 100
#: Checkpoints of the latest attempt a task page shows.
CHECKPOINTS = 10
#: Spaces the overview shows (each costs an attention read).
OVERVIEW_SPACES = 50
#: What a review decides, and how severe a finding is (the reviews
#: plugin's values; its route refuses anything else).
REVIEW_DECISIONS = ("approve", "request_changes", "reject")
SEVERITIES = ("blocker", "major", "minor", "note")
#: The board's filters, as the task list route names them.
FILTERS = ("state", "kind", "min_priority", "label", "agent", "q")


async def _attention(api: InternalApi, space_id: str) -> list[dict[str, Any]]:
    answer = await api.get(f"/v1/spaces/{seg(space_id)}/attention")
    items: list[dict[str, Any]] = answer["items"]
    return items


async def _counts(
    api: InternalApi, space_id: str, project_id: str | None = None
) -> dict[str, int] | None:
    """Tasks by state (of one project when given); ``None`` when the tasks
    plugin does not answer."""
    params = {"project": project_id} if project_id else None
    counted = await optional(api.get(f"/v1/spaces/{seg(space_id)}/task-counts", params))
    return counted["states"] if counted else None


async def spaces_with_attention(api: InternalApi) -> list[dict[str, Any]]:
    """The first :data:`OVERVIEW_SPACES` spaces the person may see, each
    with its (role-filtered) attention list and its tasks by state."""
    page = await api.get("/v1/spaces", {"limit": str(OVERVIEW_SPACES)})
    spaces: list[dict[str, Any]] = page["items"]
    lists, counts = await asyncio.gather(
        asyncio.gather(*(_attention(api, space["id"]) for space in spaces)),
        asyncio.gather(*(_counts(api, space["id"]) for space in spaces)),
    )
    return [
        {**space, "attention": items, "counts": counted}
        for space, items, counted in zip(spaces, lists, counts, strict=True)
    ]


async def space_view(api: InternalApi, space: str) -> dict[str, Any]:
    """A space, its attention list, its projects, its pending decisions and
    the review work nobody has recorded yet."""
    base = f"/v1/spaces/{seg(space)}"
    shown, attention, counts, projects, decisions, reviews = await asyncio.gather(
        api.get(base),
        _attention(api, space),
        _counts(api, space),
        api.get(f"{base}/projects", {"limit": "200"}),
        api.get(f"{base}/decisions", {"limit": "200"}),
        optional(api.get(f"{base}/reviews", {"kind": "review", "pending": "true", "limit": "50"})),
    )
    return {
        "space": shown,
        "attention": attention,
        "counts": counts,
        "projects": projects["items"],
        "decisions": decisions["items"],
        "reviews": reviews["items"] if reviews else [],
    }


async def board_view(
    api: InternalApi, space: str, project: str, args: Mapping[str, str]
) -> dict[str, Any]:
    """A project's tasks by state. Without a state filter each column shows
    its newest :data:`COLUMN_SIZE`; with one, that column alone, paged."""
    base = f"/v1/spaces/{seg(space)}"
    shown_space, shown_project, counts = await asyncio.gather(
        api.get(base), api.get(f"{base}/projects/{seg(project)}"), _counts(api, space, project)
    )
    filters = {key: args[key] for key in FILTERS if args.get(key)}
    query = {"project": shown_project["id"], **filters}
    state = filters.get("state")
    columns: list[dict[str, Any]]
    next_cursor = None
    if state:
        params = {**query, "limit": str(PAGE_SIZE)}
        if args.get("cursor"):
            params["cursor"] = args["cursor"]
        page = await api.get(f"{base}/tasks", params)
        columns = [{"state": state, "tasks": page["items"], "more": False}]
        next_cursor = page.get("next_cursor")
    else:
        pages = await asyncio.gather(
            *(
                api.get(f"{base}/tasks", {**query, "state": s, "limit": str(COLUMN_SIZE)})
                for s in STATES
            )
        )
        columns = [
            {"state": s, "tasks": p["items"], "more": bool(p.get("next_cursor"))}
            for s, p in zip(STATES, pages, strict=True)
        ]
    return {
        "space": shown_space,
        "project": shown_project,
        "columns": columns,
        "counts": counts,
        "filters": filters,
        "states": STATES,
        "kinds": KINDS,
        "next_cursor": next_cursor,
    }


async def task_view(api: InternalApi, space: str, task: str) -> dict[str, Any]:
    """A task with its revisions, dependencies, attempts, submissions,
    decisions, artifacts (previewed), review work and findings, its audit
    trail when the person may read it, and the names of the space's members
    (who did what)."""
    base = f"/v1/spaces/{seg(space)}"
    at = f"{base}/tasks/{seg(task)}"
    shown_space, shown = await asyncio.gather(api.get(base), api.get(at))
    revisions, dependencies, attempts, submissions, decisions, members = await asyncio.gather(
        api.get(f"{at}/revisions", {"limit": "50"}),
        api.get(f"{at}/dependencies"),
        api.get(f"{at}/attempts", {"limit": "50"}),
        api.get(f"{at}/submissions", {"limit": "50"}),
        api.get(f"{base}/decisions", {"task": shown["id"], "state": "all", "limit": "50"}),
        api.get(f"{base}/members", {"limit": "200"}),
    )
    project, artifact_page, review_page, audit = await asyncio.gather(
        optional(api.get(f"{base}/projects/{seg(shown['project_id'])}")),
        api.get(f"{base}/artifacts", {"task": shown["id"], "limit": "50"}),
        optional(api.get(f"{base}/reviews", {"subject": shown["id"], "limit": "50"})),
        _audit_of(api, shown_space, shown["id"]),
    )
    shown_artifacts, checkpoints = await asyncio.gather(
        artifacts.previews(api, space, artifact_page["items"], artifacts.TASK_PAGE_BYTES),
        _checkpoints(api, base, attempts["items"]),
    )
    return {
        "space": shown_space,
        "project": project,
        "task": shown,
        "revisions": revisions["items"],
        "dependencies": dependencies,
        "attempts": attempts["items"],
        "submissions": submissions["items"],
        "decisions": decisions["items"],
        "names": {m["principal_id"]: m["name"] for m in members["items"]},
        "artifacts": shown_artifacts,
        "checkpoints": checkpoints,
        "reviews": review_page["items"] if review_page else [],
        "audit": audit,
    }


async def _checkpoints(
    api: InternalApi, base: str, attempts: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The newest :data:`CHECKPOINTS` checkpoints of the latest attempt
    (``{"attempt": id, "items": [...], "more": bool}``), or ``None``."""
    if not attempts:
        return None
    latest = max(attempts, key=lambda a: a["generation"])
    page = await optional(
        api.get(f"{base}/attempts/{seg(latest['id'])}/checkpoints", {"limit": str(CHECKPOINTS)})
    )
    if page is None:
        return None
    return {"attempt": latest["id"], "items": page["items"], "more": bool(page["next_cursor"])}


async def _audit_of(
    api: InternalApi, space: dict[str, Any], target: str
) -> list[dict[str, Any]] | None:
    """The audit trail of ``target`` (newest first), for those the audit
    plugin lets read the space's trail; ``None`` for the others."""
    page = await optional(
        api.get(f"/v1/spaces/{seg(space['id'])}/audit", {"target": target, "limit": "100"})
    )
    return page["items"] if page else None


async def review_view(api: InternalApi, space: str, work: str) -> dict[str, Any]:
    """A review work item: what it reviews (the subject task and its
    submission, with the submission's artifacts, diffs first), what was
    recorded on it, and every finding on the subject's work so far."""
    base = f"/v1/spaces/{seg(space)}"
    shown_space, item, work_task = await asyncio.gather(
        api.get(base),
        api.get(f"{base}/reviews/{seg(work)}"),
        api.get(f"{base}/tasks/{seg(work)}"),
    )
    subject, submission, findings, members = await asyncio.gather(
        api.get(f"{base}/tasks/{seg(item['subject_id'])}"),
        api.get(f"{base}/submissions/{seg(item['submission_id'])}"),
        api.get(f"{base}/findings", {"subject": item["subject_id"], "limit": "200"}),
        api.get(f"{base}/members", {"limit": "200"}),
    )
    metadata = await asyncio.gather(
        *(optional(api.get(f"{base}/artifacts/{seg(a)}")) for a in submission["artifacts"])
    )
    shown_artifacts = await artifacts.previews(
        api, space, [a for a in metadata if a is not None], artifacts.REVIEW_PAGE_BYTES
    )
    return {
        "space": shown_space,
        "item": item,
        "work": work_task,
        "subject": subject,
        "submission": submission,
        "artifacts": shown_artifacts,
        "findings": findings["items"],
        "findings_at": by_line(findings["items"]),
        "names": {m["principal_id"]: m["name"] for m in members["items"]},
        "severities": SEVERITIES,
        "decisions": REVIEW_DECISIONS,
    }


def by_line(findings: list[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """Findings that name a path and a line, by ``(path, line)``: shown on
    that line of a diff."""
    found: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for finding in findings:
        if finding.get("path") and finding.get("line"):
            found.setdefault((finding["path"], finding["line"]), []).append(finding)
    return found


async def decisions_view(api: InternalApi, space: str) -> dict[str, Any]:
    """The space's pending decisions."""
    base = f"/v1/spaces/{seg(space)}"
    shown_space, decisions = await asyncio.gather(
        api.get(base), api.get(f"{base}/decisions", {"limit": "200"})
    )
    return {"space": shown_space, "decisions": decisions["items"]}
