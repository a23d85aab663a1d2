"""Tasks: create, list, show, revise, dependencies, the ready queue,
cancel and retry."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Transaction
from quart import Blueprint, Response

from buildmax.access import SpaceAccess
from buildmax.apidoc import api, query_args
from buildmax.auth import Caller
from buildmax.bodies import json_response
from buildmax.current import current_buildmax
from buildmax.fulltext import RANKED_MATCHES, Query, QueryRefused, parse_query
from buildmax.idempotency import Reply, Work
from buildmax.pagination import PageRequest, page_body, page_request
from buildmax.problems import (
    BadCursor,
    TokenScopeRefused,
    ValidationFailed,
)

from .. import tasks as tasks_domain
from ..change import change
from ..claims import ClaimFilters, ready_key, ready_params, ready_statement
from ..graph import (
    dependent_ids_query,
    prerequisite_ids_query,
)
from ..records import (
    TASK_SELECT,
    agent_pk,
    count_by_state,
    find_project,
    task_list_statement,
    task_or_404,
)
from ..rows import TaskRow
from ..schemas import (
    DependenciesOut,
    DependencyBody,
    QueueQuery,
    Reason,
    RevisionOut,
    RevisionPage,
    TaskCountQuery,
    TaskCounts,
    TaskCreate,
    TaskLinks,
    TaskListPage,
    TaskListQuery,
    TaskOut,
    TaskPage,
    TaskUpdate,
)
from ..search import ranked_matches, snippets
from ..tables import (
    attempts,
    task_revisions,
    tasks,
)
from ..views import render_tasks
from . import caller_authority, render_one, task_children, tasks_state

blueprint = Blueprint("tasks_tasks", __name__)
REVISION_OUT = RevisionOut()


async def _dependencies(conn: Transaction, task_pk: int) -> dict[str, Any]:
    """A task's prerequisites and dependents, each with its state."""

    def links(rows: Any) -> list[dict[str, Any]]:
        return [{"id": r["public_id"], "state": r["state"], "title": r["title"]} for r in rows]

    return {
        "prerequisites": links(await conn.fetch_all(prerequisite_ids_query(task_pk))),
        "dependents": links(await conn.fetch_all(dependent_ids_query(task_pk))),
    }


@blueprint.post("/v1/spaces/<space>/tasks")
@api(
    "Create a task (members)",
    body=TaskCreate,
    response=TaskOut,
    status=201,
    idempotent=True,
    role="member",
    action="tasks.task.create",
    tags=["tasks"],
)
async def create(caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """Ready at once, or open until every prerequisite is done."""
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        ch = change(app, tx, caller, access)
        public_id = await tasks_domain.create_task(ch, caller.principal_pk, data)
        task = await task_or_404(tx, access.pk, public_id)
        return Reply(201, await render_one(tx, task, ch.now))

    return work


async def _queue_filters(
    conn: Transaction, access: SpaceAccess, query: dict[str, Any]
) -> ClaimFilters:
    """``project``, ``kind``, ``label`` and ``agent`` of the validated query."""
    project, agent = query.get("project"), query.get("agent")
    return ClaimFilters(
        project_pk=(await find_project(conn, access.pk, project)).pk if project else None,
        kind=query.get("kind"),
        label=query.get("label"),
        agent_pk=await agent_pk(conn, access.pk, agent) if agent else None,
    )


def _list_conditions(filters: ClaimFilters, query: dict[str, Any]) -> list[Any]:
    """The list's conditions but the project's (:func:`task_list_statement` takes that)."""
    conditions: list[Any] = []
    if filters.kind is not None:
        conditions.append(tasks.c.kind == filters.kind)
    if filters.label is not None:
        conditions.append(tasks.c.labels.contains(json.dumps(filters.label), autoescape=True))
    if filters.agent_pk is not None:
        conditions.append(tasks.c.agent_id == filters.agent_pk)
    if query.get("state") is not None:
        conditions.append(tasks.c.state == query["state"])
    if query.get("min_priority") is not None:
        conditions.append(tasks.c.priority >= int(query["min_priority"]))
    return conditions


#: Task list filters no index serves in the list's order.
_SCANNING_FILTERS = ("label", "kind", "agent", "min_priority")


def _search_query(query: dict[str, Any]) -> Query | None:
    """The parsed ``q`` (``None`` when absent or blank); 422 naming ``q``
    when it holds no word or too many."""
    text = query.get("q")
    if text is None or not text.strip():
        return None
    try:
        return parse_query(text)
    except QueryRefused as exc:
        message = str(exc)
        raise ValidationFailed(message, errors={"q": [f"{message.capitalize()}."]}) from None


def _search_offset(page: PageRequest) -> int:
    """Where a search's page starts among its ranked matches: the offset
    its cursor carries (400 ``bad-cursor`` when out of range)."""
    if page.after is None:
        return 0
    offset: int = page.after[0]
    if not 0 < offset < RANKED_MATCHES:
        raise BadCursor("the cursor is not one this server issued")
    return offset


@blueprint.get("/v1/spaces/<space>/tasks")
@api(
    "List and search tasks (viewers)",
    response=TaskListPage,
    query=TaskListQuery,
    tags=["tasks"],
    role="viewer",
    action="tasks.read",
)
async def list_tasks(access: SpaceAccess) -> Response:
    """Filters: ``state``, ``kind``, ``label``, ``project``, ``agent``,
    ``min_priority``; newest first. With ``q``, a full-text search of the
    title and acceptance criteria (words, stemmed, and ``"quoted
    phrases"``, all of which must match): the most relevant of the newest
    1,000 matches that pass the filters first (ties: newest first), each with
    ``match.snippet``, its matched words between U+0002 and U+0003; a ``q``
    with no word, or with more than 20 words and phrases, is 422. Stage
    work (review and integration items) is not searched: search finds the
    task it examines."""
    app = current_buildmax()
    query = query_args()
    searched = _search_query(query)
    page = page_request((int,) if searched is not None else (str,))
    # The space's, a state's and a project's tasks are read newest first
    # from an index; any other filter may scan the space's whole history,
    # and a search may rank a thousand tasks: no read for the event loop.
    scanning = searched is not None or any(
        query.get(name) is not None for name in _SCANNING_FILTERS
    )
    async with app.db.read(background=scanning) as conn:
        filters = await _queue_filters(conn, access, query)
        conditions = _list_conditions(filters, query)
        if searched is not None:
            body = await _search_page(conn, access, searched, conditions, filters, page)
            return json_response(body)
        after = page.after[0] if page.after is not None else None
        statement = task_list_statement(
            access.pk, conditions, page.limit + 1, after, project_pk=filters.project_pk
        )
        rows = [TaskRow.of(r) for r in await conn.fetch_all(statement)]
        items = await render_tasks(
            conn, rows[: page.limit], app.clock.now_ms(), tasks_state(app).engine
        )
    return json_response(page_body(items, rows, page.limit, lambda r: (r.id,)))


async def _search_page(
    conn: Transaction,
    access: SpaceAccess,
    searched: Query,
    conditions: list[Any],
    filters: ClaimFilters,
    page: PageRequest,
) -> dict[str, Any]:
    """A page of the ranked matches of a search, each task with its
    snippet; the cursor carries the offset of the next page."""
    app = current_buildmax()
    offset = _search_offset(page)
    shown = await ranked_matches(
        conn, access.pk, searched, conditions, filters.project_pk, offset, page.limit + 1
    )
    keys = shown[: page.limit]
    if not keys:
        return page_body([], shown, page.limit, lambda _: (offset + page.limit,))
    marked = await snippets(conn, access.pk, searched, keys)
    found = {
        task.pk: task
        for task in map(
            TaskRow.of,
            await conn.fetch_all(_TASKS_OF_SPACE_BY_PK, {"pks": keys, "space_pk": access.pk}),
        )
    }
    rows = [found[key] for key in keys if key in found]
    items = await render_tasks(conn, rows, app.clock.now_ms(), tasks_state(app).engine)
    for row, item in zip(rows, items, strict=True):
        item["match"] = {"snippet": marked.get(row.pk, "")}
    return page_body(items, shown, page.limit, lambda _: (offset + page.limit,))


@blueprint.get("/v1/spaces/<space>/task-counts")
@api(
    "Count the space's tasks by state (viewers)",
    response=TaskCounts,
    query=TaskCountQuery,
    tags=["tasks"],
    role="viewer",
    action="tasks.read",
)
async def count_tasks(access: SpaceAccess) -> Response:
    """Every state is named (0 when none); ``project`` counts one project's."""
    app = current_buildmax()
    project = query_args().get("project")
    async with app.db.read(background=True) as conn:
        project_pk = (await find_project(conn, access.pk, project)).pk if project else None
        states = await count_by_state(conn, access.pk, project_pk)
    return json_response({"states": states, "total": sum(states.values())})


_TASKS_BY_PK = TASK_SELECT.where(tasks.c.id.in_(sa.bindparam("pks", expanding=True)))
_TASKS_OF_SPACE_BY_PK = _TASKS_BY_PK.where(tasks.c.space_id == sa.bindparam("space_pk"))


@blueprint.get("/v1/spaces/<space>/ready")
@api(
    "The ready queue: claimable tasks by priority, then age (viewers)",
    response=TaskPage,
    query=QueueQuery,
    role="viewer",
    action="tasks.read",
    tags=["tasks"],
)
async def ready(access: SpaceAccess) -> Response:
    """Held and parked tasks are left out. Filters: ``project``, ``kind``,
    ``label``, ``agent``."""
    app = current_buildmax()
    page = page_request()
    now = app.clock.now_ms()
    query = query_args()
    async with app.db.read() as conn:
        filters = await _queue_filters(conn, access, query)
        after = None
        if page.after is not None:
            last = await conn.fetch_one(
                sa.select(tasks.c.priority, tasks.c.ready_at, tasks.c.id.label("pk")).where(
                    tasks.c.public_id == page.after[0], tasks.c.space_id == access.pk
                )
            )
            if last is None:
                raise BadCursor("the cursor names no task of this space")
            after = ready_key(last)
        keys = await conn.fetch_all(
            ready_statement(filters.shape(), after=after is not None),
            ready_params(access.pk, now, filters, page.limit + 1, after),
        )
        shown = [k["pk"] for k in keys]
        found = {
            task.pk: task
            for task in map(TaskRow.of, await conn.fetch_all(_TASKS_BY_PK, {"pks": shown}))
        }
        rows = [found[pk] for pk in shown if pk in found]
        items = await render_tasks(conn, rows[: page.limit], now, tasks_state(app).engine)
    return json_response(page_body(items, rows, page.limit, lambda r: (r.id,)))


@blueprint.get("/v1/spaces/<space>/tasks/<task>")
@api(
    "Show a task (viewers; an attempt's token may read its own task)",
    response=TaskOut,
    scopes=["attempt"],
    role="viewer",
    action="tasks.read",
    tags=["tasks"],
)
async def show(task: str, caller: Caller, access: SpaceAccess) -> Response:
    """With its state, why it is parked, its stage and current attempt. An
    attempt's token asking for any other task is refused alike, whether or
    not that task exists."""
    app = current_buildmax()
    async with app.db.read() as conn:
        if caller.actor.scope_type == "attempt":
            owned = await conn.fetch_val(
                sa.select(tasks.c.public_id)
                .select_from(attempts.join(tasks, tasks.c.id == attempts.c.task_id))
                .where(attempts.c.public_id == caller.actor.scope_id)
            )
            if owned != task:
                raise TokenScopeRefused(
                    f"this token is scoped to attempt {caller.actor.scope_id}, of another task"
                )
        row = await task_or_404(conn, access.pk, task)
        body = await render_one(conn, row, app.clock.now_ms())
    return json_response(body)


@blueprint.patch("/v1/spaces/<space>/tasks/<task>")
@api(
    "Revise a task (members; expected_revision must match)",
    body=TaskUpdate,
    response=TaskOut,
    idempotent=True,
    role="member",
    action="tasks.task.update",
    tags=["tasks"],
)
async def update(task: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """Changing title, body or criteria makes a new immutable revision."""
    app = current_buildmax()
    expected = data.pop("expected_revision")
    editor = caller_authority(access, caller, data.pop("override_reason"))

    async def work(tx: Transaction) -> Reply:
        ch = change(app, tx, caller, access)
        await tasks_domain.revise_task(ch, task, expected, editor, data)
        fresh = await task_or_404(tx, access.pk, task)
        return Reply(200, await render_one(tx, fresh, ch.now))

    return work


@blueprint.get("/v1/spaces/<space>/tasks/<task>/revisions")
@api(
    "A task's revisions, newest first (viewers)",
    response=RevisionPage,
    role="viewer",
    action="tasks.read",
    tags=["tasks"],
)
async def revisions(task: str, access: SpaceAccess) -> Response:
    """Revisions are immutable."""
    return await task_children(
        access,
        task,
        lambda pk: sa.select(task_revisions).where(task_revisions.c.task_id == pk),
        task_revisions.c.number,
        REVISION_OUT.dump,
        newest_first=True,
    )


@blueprint.get("/v1/spaces/<space>/tasks/<task>/dependencies")
@api(
    "A task's prerequisites and dependents (viewers)",
    response=DependenciesOut,
    tags=["tasks"],
    role="viewer",
    action="tasks.read",
)
async def list_dependencies(task: str, access: SpaceAccess) -> Response:
    """Each with its state."""
    app = current_buildmax()
    async with app.db.read() as conn:
        row = await task_or_404(conn, access.pk, task)
        return json_response(await _dependencies(conn, row.pk))


@blueprint.post("/v1/spaces/<space>/tasks/<task>/dependencies")
@api(
    "Add a prerequisite (members); a cycle is refused with 409",
    body=DependencyBody,
    response=DependenciesOut,
    status=201,
    also={200: "The task had this prerequisite already"},
    idempotent=True,
    role="member",
    action="tasks.task.update",
    tags=["tasks"],
)
async def add(task: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """The task becomes open until the prerequisite is done."""
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        ch = change(app, tx, caller, access)
        row, added = await tasks_domain.add_prerequisite(ch, task, data["prerequisite"])
        return Reply(201 if added else 200, await _dependencies(tx, row.pk))

    return work


@blueprint.put("/v1/spaces/<space>/tasks/<task>/links")
@api(
    "Replace a task's links to other tasks (members; any state)",
    body=TaskLinks,
    response=TaskOut,
    idempotent=True,
    role="member",
    action="tasks.task.update",
    tags=["tasks"],
)
async def put_links(task: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """Each link names a task of the space and a kind (``parent``,
    ``related``, ...); never a prerequisite, never the task itself."""
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        ch = change(app, tx, caller, access)
        await tasks_domain.set_links(ch, task, data["links"])
        return Reply(200, await render_one(tx, await task_or_404(tx, access.pk, task), ch.now))

    return work


@blueprint.delete("/v1/spaces/<space>/tasks/<task>/dependencies/<prerequisite>")
@api(
    "Remove a prerequisite (members)",
    status=204,
    idempotent=True,
    tags=["tasks"],
    role="member",
    action="tasks.task.update",
)
async def remove(task: str, prerequisite: str, caller: Caller, access: SpaceAccess) -> Work:
    """The task becomes ready when nothing else holds it back."""
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        ch = change(app, tx, caller, access)
        await tasks_domain.remove_prerequisite(ch, task, prerequisite)
        return Reply(204, None)

    return work


@blueprint.post("/v1/spaces/<space>/tasks/<task>/cancel")
@api(
    "Cancel a task for good (members; a held task needs an override)",
    body=Reason,
    response=TaskOut,
    idempotent=True,
    role="member",
    action="tasks.task.cancel",
    tags=["tasks"],
)
async def cancel(task: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """Its active attempt and unfinished stage work are canceled too."""
    app = current_buildmax()

    editor = caller_authority(access, caller, data["override_reason"])

    async def work(tx: Transaction) -> Reply:
        ch = change(app, tx, caller, access)
        await tasks_domain.cancel(ch, task, data["reason"], editor)
        fresh = await task_or_404(tx, access.pk, task)
        return Reply(200, await render_one(tx, fresh, ch.now))

    return work


@blueprint.post("/v1/spaces/<space>/tasks/<task>/retry")
@api(
    "Retry a failed, canceled or stranded task with a fresh attempt budget (space admins)",
    response=TaskOut,
    idempotent=True,
    role="admin",
    action="tasks.task.retry",
    tags=["tasks"],
)
async def retry(task: str, caller: Caller, access: SpaceAccess) -> Work:
    """Earlier attempts stay as they were; the next claim has the next generation."""
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        ch = change(app, tx, caller, access)
        await tasks_domain.retry(ch, task, tasks_state(app).engine)
        fresh = await task_or_404(tx, access.pk, task)
        return Reply(200, await render_one(tx, fresh, ch.now))

    return work
