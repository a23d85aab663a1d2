"""Reading the trail over HTTP: a space's events (its owners and admins),
every event (system admins), and verification (system admins).

Filters come from the query string: ``actor`` (principal public id),
``action`` (a prefix: ``task.`` matches every task action), ``target``
(public id), ``target_type``, ``since`` and ``until`` (RFC 3339; ``since``
inclusive, ``until`` exclusive). Pages are newest first; the cursor names
the last event shown by its time, chain and sequence number.
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from marshmallow import Schema, fields
from quart import Blueprint, Response, request

from buildmax.access import SpaceAccess
from buildmax.apidoc import api
from buildmax.app import BuildMax
from buildmax.bodies import json_response
from buildmax.clock import from_rfc3339
from buildmax.current import current_buildmax
from buildmax.pagination import page_body, page_request
from buildmax.problems import NotFound, ValidationFailed
from buildmax.schemas import Timestamp

from .chain import RECORD_FIELDS, chain_named
from .tables import events
from .verify import verify_database

blueprint = Blueprint("audit", __name__)

#: Longest filter value accepted.
MAX_FILTER_LENGTH = 200


class ActorOut(Schema):
    id = fields.String(allow_none=True, metadata={"description": "Principal public id"})
    kind = fields.String(metadata={"description": "human, agent, service or system"})


class TargetOut(Schema):
    type = fields.String()
    id = fields.String()
    url = fields.String(allow_none=True, metadata={"description": "Where the target is read"})


class AuditEventOut(Schema):
    chain = fields.String(metadata={"description": "The space's public id, or system"})
    seq = fields.Integer(metadata={"description": "Position in the chain, from 1, gap-free"})
    time = Timestamp()
    actor = fields.Nested(ActorOut)
    acting_through = fields.String(allow_none=True)
    space = fields.String(allow_none=True)
    action = fields.String()
    target = fields.Nested(TargetOut, allow_none=True)
    details = fields.Dict()
    request_id = fields.String(allow_none=True)
    admin_override = fields.Boolean()
    hash = fields.String(metadata={"description": "sha256(previous hash || canonical JSON)"})


class AuditEventPage(Schema):
    items = fields.List(fields.Nested(AuditEventOut))
    next_cursor = fields.String(allow_none=True)


class ChainReportOut(Schema):
    chain = fields.String()
    ok = fields.Boolean()
    events = fields.Integer(metadata={"description": "Events checked"})
    anchor_seq = fields.Integer(metadata={"description": "Last event removed by retention"})
    last_seq = fields.Integer(allow_none=True)
    broken_seq = fields.Integer(allow_none=True, metadata={"description": "First bad sequence"})
    cause = fields.String(allow_none=True)


class VerifyOut(Schema):
    ok = fields.Boolean()
    chains = fields.List(fields.Nested(ChainReportOut))


_EVENT_OUT = AuditEventOut()
_COLUMNS = [events.c[name] for name in (*RECORD_FIELDS, "hash")]


def render(app: BuildMax, row: dict[str, Any]) -> dict[str, Any]:
    """An event row as the API shows it."""
    target = None
    if row["target_type"] is not None and row["target_id"] is not None:
        target = {
            "type": row["target_type"],
            "id": row["target_id"],
            "url": app.audit.link(row["target_type"], row["target_id"], row["space_id"]),
        }
    return _EVENT_OUT.dump(  # type: ignore[no-any-return]
        {
            **row,
            "actor": {"id": row["actor_id"], "kind": row["actor_kind"]},
            "space": row["space_id"],
            "target": target,
            "details": json.loads(row["details"]),
            "admin_override": bool(row["admin_override"]),
        }
    )


def _text_filter(name: str) -> str | None:
    value = request.args.get(name)
    if value is not None and not 1 <= len(value) <= MAX_FILTER_LENGTH:
        raise ValidationFailed(
            f"{name} must be 1 to {MAX_FILTER_LENGTH} characters",
            errors={name: [f"Length must be between 1 and {MAX_FILTER_LENGTH}."]},
        )
    return value


def _time_filter(name: str) -> int | None:
    value = _text_filter(name)
    if value is None:
        return None
    try:
        return from_rfc3339(value)
    except ValueError:
        raise ValidationFailed(
            f"{name} must be an RFC 3339 time, like 2026-01-31T12:00:00Z",
            errors={name: ["Not a valid RFC 3339 time."]},
        ) from None


def _conditions() -> list[Any]:
    conditions: list[Any] = []
    for name, column in (
        ("actor", events.c.actor_id),
        ("target", events.c.target_id),
        ("target_type", events.c.target_type),
    ):
        value = _text_filter(name)
        if value is not None:
            conditions.append(column == value)
    action = _text_filter("action")
    if action is not None:
        # Exact and case-sensitive on both engines (SQLite's LIKE ignores case).
        conditions.append(sa.func.substr(events.c.action, 1, len(action)) == action)
    since, until = _time_filter("since"), _time_filter("until")
    if since is not None:
        conditions.append(events.c.time >= since)
    if until is not None:
        conditions.append(events.c.time < until)
    return conditions


async def _page(app: BuildMax, conditions: list[Any]) -> Response:
    page = page_request(key_types=(int, str, int))
    order = (events.c.time, events.c.chain, events.c.seq)
    query = sa.select(*_COLUMNS).where(*conditions).order_by(*(c.desc() for c in order))
    if page.after is not None:
        query = query.where(sa.tuple_(*order) < sa.tuple_(*(sa.literal(v) for v in page.after)))
    async with app.db.read() as conn:
        rows = [dict(r) for r in await conn.fetch_all(query.limit(page.limit + 1))]
    items = [render(app, row) for row in rows[: page.limit]]
    return json_response(
        page_body(items, rows, page.limit, lambda r: (r["time"], r["chain"], r["seq"]))
    )


@blueprint.get("/v1/spaces/<space>/audit")
@api(
    "A space's audit events, newest first (space owners and admins)",
    response=AuditEventPage,
    role="admin",
    action="audit.read",
    tags=["audit"],
)
async def space_audit(access: SpaceAccess) -> Response:
    """Filters: ``actor``, ``action`` (prefix), ``target``, ``target_type``,
    ``since``, ``until``."""
    app = current_buildmax()
    return await _page(app, [events.c.chain == access.public_id, *_conditions()])


async def _chain_filter(app: BuildMax) -> str | None:
    """The chain the ``space`` query parameter names (a space's slug or id,
    or ``system``), if any."""
    space = _text_filter("space")
    if space is None:
        return None
    chain = await chain_named(app, space)
    if chain is None:
        raise NotFound("no such space")
    return chain


@blueprint.get("/v1/audit")
@api(
    "Every audit event, newest first (system admins)",
    response=AuditEventPage,
    system_roles=["admin"],
    tags=["audit"],
)
async def all_audit() -> Response:
    """The filters of a space's trail, plus ``space`` (slug, id, or
    ``system`` for events that belong to no space)."""
    app = current_buildmax()
    conditions = _conditions()
    chain = await _chain_filter(app)
    if chain is not None:
        conditions.append(events.c.chain == chain)
    return await _page(app, conditions)


@blueprint.get("/v1/audit/verify")
@api(
    "Recompute every audit chain (system admins)",
    response=VerifyOut,
    system_roles=["admin"],
    tags=["audit"],
)
async def verify() -> Response:
    """Each chain's report names the first sequence number that does not
    verify and why; ``space`` limits it to one chain."""
    app = current_buildmax()
    reports = await verify_database(app, await _chain_filter(app))
    return json_response({"ok": all(r.ok for r in reports), "chains": [r.body() for r in reports]})
