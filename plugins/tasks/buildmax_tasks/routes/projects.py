"""Projects and their workflow policy revisions."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Transaction
from quart import Blueprint, Response

from buildmax.access import SpaceAccess
from buildmax.apidoc import api
from buildmax.auth import Caller
from buildmax.bodies import json_response
from buildmax.current import current_buildmax
from buildmax.idempotency import Reply, Work
from buildmax.pagination import page_body, page_request

from ..change import change
from ..engine import current_policy
from ..projects import create_project, edit_project, revise_policy
from ..records import PROJECT_SELECT, find_project
from ..rows import ProjectRow
from ..schemas import (
    PolicyBody,
    PolicyOut,
    ProjectCreate,
    ProjectOut,
    ProjectPage,
    ProjectUpdate,
)
from ..tables import policies, projects

blueprint = Blueprint("tasks_projects", __name__)
PROJECT_OUT = ProjectOut()
POLICY_OUT = PolicyOut()


async def _render(conn: Transaction, row: ProjectRow) -> dict[str, Any]:
    policy = await current_policy(conn, row.pk)
    return PROJECT_OUT.dump(  # type: ignore[no-any-return]
        {
            "id": row.id,
            "name": row.name,
            "description": row.description,
            "repository_url": row.repository_url,
            "target_branch": row.target_branch,
            "revision": row.revision,
            "policy": policy,
            "created_at": row.created_at,
            "updated_at": row.updated_at,
        }
    )


@blueprint.post("/v1/spaces/<space>/projects")
@api(
    "Create a project (members)",
    body=ProjectCreate,
    response=ProjectOut,
    status=201,
    idempotent=True,
    role="member",
    action="tasks.project.create",
    tags=["projects"],
)
async def create(caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """The name is unique in the space."""
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        ch = change(app, tx, caller, access)
        row = await create_project(ch, caller.principal_pk, data)
        return Reply(201, await _render(tx, row))

    return work


@blueprint.get("/v1/spaces/<space>/projects")
@api(
    "List projects (viewers)",
    response=ProjectPage,
    tags=["projects"],
    role="viewer",
    action="tasks.read",
)
async def list_projects(access: SpaceAccess) -> Response:
    """Ordered by name."""
    app = current_buildmax()
    page = page_request()
    query = (
        PROJECT_SELECT.where(projects.c.space_id == access.pk)
        .order_by(projects.c.name)
        .limit(page.limit + 1)
    )
    if page.after is not None:
        query = query.where(projects.c.name > page.after[0])
    async with app.db.read() as conn:
        rows = [ProjectRow.of(r) for r in await conn.fetch_all(query)]
        items = [await _render(conn, r) for r in rows[: page.limit]]
    return json_response(page_body(items, rows, page.limit, lambda r: (r.name,)))


@blueprint.get("/v1/spaces/<space>/projects/<project>")
@api(
    "Show a project and its current policy (viewers)",
    response=ProjectOut,
    tags=["projects"],
    role="viewer",
    action="tasks.read",
)
async def show(project: str, access: SpaceAccess) -> Response:
    """By public id or name."""
    app = current_buildmax()
    async with app.db.read() as conn:
        row = await find_project(conn, access.pk, project)
        body = await _render(conn, row)
    return json_response(body)


@blueprint.patch("/v1/spaces/<space>/projects/<project>")
@api(
    "Edit a project (members; expected_revision must match)",
    body=ProjectUpdate,
    response=ProjectOut,
    idempotent=True,
    role="member",
    action="tasks.project.update",
    tags=["projects"],
)
async def update(project: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """Description, repository URL and target branch; the name is permanent."""
    app = current_buildmax()
    expected = data.pop("expected_revision")

    async def work(tx: Transaction) -> Reply:
        ch = change(app, tx, caller, access)
        updated = await edit_project(ch, project, expected, data)
        return Reply(200, await _render(tx, updated))

    return work


@blueprint.post("/v1/spaces/<space>/projects/<project>/policy")
@api(
    "Set the project's workflow policy: a new immutable revision (space admins)",
    body=PolicyBody,
    response=PolicyOut,
    status=201,
    idempotent=True,
    role="admin",
    action="tasks.policy.update",
    tags=["projects"],
)
async def set_policy(
    project: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]
) -> Work:
    """``expected_revision`` (the current policy revision, 0 before the first)
    refuses a concurrent edit with 409."""
    app = current_buildmax()
    expected = data.pop("expected_revision")

    async def work(tx: Transaction) -> Reply:
        ch = change(app, tx, caller, access)
        revision = await revise_policy(ch, caller.principal_pk, project, expected, data)
        body = POLICY_OUT.dump({**data, "revision": revision, "created_at": ch.now})
        return Reply(201, body)

    return work


@blueprint.get("/v1/spaces/<space>/projects/<project>/policies")
@api(
    "Every policy revision of a project, newest first (viewers)",
    tags=["projects"],
    role="viewer",
    action="tasks.read",
)
async def list_policies(project: str, access: SpaceAccess) -> Response:
    """Revisions are immutable; the first is the current one."""
    app = current_buildmax()
    async with app.db.read() as conn:
        row = await find_project(conn, access.pk, project)
        rows = await conn.fetch_all(
            sa.select(policies)
            .where(policies.c.project_id == row.pk)
            .order_by(policies.c.revision.desc())
        )
    items = [
        POLICY_OUT.dump({**dict(r), "human_review_required": bool(r["human_review_required"])})
        for r in rows
    ]
    return json_response({"items": items, "next_cursor": None})
