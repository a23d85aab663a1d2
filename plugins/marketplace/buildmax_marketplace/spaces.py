"""A space's plugins over HTTP, under ``/v1/spaces/{space}``.

``GET /plugins`` (viewers) shows the curation mode and every activation:
its pin, whether it is enabled, its origin and who made it, whether its
release was yanked or its plugin archived, whether a newer release exists,
and which of the space's agents name it (none: "activated, unused"); and per
agent, what it names, what of that is not activated, and what the space
activated that it does not name.
Space owners and admins activate or move a pin (``PUT /plugins/{name}``),
suspend and resume (``POST /plugins/{name}/suspend|resume``) and set the
curation mode (``PUT /curation``).
"""

from __future__ import annotations

from typing import Any

from buildmax_hookspecs import TaskQueue, Transaction
from marshmallow import RAISE, Schema, fields, validate
from quart import Blueprint, Response

from buildmax.access import SpaceAccess
from buildmax.apidoc import api
from buildmax.app import BuildMax
from buildmax.auth import Caller
from buildmax.bodies import json_response
from buildmax.clock import to_rfc3339
from buildmax.conflicts import insert_ignoring_conflict
from buildmax.current import current_buildmax
from buildmax.idempotency import Reply, Work
from buildmax.services import ServiceMissing

from .activation import activations_of, curation_mode, newer, pin, set_enabled
from .catalog import releases_of
from .tables import CURATION_MODES, curation

blueprint = Blueprint("space_plugins", __name__)


class PinBody(Schema):
    class Meta:
        unknown = RAISE

    version = fields.String(required=True, validate=validate.Length(min=1, max=100))


class CurationBody(Schema):
    class Meta:
        unknown = RAISE

    mode = fields.String(required=True, validate=validate.OneOf(CURATION_MODES))


async def _agents(app: BuildMax, conn: Transaction, space_id: str) -> dict[str, list[str]]:
    """Each of the space's agents and the plugins its current revision names."""
    try:
        queue = app.services.get(TaskQueue)
    except ServiceMissing:
        return {}
    return {r.agent_name: list(r.plugins) for r in await queue.agents(conn, space_id)}


async def activation_view(
    app: BuildMax,
    conn: Transaction,
    space_id: str,
    row: dict[str, Any],
    agents: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """An activation's public fields, with its release's state and the
    agents naming it."""
    every = agents if agents is not None else await _agents(app, conn, space_id)
    naming = sorted(agent for agent, names in every.items() if row["name"] in names)
    return {
        "name": row["name"],
        "version": row["version"],
        "sha256": row["sha256"],
        "enabled": bool(row["enabled"]),
        "origin": row["origin"],
        "activated_by": row["activated_by_id"],
        "activated_at": to_rfc3339(row["activated_at"]),
        "updated_by": row["updated_by_id"],
        "updated_at": to_rfc3339(row["updated_at"]),
        "yanked": row["yanked_at"] is not None,
        "yank_reason": row["yank_reason"],
        "executable": bool(row["executable"]),
        "eligible": row["eligible_at"] is not None,
        "archived": row["archived_at"] is not None,
        "archive_reason": row["archive_reason"],
        "newer_release": newer(row["version"], await releases_of(conn, row["name"])),
        "agents": naming,
        "unused": not naming,
    }


@blueprint.get("/v1/spaces/<space>/plugins")
@api(
    "The space's curation mode and activations, with the agents naming each (viewers)",
    role="viewer",
    action="catalog.activations.read",
    tags=["catalog"],
)
async def list_activations(access: SpaceAccess) -> Response:
    app = current_buildmax()
    async with app.db.read() as conn:
        mode = await curation_mode(conn, access.pk)
        agents = await _agents(app, conn, access.public_id)
        rows = await activations_of(conn, access.pk)
        items = [await activation_view(app, conn, access.public_id, r, agents) for r in rows]
    activated = {r["name"] for r in rows}
    per_agent = [
        {
            "name": agent,
            "names": names,
            "not_activated": sorted(set(names) - activated),
            "activated_not_named": sorted(activated - set(names)),
        }
        for agent, names in agents.items()
    ]
    return json_response({"mode": mode, "items": items, "agents": per_agent})


@blueprint.put("/v1/spaces/<space>/plugins/<name>")
@api(
    "Activate a release in the space, or move the pin to it (space owners and admins)",
    body=PinBody,
    also={201: "A new activation"},
    role="admin",
    action="catalog.activations.manage",
    idempotent=True,
    tags=["catalog"],
)
async def put_activation(
    name: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]
) -> Work:
    """201 for a new activation (origin ``curated``), 200 for a pin moved or
    already there; 422 ``activation-refused`` with the policy's reason."""
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        row, created = await pin(
            app,
            tx,
            space_pk=access.pk,
            space_id=access.public_id,
            name=name,
            version=data["version"],
            actor=caller.actor,
            origin="curated",
            admin_override=access.admin_override,
        )
        return Reply(201 if created else 200, await activation_view(app, tx, access.public_id, row))

    return work


def _enable(caller: Caller, access: SpaceAccess, name: str, enabled: bool) -> Work:
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        row = await set_enabled(
            app,
            tx,
            space_pk=access.pk,
            space_id=access.public_id,
            name=name,
            enabled=enabled,
            actor=caller.actor,
            admin_override=access.admin_override,
        )
        return Reply(200, await activation_view(app, tx, access.public_id, row))

    return work


@blueprint.post("/v1/spaces/<space>/plugins/<name>/suspend")
@api(
    "Suspend an activation: runs of agents naming it are refused (space owners and admins)",
    role="admin",
    action="catalog.activations.manage",
    idempotent=True,
    tags=["catalog"],
)
async def suspend(name: str, caller: Caller, access: SpaceAccess) -> Work:
    return _enable(caller, access, name, False)


@blueprint.post("/v1/spaces/<space>/plugins/<name>/resume")
@api(
    "Resume a suspended activation (space owners and admins)",
    role="admin",
    action="catalog.activations.manage",
    idempotent=True,
    tags=["catalog"],
)
async def resume(name: str, caller: Caller, access: SpaceAccess) -> Work:
    return _enable(caller, access, name, True)


@blueprint.put("/v1/spaces/<space>/curation")
@api(
    "Set the space's curation mode, open or curated (space owners and admins)",
    body=CurationBody,
    role="admin",
    action="catalog.curation.manage",
    idempotent=True,
    tags=["catalog"],
)
async def put_curation(caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """``open`` (the default): an agent naming a plugin activates it;
    ``curated``: an owner or admin activates it first."""
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        values = {
            "mode": data["mode"],
            "updated_by": caller.principal_pk,
            "updated_at": app.clock.now_ms(),
        }
        mode = await curation_mode(tx, access.pk, lock=True)
        changed = mode != data["mode"]
        if changed:
            inserted = await tx.fetch_val(
                insert_ignoring_conflict(tx.dialect, curation)
                .values(space_id=access.pk, **values)
                .returning(curation.c.space_id)
            )
            if inserted is None:
                # Another change made the row meanwhile: decide against it.
                mode = await curation_mode(tx, access.pk, lock=True)
                changed = mode != data["mode"]
                if changed:
                    await tx.execute(
                        curation.update().where(curation.c.space_id == access.pk).values(**values)
                    )
        if changed:
            await app.audit.record(
                tx,
                caller.actor,
                "curation.changed",
                space_id=access.public_id,
                target_type="space",
                target_id=access.public_id,
                details={"mode": data["mode"], "previous": mode},
                admin_override=access.admin_override,
            )
        return Reply(200, {"mode": data["mode"]})

    return work
