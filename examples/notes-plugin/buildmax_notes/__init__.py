"""Short notes attached to a space: a complete, small BuildMax plugin."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from buildmax.access import SpaceAccess
from buildmax.apidoc import api
from buildmax.auth import Caller
from buildmax.bodies import json_response
from buildmax.clock import to_rfc3339
from buildmax.current import current_buildmax
from buildmax.idempotency import Reply, Work
from buildmax.ids import new_id
from buildmax.migrations import create_tables
from buildmax.pagination import page_body, page_request
from buildmax.tables import Id, Millis, spaces
from buildmax_hookspecs import App, AuditAction, Migration, Transaction, hookimpl
from marshmallow import Schema, fields, validate
from quart import Blueprint, Response

metadata = sa.MetaData()

notes = sa.Table(
    "notes_items",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("public_id", sa.Text, nullable=False, unique=True),
    sa.Column("space_id", Id, sa.ForeignKey(spaces.c.id), nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("created_at", Millis, nullable=False),
)
sa.Index("notes_items_space", notes.c.space_id, notes.c.created_at)


class NoteCreate(Schema):
    text = fields.String(required=True, validate=validate.Length(min=1, max=2000))


class NoteOut(Schema):
    id = fields.String()
    text = fields.String()
    created_at = fields.String()


class NotePage(Schema):
    """A page: the document gives the route ``limit`` and ``cursor``."""

    items = fields.List(fields.Nested(NoteOut))
    next_cursor = fields.String(allow_none=True)


blueprint = Blueprint("notes", __name__)


def _render(row: Any) -> dict[str, Any]:
    return {
        "id": row["public_id"],
        "text": row["text"],
        "created_at": to_rfc3339(row["created_at"]),
    }


@blueprint.post("/v1/spaces/<space>/notes")
@api(
    "Add a note to a space (members)",
    body=NoteCreate,
    status=201,
    role="member",
    action="notes.add",
    idempotent=True,
    tags=["notes"],
)
async def add_note(caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """The note is audited and announced on the space's event stream."""
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        row = await tx.fetch_one(
            notes.insert()
            .values(
                public_id=new_id("nt"),
                space_id=access.pk,
                text=data["text"],
                created_at=app.clock.now_ms(),
            )
            .returning(notes.c.public_id, notes.c.text, notes.c.created_at)
        )
        await app.audit.record(
            tx,
            caller.actor,
            "notes.added",
            space_id=access.public_id,
            target_type="note",
            target_id=row["public_id"],
            details={"length": len(data["text"])},
            admin_override=access.admin_override,
        )
        await app.events.publish(tx, access.pk, "note.added", {"id": row["public_id"]})
        return Reply(201, _render(row))

    return work


@blueprint.get("/v1/spaces/<space>/notes")
@api(
    "List a space's notes, newest first (any member)",
    tags=["notes"],
    role="viewer",
    action="notes.read",
)
async def list_notes(access: SpaceAccess) -> Response:
    """Paged with ``limit`` and ``cursor``."""
    app = current_buildmax()
    page = page_request(key_types=(int, str))
    query = (
        sa.select(notes.c.public_id, notes.c.text, notes.c.created_at)
        .where(notes.c.space_id == access.pk)
        .order_by(notes.c.created_at.desc(), notes.c.public_id.desc())
        .limit(page.limit + 1)
    )
    if page.after is not None:
        created_at, public_id = page.after
        query = query.where(
            sa.tuple_(notes.c.created_at, notes.c.public_id) < sa.tuple_(created_at, public_id)
        )
    async with app.db.read() as conn:
        rows = list(await conn.fetch_all(query))
    items = [_render(row) for row in rows]
    return json_response(
        page_body(items, rows, page.limit, lambda r: (r["created_at"], r["public_id"]))
    )


@hookimpl
def buildmax_blueprints(app: App) -> list[Blueprint]:
    return [blueprint]


@hookimpl
def buildmax_migrations() -> list[Migration]:
    return [Migration("notes", 1, "notes table", create_tables(notes))]


@hookimpl
def buildmax_audit_actions() -> list[AuditAction]:
    return [
        AuditAction("notes.added", "A note was added to a space", frozenset({"length"}), "note")
    ]
