"""Imports over HTTP, under ``/v1/spaces/{space}/imports``.

``POST /imports`` previews a file (the body is its bytes; members);
``GET /imports`` lists the space's imports and ``GET /imports/{id}`` shows
one with its preview (viewers); ``POST /imports/{id}/chunks/{n}`` applies
a chunk and ``GET`` shows an applied chunk's report. What a preview or a
chunk decides is :mod:`.importing`'s.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import tempfile
from dataclasses import dataclass
from typing import IO, Any, BinaryIO

import sqlalchemy as sa
from buildmax_hookspecs import Importer, TaskQueue, Transaction
from quart import Blueprint, Response, request
from werkzeug.exceptions import RequestEntityTooLarge

from buildmax.access import SpaceAccess
from buildmax.apidoc import api, query_args
from buildmax.app import BuildMax, blob_store
from buildmax.auth import Caller
from buildmax.bodies import json_response
from buildmax.current import current_buildmax
from buildmax.idempotency import Receipt, Reply, Work, fingerprint_of, replayed
from buildmax.pagination import older_than, page_body, page_request
from buildmax.problems import (
    IdempotencyKeyReused,
    NotFound,
    PayloadTooLarge,
    ValidationFailed,
)
from buildmax.streaming import allow_body

from . import importing
from .plan import Plan
from .problems import ImportStale
from .reading import MAX_FILE_BYTES
from .schemas import (
    ApplyIn,
    ChunkReportOut,
    ImportOut,
    ImportPage,
    ImportQuery,
    PreviewQuery,
)
from .sources import importers
from .tables import chunks, imports

blueprint = Blueprint("imports", __name__)
TAGS = ["imports"]
#: An import without its items (``items`` would read a dict's own method).
_BARE = ImportOut(exclude=("items",))


def view(
    row: Any, space_id: str, applied: int, *, made: Plan | None = None, found: bool = True
) -> dict[str, Any]:
    """An import as the API shows it: with ``found``, its chunks, problems
    and refused edges (kept with it); with the plan ``made``, each record's
    item too."""
    out: dict[str, Any] = {
        "id": row["public_id"],
        "space_id": space_id,
        "project_id": row["project_id"],
        "format": row["format"],
        "file": {"name": row["file_name"], "sha256": row["file_sha256"], "size": row["file_size"]},
        "identity": row["identity"],
        "service_revision": row["service_revision"],
        "state": row["state"],
        "chunk_size": row["chunk_size"],
        "chunks_applied": applied,
        "counts": json.loads(row["counts"]),
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }
    if found:
        out.update(json.loads(row["summary"]))
        for chunk in out["chunks"]:
            chunk["applied"] = chunk["number"] <= applied
    if made is None:
        return _BARE.dump(out)  # type: ignore[no-any-return]
    out["items"] = [
        {
            "source_id": item.record.source_id,
            "line": item.record.line,
            "title": item.record.title,
            "action": item.action,
            "chunk": item.chunk,
            "task_id": item.task_id,
            "state": item.record.state,
            "source_state": item.record.source_state,
            "state_reason": item.record.state_reason,
            "prerequisites": list(item.prerequisites),
            "links": [{"kind": link.kind, "target": link.target} for link in item.links],
            "notes": list(item.notes),
            "warnings": list(item.record.warnings),
        }
        for item in made.items
    ]
    return ImportOut().dump(out)  # type: ignore[no-any-return]


async def _project_id(conn: Transaction, access: SpaceAccess, ref: str) -> str:
    project = await current_buildmax().services.get(TaskQueue).project(conn, access.public_id, ref)
    if project is None:
        raise NotFound("no such project in this space")
    return project.id


@blueprint.post("/v1/spaces/<space>/imports")
@api(
    "Preview an import: the body is the file (members)",
    response=ImportOut,
    status=201,
    idempotent=True,
    role="member",
    action="imports.preview",
    tags=TAGS,
    body_type="application/octet-stream",
    query=PreviewQuery,
)
async def preview(caller: Caller, access: SpaceAccess) -> Response:
    """Reads the file with the importer ``format`` and answers what applying
    it would do, in chunks of ``chunk_size``: how many records would be
    created, updated, left unchanged, or are in conflict (changed here too
    since they were imported); the problems of the file by line; the
    prerequisites and links left out, and why (a broken link, a cycle).
    Each record's item is in ``GET /imports/{id}``. Nothing but the preview
    and the file's bytes is kept. 422 ``import-file-refused`` (with
    ``line``) for a file that cannot be read as the format, 413 past 64
    MiB. A retry with the same ``Idempotency-Key`` and the same bytes
    answers the first preview."""
    app = current_buildmax()
    query = query_args()
    try:
        importer = importing.importer_named(app, query["format"])
    except KeyError:
        offered = ", ".join(importers(app.hooks))
        raise ValidationFailed(
            f"no importer {query['format']!r}; this server has {offered}",
            errors={"format": [f"One of: {offered}."]},
        ) from None
    async with app.db.read() as conn:
        project_id = await _project_id(conn, access, query["project"])
    declared = request.content_length
    if declared is not None and declared > MAX_FILE_BYTES:
        raise PayloadTooLarge(f"an import's file may have at most {MAX_FILE_BYTES} bytes")
    app.disk.require_room(MAX_FILE_BYTES if declared is None else declared)
    fingerprint = fingerprint_of(sorted(query.items()))
    async with app.idempotency.streamed(caller, fingerprint) as receipt:
        with tempfile.TemporaryFile() as file:
            sha256, size = await _received(file)
            if receipt.replay is not None:
                if receipt.replay.body["file"]["sha256"] != sha256:
                    raise IdempotencyKeyReused(
                        "this idempotency key was already used to preview another file"
                    )
                return replayed(receipt.replay)
            made, known, key = await _planned(app, access, importer, file, sha256, query)
        row = await _recorded(
            app,
            caller,
            access,
            project_id,
            importer.name,
            made,
            known,
            _File(key, sha256, size, query.get("name")),
            query["chunk_size"],
            receipt,
        )
    importing.remember(row, made)
    return json_response(view(row, access.public_id, 0), 201)


@dataclass(frozen=True)
class _File:
    """An import's file as kept: its blob key, digest, size and name."""

    key: str
    sha256: str
    size: int
    name: str | None


async def _received(file: IO[bytes]) -> tuple[str, int]:
    """The request's body written to ``file``; its sha256 and size (413 past the limit)."""
    digest, size = hashlib.sha256(), 0
    try:
        async for part in allow_body(MAX_FILE_BYTES):
            digest.update(part)
            size += len(part)
            await asyncio.to_thread(file.write, part)
    except RequestEntityTooLarge:
        raise PayloadTooLarge(f"an import's file may have at most {MAX_FILE_BYTES} bytes") from None
    return digest.hexdigest(), size


async def _planned(
    app: BuildMax,
    access: SpaceAccess,
    importer: Importer,
    file: BinaryIO,
    sha256: str,
    query: dict[str, Any],
) -> tuple[Plan, dict[str, importing.Known], str]:
    """The file read and planned over the space's earlier imports, and kept
    in the blob store: the plan, what it assumed, and the file's key."""
    reading = await asyncio.to_thread(importing.read_file, importer, file)
    # The records of the file, and those they name: an earlier import may have made them.
    ids = {record.source_id for record in reading.records}
    ids |= {link.target for record in reading.records for link in record.links}
    async with app.db.read(background=True) as conn:
        known = await importing.earlier_of(
            conn, app.services.get(TaskQueue), (access.pk, access.public_id), importer.name, ids
        )
    made = await asyncio.to_thread(importing.make_plan, reading, known, sha256, query["chunk_size"])
    key = await importing.keep_file(blob_store(app), access.public_id, file, sha256)
    return made, known, key


async def _recorded(
    app: BuildMax,
    caller: Caller,
    access: SpaceAccess,
    project_id: str,
    format: str,
    made: Plan,
    known: dict[str, importing.Known],
    file: _File,
    chunk_size: int,
    receipt: Receipt,
) -> Any:
    """The preview's row, its audit event and the key's receipt, in one transaction."""
    now = app.clock.now_ms()
    public_id = importing.new_import_id()
    counted = importing.counts(made)
    async with app.db.write() as tx:
        await tx.execute(
            imports.insert().values(
                public_id=public_id,
                space_id=access.pk,
                project_id=project_id,
                format=format,
                file_name=file.name,
                file_sha256=file.sha256,
                file_size=file.size,
                blob_key=file.key,
                identity=made.identity,
                service_revision=importing.SERVICE_REVISION,
                chunk_size=chunk_size,
                chunk_count=len(made.chunks),
                state="previewed",
                counts=json.dumps(counted),
                earlier=importing.assumed(known),
                summary=importing.summary(made),
                created_by=caller.principal_pk,
                created_at=now,
                updated_at=now,
            )
        )
        await app.audit.record(
            tx,
            caller.actor,
            "import.previewed",
            space_id=access.public_id,
            target_type="import",
            target_id=public_id,
            details={
                "project_id": project_id,
                "format": format,
                "file_sha256": file.sha256,
                "identity": made.identity,
                "chunks": len(made.chunks),
                **counted,
            },
            admin_override=access.admin_override,
        )
        row = await importing.find(tx, access.pk, public_id)
        await receipt.keep(tx, Reply(201, view(row, access.public_id, 0)))
    return row


@blueprint.get("/v1/spaces/<space>/imports")
@api(
    "List the space's imports, newest first (viewers)",
    response=ImportPage,
    role="viewer",
    action="imports.read",
    tags=TAGS,
)
async def list_imports(caller: Caller, access: SpaceAccess) -> Response:
    """Each import's counts and state; its items are in ``GET /imports/{id}``."""
    app = current_buildmax()
    page = page_request()
    # Not what a preview assumed or found: megabytes, maybe, and a list shows neither.
    shown = [column for column in imports.c if column.name not in ("earlier", "summary")]
    statement = sa.select(*shown).where(imports.c.space_id == access.pk)
    if page.after is not None:
        statement = statement.where(older_than(imports, page.after[0]))
    async with app.db.read() as conn:
        rows = await conn.fetch_all(statement.order_by(imports.c.id.desc()).limit(page.limit + 1))
    items = [view(row, access.public_id, row["chunks_applied"], found=False) for row in rows]
    return json_response(
        page_body(items[: page.limit], list(rows), page.limit, lambda row: [row["public_id"]])
    )


@blueprint.get("/v1/spaces/<space>/imports/<import_id>")
@api(
    "Show an import: its preview and how far it is applied (viewers)",
    response=ImportOut,
    role="viewer",
    action="imports.read",
    tags=TAGS,
    query=ImportQuery,
)
async def show_import(import_id: str, caller: Caller, access: SpaceAccess) -> Response:
    """The preview as it was made, with ``chunks_applied``. Each record's
    item is made again from the kept file and what the preview assumed (409
    ``import-stale`` when this server would plan the file differently, 410
    ``blob-missing`` when the file is gone); ``items=exclude`` leaves the
    items out and reads only what is kept with the import."""
    app = current_buildmax()
    async with app.db.read() as conn:
        row = await importing.find(conn, access.pk, import_id)
    # The items are made again from the kept file; the rest is kept with the import.
    made = await importing.plan_of(app, row) if query_args()["items"] == "include" else None
    return json_response(view(row, access.public_id, row["chunks_applied"], made=made))


def _chunk_number(text: str) -> int:
    """A chunk's number from its path segment (404 for what is none)."""
    if not text.isascii() or not text.isdigit() or len(text) > 9 or text.startswith("0"):
        raise NotFound("no such chunk of this import")
    return int(text)


@blueprint.post("/v1/spaces/<space>/imports/<import_id>/chunks/<number>")
@api(
    "Apply one chunk of a previewed import (members)",
    body=ApplyIn,
    response=ChunkReportOut,
    idempotent=True,
    role="member",
    action="imports.apply",
    tags=TAGS,
)
async def apply_chunk(
    import_id: str, number: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]
) -> Work:
    """Applies chunk ``number`` in one transaction, after every chunk before
    it (409 ``import-chunk-out-of-order`` otherwise, naming
    ``next_chunk``), when ``identity`` is the preview's and nothing it
    assumed moved (409 ``import-stale``: preview again). A chunk applied
    already answers its report again and changes nothing, so a client that
    lost the answer asks again, with its key or without."""
    app = current_buildmax()
    chunk = _chunk_number(number)
    async with app.db.read() as conn:
        row = await importing.find(conn, access.pk, import_id)
    if data["identity"] != row["identity"]:
        raise ImportStale(
            "that is not this import's preview: show the import and apply what it previewed",
            identity=row["identity"],
        )
    made = await importing.plan_of(app, row)

    async def work(tx: Transaction) -> Reply:
        job = importing.Applying(
            app,
            tx,
            caller.actor,
            caller.principal_pk,
            (access.pk, access.public_id),
            row,
            made,
            chunk,
            admin_override=access.admin_override,
        )
        report = await importing.apply_chunk(job)
        if report is None:  # applied before (by this client or another): its report
            report = {**await importing.applied_report(tx, row["id"], chunk), "replayed": True}
        return Reply(200, _report(row, report))

    return work


def _report(row: Any, report: dict[str, Any]) -> dict[str, Any]:
    return ChunkReportOut().dump(  # type: ignore[no-any-return]
        {"import_id": row["public_id"], "of": row["chunk_count"], **report}
    )


@blueprint.get("/v1/spaces/<space>/imports/<import_id>/chunks/<number>")
@api(
    "Show what applying a chunk did (viewers)",
    response=ChunkReportOut,
    role="viewer",
    action="imports.read",
    tags=TAGS,
)
async def show_chunk(import_id: str, number: str, caller: Caller, access: SpaceAccess) -> Response:
    """Each record of the chunk: what it became, its task, what changed and
    what was not applied and why. 404 for a chunk not applied."""
    app = current_buildmax()
    chunk = _chunk_number(number)
    async with app.db.read() as conn:
        row = await importing.find(conn, access.pk, import_id)
        applied = await conn.fetch_val(
            sa.select(chunks.c.number).where(
                chunks.c.import_id == row["id"], chunks.c.number == chunk
            )
        )
        if applied is None:
            raise NotFound(f"chunk {chunk} of this import is not applied")
        report = await importing.applied_report(conn, row["id"], chunk)
    return json_response(_report(row, report))
