"""Holds: suspend or stop a space, a project or a task."""

from __future__ import annotations

from typing import Any

from buildmax_hookspecs import Transaction
from quart import Blueprint, Response, request

from buildmax.access import SpaceAccess
from buildmax.apidoc import api
from buildmax.auth import Caller
from buildmax.bodies import json_response
from buildmax.current import current_buildmax
from buildmax.idempotency import Reply, Work
from buildmax.pagination import older_than, page_body, page_request

from ..change import change
from ..holds import describe_hold, lift_hold, place_hold
from ..records import HOLD_SELECT
from ..rows import HoldRow
from ..schemas import HoldCreate, HoldOut, HoldPage
from ..tables import holds

blueprint = Blueprint("tasks_holds", __name__)
HOLD_OUT = HoldOut()


async def _render(conn: Transaction, row: HoldRow) -> dict[str, Any]:
    return HOLD_OUT.dump(  # type: ignore[no-any-return]
        {
            **await describe_hold(conn, row),
            "created_by": row.created_by_id,
            "created_at": row.created_at,
            "lifted_by": row.lifted_by_id,
            "lifted_at": row.lifted_at,
        }
    )


async def _shown(conn: Transaction, which: Any) -> dict[str, Any]:
    """The hold ``which`` selects, as the API shows it."""
    row = await conn.fetch_one(HOLD_SELECT.where(which))
    assert row is not None
    return await _render(conn, HoldRow.of(row))


@blueprint.post("/v1/spaces/<space>/holds")
@api(
    "Place a hold on the space, a project or a task (space admins)",
    body=HoldCreate,
    response=HoldOut,
    status=201,
    idempotent=True,
    role="admin",
    action="tasks.hold.manage",
    tags=["holds"],
)
async def create(caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """``suspended`` refuses new claims; ``stopped`` also refuses renewals.
    ``target`` names the project or task (omit it for the space)."""
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        ch = change(app, tx, caller, access)
        public_id = await place_hold(
            ch, caller.principal_pk, data["scope"], data["target"], data["strength"], data["reason"]
        )
        return Reply(201, await _shown(tx, holds.c.public_id == public_id))

    return work


@blueprint.post("/v1/spaces/<space>/holds/<hold>/lift")
@api(
    "Lift a hold (space admins): its scope is claimable again",
    response=HoldOut,
    idempotent=True,
    role="admin",
    action="tasks.hold.manage",
    tags=["holds"],
)
async def lift(hold: str, caller: Caller, access: SpaceAccess) -> Work:
    """Lifting an already lifted hold is refused with 409."""
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        ch = change(app, tx, caller, access)
        await lift_hold(ch, caller.principal_pk, hold)
        return Reply(200, await _shown(tx, holds.c.public_id == hold))

    return work


@blueprint.get("/v1/spaces/<space>/holds")
@api(
    "List holds, live ones unless all=true (viewers)",
    response=HoldPage,
    tags=["holds"],
    role="viewer",
    action="tasks.read",
)
async def list_holds(access: SpaceAccess) -> Response:
    """Newest first."""
    app = current_buildmax()
    page = page_request()
    query = (
        HOLD_SELECT.where(holds.c.space_id == access.pk)
        .order_by(holds.c.id.desc())
        .limit(page.limit + 1)
    )
    if request.args.get("all") != "true":
        query = query.where(holds.c.lifted_at.is_(None))
    if page.after is not None:
        query = query.where(older_than(holds, page.after[0]))
    async with app.db.read() as conn:
        rows = [HoldRow.of(r) for r in await conn.fetch_all(query)]
        items = [await _render(conn, r) for r in rows[: page.limit]]
    return json_response(page_body(items, rows, page.limit, lambda r: (r.id,)))
