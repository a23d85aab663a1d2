"""Agent definitions and their revisions."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Transaction
from quart import Blueprint, Response

from buildmax.access import SpaceAccess
from buildmax.apidoc import api
from buildmax.auth import Caller
from buildmax.bodies import json_response
from buildmax.conflicts import insert_ignoring_conflict
from buildmax.current import current_buildmax
from buildmax.idempotency import Reply, Work
from buildmax.ids import new_id
from buildmax.pagination import page_body, page_request
from buildmax.problems import NameTaken, NotFound

from ..agents import save_revision
from ..change import change
from ..problems import RevisionConflict
from ..schemas import (
    AgentCreate,
    AgentOut,
    AgentPage,
    AgentRevise,
    AgentRevisionOut,
    AgentRevisionPage,
)
from ..tables import agent_revisions, agents

blueprint = Blueprint("tasks_agents", __name__)
AGENT_OUT = AgentOut()
REVISION_OUT = AgentRevisionOut()
AGENT_SELECT = sa.select(
    agents,
    agent_revisions.c.public_id.label("revision_public_id"),
    agent_revisions.c.number,
    agent_revisions.c.instructions,
    agent_revisions.c.plugins,
    agent_revisions.c.created_at.label("revision_created_at"),
).select_from(
    agents.outerjoin(agent_revisions, agent_revisions.c.id == agents.c.current_revision_id)
)


def _revision_fields(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["public_id"],
        "number": row["number"],
        "instructions": row["instructions"],
        "plugins": json.loads(row["plugins"]),
        "created_at": row["created_at"],
    }


def _revision(row: dict[str, Any]) -> dict[str, Any]:
    return REVISION_OUT.dump(_revision_fields(row))  # type: ignore[no-any-return]


def _render(row: dict[str, Any]) -> dict[str, Any]:
    revision = None
    if row["revision_public_id"] is not None:
        # Raw fields: AGENT_OUT dumps the nested revision itself.
        revision = _revision_fields(
            {
                **row,
                "public_id": row["revision_public_id"],
                "created_at": row["revision_created_at"],
            }
        )
    return AGENT_OUT.dump(  # type: ignore[no-any-return]
        {
            "id": row["public_id"],
            "name": row["name"],
            "revision": revision,
            "created_at": row["created_at"],
        }
    )


async def _agent(
    conn: Transaction, space_pk: int, ref: str, *, for_update: bool = False
) -> dict[str, Any]:
    query = AGENT_SELECT.where(
        agents.c.space_id == space_pk, sa.or_(agents.c.public_id == ref, agents.c.name == ref)
    )
    if for_update:
        query = query.with_for_update(of=agents)
    row = await conn.fetch_one(query)
    if row is None:
        raise NotFound("no such agent in this space")
    return dict(row)


@blueprint.post("/v1/spaces/<space>/agents")
@api(
    "Define an agent (space admins): revision 1",
    body=AgentCreate,
    response=AgentOut,
    status=201,
    idempotent=True,
    role="admin",
    action="tasks.agent.manage",
    tags=["agents"],
)
async def create(caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """``plugins`` names catalog plugins (never versions); plugins may refuse
    the revision (422, nothing saved)."""
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        ch = change(app, tx, caller, access)
        public_id = new_id("ag")
        pk = await tx.fetch_val(
            insert_ignoring_conflict(tx.dialect, agents)
            .values(
                public_id=public_id,
                space_id=access.pk,
                name=data["name"],
                created_at=ch.now,
                created_by=caller.principal_pk,
            )
            .returning(agents.c.id)
        )
        if pk is None:
            raise NameTaken(f"an agent named {data['name']!r} already exists in this space")
        await ch.audit("agent.created", "agent", public_id, name=data["name"])
        agent = {"id": pk, "public_id": public_id, "name": data["name"]}
        await save_revision(
            ch,
            agent,
            instructions=data["instructions"],
            plugins=data["plugins"],
            created_by=caller.principal_pk,
        )
        return Reply(201, _render(await _agent(tx, access.pk, public_id)))

    return work


@blueprint.post("/v1/spaces/<space>/agents/<agent>/revisions")
@api(
    "Revise an agent (space admins): a new immutable revision becomes current",
    body=AgentRevise,
    response=AgentOut,
    status=201,
    idempotent=True,
    role="admin",
    action="tasks.agent.manage",
    tags=["agents"],
)
async def revise(agent: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """``expected_revision`` refuses a concurrent edit with 409."""
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        ch = change(app, tx, caller, access)
        row = await _agent(tx, access.pk, agent, for_update=True)
        expected = data["expected_revision"]
        if expected is not None and expected != row["number"]:
            raise RevisionConflict(
                f"the agent is at revision {row['number']}, not {expected}", revision=row["number"]
            )
        await save_revision(
            ch,
            row,
            instructions=data["instructions"],
            plugins=data["plugins"],
            created_by=caller.principal_pk,
        )
        return Reply(201, _render(await _agent(tx, access.pk, row["public_id"])))

    return work


@blueprint.get("/v1/spaces/<space>/agents")
@api(
    "List agents with their current revision (viewers)",
    response=AgentPage,
    tags=["agents"],
    role="viewer",
    action="tasks.read",
)
async def list_agents(access: SpaceAccess) -> Response:
    """Ordered by name."""
    app = current_buildmax()
    page = page_request()
    query = (
        AGENT_SELECT.where(agents.c.space_id == access.pk)
        .order_by(agents.c.name)
        .limit(page.limit + 1)
    )
    if page.after is not None:
        query = query.where(agents.c.name > page.after[0])
    async with app.db.read() as conn:
        rows = [dict(r) for r in await conn.fetch_all(query)]
    return json_response(
        page_body([_render(r) for r in rows], rows, page.limit, lambda r: (r["name"],))
    )


@blueprint.get("/v1/spaces/<space>/agents/<agent>")
@api(
    "Show an agent (viewers)",
    response=AgentOut,
    tags=["agents"],
    role="viewer",
    action="tasks.read",
)
async def show(agent: str, access: SpaceAccess) -> Response:
    """By public id or name."""
    app = current_buildmax()
    async with app.db.read() as conn:
        row = await _agent(conn, access.pk, agent)
    return json_response(_render(row))


@blueprint.get("/v1/spaces/<space>/agents/<agent>/revisions")
@api(
    "An agent's revisions, newest first (viewers)",
    response=AgentRevisionPage,
    tags=["agents"],
    role="viewer",
    action="tasks.read",
)
async def revisions(agent: str, access: SpaceAccess) -> Response:
    """Revisions are append-only."""
    app = current_buildmax()
    page = page_request((int,))
    async with app.db.read() as conn:
        row = await _agent(conn, access.pk, agent)
        query = (
            sa.select(agent_revisions)
            .where(agent_revisions.c.agent_id == row["id"])
            .order_by(agent_revisions.c.number.desc())
            .limit(page.limit + 1)
        )
        if page.after is not None:
            query = query.where(agent_revisions.c.number < page.after[0])
        rows = [dict(r) for r in await conn.fetch_all(query)]
    return json_response(
        page_body([_revision(r) for r in rows], rows, page.limit, lambda r: (r["number"],))
    )
