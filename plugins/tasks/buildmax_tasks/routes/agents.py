"""Agent definitions and their revisions."""

from __future__ import annotations

import json
from typing import Any

from buildmax_hookspecs import Transaction
from quart import Blueprint, Response

from buildmax.access import SpaceAccess
from buildmax.apidoc import api
from buildmax.auth import Caller
from buildmax.bodies import json_response
from buildmax.current import current_buildmax
from buildmax.idempotency import Reply, Work
from buildmax.pagination import page_body, page_request

from ..agents import create_agent, revise_agent
from ..change import change
from ..records import AGENT_REVISION_SELECT, AGENT_SELECT, find_agent
from ..rows import AgentRevisionRow, AgentRow
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


def _revision_fields(row: AgentRevisionRow) -> dict[str, Any]:
    return {
        "id": row.id,
        "number": row.number,
        "instructions": row.instructions,
        "plugins": json.loads(row.plugins),
        "created_at": row.created_at,
    }


async def _shown(conn: Transaction, shown: list[AgentRow]) -> list[dict[str, Any]]:
    """Agents with their current revisions, as the API shows them (one
    query for the revisions of them all)."""
    if not shown:
        return []
    current = {
        revision.agent_pk: revision
        for revision in map(
            AgentRevisionRow.of,
            await conn.fetch_all(
                AGENT_REVISION_SELECT.where(
                    agents.c.id.in_([agent.pk for agent in shown]),
                    agent_revisions.c.id == agents.c.current_revision_id,
                )
            ),
        )
    }
    return [
        AGENT_OUT.dump(
            {
                "id": agent.id,
                "name": agent.name,
                # Raw fields: AGENT_OUT dumps the nested revision itself.
                "revision": _revision_fields(current[agent.pk]) if agent.pk in current else None,
                "created_at": agent.created_at,
            }
        )
        for agent in shown
    ]


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
        agent = await create_agent(
            change(app, tx, caller, access),
            caller.principal_pk,
            data["name"],
            instructions=data["instructions"],
            plugins=data["plugins"],
        )
        return Reply(201, (await _shown(tx, [agent]))[0])

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
        revised = await revise_agent(
            change(app, tx, caller, access),
            caller.principal_pk,
            agent,
            data["expected_revision"],
            instructions=data["instructions"],
            plugins=data["plugins"],
        )
        return Reply(201, (await _shown(tx, [revised]))[0])

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
        rows = [AgentRow.of(r) for r in await conn.fetch_all(query)]
        items = await _shown(conn, rows[: page.limit])
    return json_response(page_body(items, rows, page.limit, lambda r: (r.name,)))


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
        (shown,) = await _shown(conn, [await find_agent(conn, access.pk, agent)])
    return json_response(shown)


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
        found = await find_agent(conn, access.pk, agent)
        query = (
            AGENT_REVISION_SELECT.where(agent_revisions.c.agent_id == found.pk)
            .order_by(agent_revisions.c.number.desc())
            .limit(page.limit + 1)
        )
        if page.after is not None:
            query = query.where(agent_revisions.c.number < page.after[0])
        rows = [AgentRevisionRow.of(r) for r in await conn.fetch_all(query)]
    items = [REVISION_OUT.dump(_revision_fields(r)) for r in rows]
    return json_response(page_body(items, rows, page.limit, lambda r: (r.number,)))
