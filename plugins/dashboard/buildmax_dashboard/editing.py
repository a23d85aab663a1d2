"""Editing the board: a new task, an edit of one, its prerequisites, and a
space admin's action on many tasks at once.

Every change is the tasks plugin's route called as the signed-in person,
so the route checks the role (members create and edit; space admins hold,
release and cancel in bulk), the revision and the graph, and audits it as
it audits an API client. A refused form is shown again as filled, with the
route's problem and status; an edit refused for a stale revision shows the
task as it now stands beside the person's draft, and changes nothing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from quart import Response, request

from buildmax.problems import NotFound, Problem

from . import task_forms
from .board import KINDS
from .session import checked_form
from .web import (
    api,
    blueprint,
    html,
    page,
    redirect,
    render,
    request_key,
    signed_in,
    space_path,
    ui_path,
)

#: Tasks of the project a form offers as prerequisites (the newest).
CANDIDATES = 100


@dataclass
class FormState:
    """What a task form shows besides the space's facts: the values in its
    fields, the prerequisites ticked, and what happened to the last post."""

    values: dict[str, Any]
    chosen: set[str] = field(default_factory=set)
    problem: Problem | None = None
    #: The task as it now stands, when an edit was refused for its revision.
    current: dict[str, Any] | None = None
    done: str | None = None


async def _form_page(
    space: str, project: str, task: dict[str, Any] | None, state: FormState
) -> Response:
    """The new-task form (``task`` is ``None``) or a task's edit form, with
    the space's agents and the project's newest tasks to pick from."""
    shown_space, shown_project, agents, candidates = await asyncio.gather(
        api().get(space_path(space)),
        api().get(space_path(space, "projects", project)),
        api().get(space_path(space, "agents"), {"limit": "200"}),
        api().get(space_path(space, "tasks"), {"project": project, "limit": str(CANDIDATES)}),
    )
    dependencies = None
    if task is not None:
        dependencies = await api().get(space_path(space, "tasks", task["id"], "dependencies"))
    body = await render(
        "task_form.html",
        space=shown_space,
        project=shown_project,
        agents=agents["items"],
        candidates=[c for c in candidates["items"] if task is None or c["id"] != task["id"]],
        kinds=KINDS,
        task=task,
        dependencies=dependencies,
        form=state,
    )
    return html(body, state.problem.status if state.problem else 200)


@blueprint.get("/ui/spaces/<space>/projects/<project>/tasks/new")
@page
async def new_task(space: str, project: str) -> Response:
    """The form of a new task in a project."""
    return await _form_page(space, project, None, FormState(task_forms.form_values(None, None)))


@blueprint.post("/ui/spaces/<space>/projects/<project>/tasks/new")
@page
async def create_task(space: str, project: str) -> Response:
    """Create the task as the person (members): its page, or the form again
    as filled with the route's refusal."""
    form = await checked_form(signed_in())
    posted = await request.form
    body, problem = task_forms.create_body(form, posted, project)
    if problem is None:
        try:
            created = await api().request("POST", space_path(space, "tasks"), json=body)
        except Problem as refused:
            problem = refused
        else:
            return redirect(ui_path(space, "tasks", created["id"]) + "?done=created", 303)
    state = FormState(
        task_forms.form_values(None, form),
        chosen=set(task_forms.prerequisites(posted)),
        problem=problem,
    )
    return await _form_page(space, project, None, state)


async def _task(space: str, task: str) -> dict[str, Any]:
    shown: dict[str, Any] = await api().get(space_path(space, "tasks", task))
    return shown


@blueprint.get("/ui/spaces/<space>/tasks/<task>/edit")
@page
async def edit_task(space: str, task: str) -> Response:
    """A task's edit form, opened at its current revision, with its
    prerequisites."""
    shown = await _task(space, task)
    done = request.args.get("done")
    state = FormState(
        task_forms.form_values(shown, None),
        done=done if done in _DONE else None,
    )
    state.values["expected_revision"] = str(shown["revision"])
    return await _form_page(space, shown["project_id"], shown, state)


#: What the edit page says was just done.
_DONE = ("saved", "unchanged", "prerequisite-added", "prerequisite-removed")


@blueprint.post("/ui/spaces/<space>/tasks/<task>/edit")
@page
async def update_task(space: str, task: str) -> Response:
    """Save the edit as the person (members): only the fields that differ,
    against the revision the form was opened at. A stale revision (409)
    shows the task as it now stands and keeps the draft; nothing changes."""
    form = await checked_form(signed_in())
    shown = await _task(space, task)
    body, problem = task_forms.update_body(form, shown)
    here = ui_path(space, "tasks", shown["id"], "edit")
    if problem is None and not body:
        return redirect(f"{here}?done=unchanged", 303)
    if problem is None:
        try:
            await api().request("PATCH", space_path(space, "tasks", shown["id"]), json=body)
        except Problem as refused:
            problem = refused
        else:
            return redirect(f"{here}?done=saved", 303)
    state = FormState(task_forms.form_values(shown, form), problem=problem)
    if problem is not None and problem.slug == "revision-conflict":
        # Saving again replaces the task as it now stands (shown above).
        state.current = shown
        state.values["expected_revision"] = str(shown["revision"])
    return await _form_page(space, shown["project_id"], shown, state)


@blueprint.post("/ui/spaces/<space>/tasks/<task>/prerequisites")
@page
async def add_prerequisite(space: str, task: str) -> Response:
    """Add a prerequisite (members; a cycle is the route's 409)."""
    form = await checked_form(signed_in())
    return await _dependency_change(
        space, task, "POST", ("dependencies",), {"prerequisite": form.get("prerequisite", "")}
    )


@blueprint.post("/ui/spaces/<space>/tasks/<task>/prerequisites/<prerequisite>/remove")
@page
async def remove_prerequisite(space: str, task: str, prerequisite: str) -> Response:
    """Remove a prerequisite (members)."""
    await checked_form(signed_in())
    return await _dependency_change(space, task, "DELETE", ("dependencies", prerequisite), None)


async def _dependency_change(
    space: str, task: str, method: str, path: tuple[str, ...], body: dict[str, Any] | None
) -> Response:
    shown = await _task(space, task)
    try:
        await api().request(method, space_path(space, "tasks", shown["id"], *path), json=body)
    except Problem as refused:
        state = FormState(task_forms.form_values(shown, None), problem=refused)
        state.values["expected_revision"] = str(shown["revision"])
        return await _form_page(space, shown["project_id"], shown, state)
    done = "prerequisite-added" if method == "POST" else "prerequisite-removed"
    return redirect(ui_path(space, "tasks", shown["id"], "edit") + f"?done={done}", 303)


# ----------------------------------------------------------------------------- bulk


@blueprint.post("/ui/spaces/<space>/projects/<project>/bulk")
@page
async def bulk(space: str, project: str) -> Response:
    """Hold, release (lift the task's own holds) or cancel the selected
    tasks, each through its route as the person (space admins): one request
    per task, each audited; the page lists what each answered."""
    form = await checked_form(signed_in())
    posted = await request.form
    action = form.get("action", "")
    if action not in task_forms.BULK_ACTIONS:
        action = ""
    chosen, problem = task_forms.bulk_selection(posted)
    shown_space, shown_project = await asyncio.gather(
        api().get(space_path(space)), api().get(space_path(space, "projects", project))
    )
    outcomes: list[dict[str, Any]] = []
    key = request_key(form)
    if problem is None and action:
        for task in chosen:
            # One key per task: a reload of this answer replays each call.
            each = f"{key}-{task}"[:200] if key else None
            outcomes.append(await _bulk_one(space, shown_project["id"], action, task, form, each))
    body = await render(
        "bulk.html",
        space=shown_space,
        project=shown_project,
        action=action,
        problem=problem if action else _NO_ACTION,
        outcomes=outcomes,
    )
    return html(body, _bulk_status(problem if action else _NO_ACTION, outcomes))


def _bulk_status(problem: Problem | None, outcomes: list[dict[str, Any]]) -> int:
    """200 when some task was acted on; else the refusal's status (the
    form's, or the route's for the first task)."""
    if problem is not None:
        return problem.status
    if any("outcome" in o for o in outcomes) or not outcomes:
        return 200
    refusal: Problem = outcomes[0]["problem"]
    return refusal.status


_NO_ACTION = task_forms.refused({"action": ["hold, release or cancel"]})


async def _bulk_one(
    space: str, project: str, action: str, task: str, form: dict[str, str], key: str | None
) -> dict[str, Any]:
    """One task's part of a bulk action (a task of ``project`` only): what
    happened to it."""
    reason = form.get("reason", "")
    try:
        shown = await _task(space, task)
        if shown["project_id"] != project:
            raise NotFound("no such task in this project")
        if action == "hold":
            await api().request(
                "POST",
                space_path(space, "holds"),
                idempotency_key=key,
                json={
                    "scope": "task",
                    "target": task,
                    "strength": form.get("strength", ""),
                    "reason": reason,
                },
            )
        elif action == "cancel":
            body = {"reason": reason}
            if form.get("override"):
                body["override_reason"] = reason
            await api().request(
                "POST", space_path(space, "tasks", task, "cancel"), json=body, idempotency_key=key
            )
        else:
            own = [h for h in shown["held_by"] if h["scope"].get("type") == "task"]
            if not own:
                return {"task": task, "outcome": "had no hold of its own"}
            for hold in own:
                await api().request("POST", space_path(space, "holds", hold["id"], "lift"))
    except Problem as refused:
        return {"task": task, "problem": refused}
    return {"task": task, "outcome": _OUTCOMES[action]}


_OUTCOMES = {"hold": "held", "release": "released", "cancel": "canceled"}
