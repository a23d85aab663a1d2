"""Artifacts over HTTP, under ``/v1/spaces/{space}/artifacts``.

Upload: ``POST`` with the bytes as the body (``Content-Type`` is the media
type) and ``name``, optional ``sha256``, ``task`` and ``attempt`` in the
query string. The declared size (``Content-Length``, or the limit for a
chunked body) is reserved first in a short transaction; the body streams
into the blob store, pulled only as fast as it is written; the artifact row
is written, and the reservation settled, in a second short transaction. A
refused, oversized, mismatched or interrupted upload leaves no artifact and
no reservation, and the store removes its temporary bytes.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any
from urllib.parse import quote

import sqlalchemy as sa
from buildmax_hookspecs import (
    BlobDigestMismatch,
    BlobNotFound,
    BlobTooLarge,
    Transaction,
)
from marshmallow import EXCLUDE, Schema, fields
from quart import Blueprint, Response, request
from werkzeug.exceptions import RequestEntityTooLarge

from buildmax.access import SpaceAccess
from buildmax.apidoc import api, query_args
from buildmax.app import BuildMax, blob_store
from buildmax.auth import Caller
from buildmax.bodies import json_response
from buildmax.current import current_buildmax
from buildmax.database.base import uncancellable
from buildmax.downloads import open_verified
from buildmax.idempotency import Receipt, Reply, Work, fingerprint_of, replayed
from buildmax.ids import new_id
from buildmax.pagination import older_than, page_body, page_request
from buildmax.problems import (
    BlobMissing,
    IdempotencyKeyReused,
    NotFound,
    PayloadTooLarge,
    ValidationFailed,
)
from buildmax.schemas import Pattern, Timestamp, revision_number
from buildmax.streaming import allow_body
from buildmax.tables import principals

from .gc import KEY_PREFIX
from .links import MAX_REASON, Link, requested_link, task_queue
from .problems import DigestMismatch, RangeNotSatisfiable
from .quota import Reservation, release, reserve, settle
from .retention import set_pinned, tombstone_artifact
from .settings import ArtifactSettings, artifact_settings
from .tables import artifacts

blueprint = Blueprint("artifacts", __name__)

_MEDIA_TYPE = re.compile(r"^[a-z0-9][a-z0-9!#$&^_.+-]{0,126}/[a-z0-9][a-z0-9!#$&^_.+-]{0,126}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: Media types shown inline; everything else is served as an attachment.
INLINE = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp", "text/plain"})


class ArtifactOut(Schema):
    id = fields.String(attribute="public_id")
    name = fields.String()
    media_type = fields.String()
    size = fields.Integer()
    sha256 = fields.String()
    task_id = fields.String(allow_none=True)
    attempt_id = fields.String(allow_none=True)
    pinned = fields.Boolean()
    created_at = Timestamp()
    created_by = fields.String(metadata={"description": "Principal public id"})
    url = fields.String(metadata={"description": "Where the bytes are downloaded"})


class ArtifactPage(Schema):
    items = fields.List(fields.Nested(ArtifactOut))
    next_cursor = fields.String(allow_none=True)


_OUT = ArtifactOut()
_SELECT = sa.select(
    artifacts,
    sa.select(principals.c.public_id)
    .where(principals.c.id == artifacts.c.created_by)
    .scalar_subquery()
    .label("creator"),
)


def _render(space: SpaceAccess, row: Any) -> dict[str, Any]:
    return _OUT.dump(  # type: ignore[no-any-return]
        {
            **row,
            "pinned": bool(row["pinned"]),
            "created_by": row["creator"],
            "url": f"/v1/spaces/{space.public_id}/artifacts/{row['public_id']}/content",
        }
    )


def _text_arg(name: str, *, max_length: int = 255) -> str | None:
    value = request.args.get(name)
    if value is None:
        return None
    if not 1 <= len(value) <= max_length or any(ord(c) < 32 or c in "/\\\x7f" for c in value):
        raise ValidationFailed(
            f"{name} must be 1 to {max_length} printable characters without slashes",
            errors={name: ["Invalid."]},
        )
    return value


def _media_type(raw: str, field: str) -> str:
    """``raw`` (parameters dropped, lowercased) if it is a media type like
    ``text/plain``; else 422 naming ``field``."""
    media_type = raw.split(";")[0].strip().lower()
    if not _MEDIA_TYPE.match(media_type):
        raise ValidationFailed(
            f"{field} must be a media type like text/plain", errors={field: ["Invalid."]}
        )
    return media_type


#: A name or id given in the query: printable, no slash or backslash.
_QUERY_TEXT = r"^[^\x00-\x1f\x7f/\\]{%d,%d}$"


class UploadQuery(Schema):
    """What an upload names in its query."""

    class Meta:
        unknown = EXCLUDE

    name = fields.String(required=True, validate=Pattern(_QUERY_TEXT % (1, 255)))
    sha256 = fields.String(
        validate=Pattern(_SHA256.pattern),
        metadata={"description": "The digest the bytes must have"},
    )
    task = fields.String(validate=Pattern(_QUERY_TEXT % (1, 64)))
    attempt = fields.String(validate=Pattern(_QUERY_TEXT % (1, 64)))
    generation = revision_number(
        text=True, metadata={"description": "The attempt's current generation (with attempt)"}
    )
    override_reason = fields.String(
        validate=Pattern(rf"^[^\x00-\x1f\x7f]{{1,{MAX_REASON}}}$"),
        metadata={"description": "Why a space admin attaches to someone else's attempt"},
    )


@blueprint.post("/v1/spaces/<space>/artifacts")
@api(
    "Upload an artifact: the body is its bytes (members; an attempt's token for its attempt)",
    response=ArtifactOut,
    status=201,
    scopes=["attempt"],
    idempotent=True,
    role="member",
    action="artifacts.upload",
    tags=["artifacts"],
    body_type="application/octet-stream",
    query=UploadQuery,
)
async def upload(caller: Caller, access: SpaceAccess) -> Response:
    """Query: ``name`` (required), ``sha256`` (the digest the bytes must
    have), ``task``, ``attempt`` with its ``generation``, and
    ``override_reason`` (a space admin attaching to someone else's attempt).
    An attempt takes its current owner at its current generation: 403
    ``not-attempt-owner``, 409 ``stale-generation``, ``attempt-ended`` or
    ``lease-lapsed`` otherwise, checked before and after the bytes stream.
    413 past the size limit, 409 ``quota-exceeded``, 422 ``digest-mismatch``,
    507 ``disk-reserve-reached`` when storing the declared size (the limit,
    for a body of unknown length) would leave less free disk than the
    server keeps in reserve.
    A retry with the same ``Idempotency-Key`` and the same bytes answers the
    first artifact and stores and charges nothing; with other bytes, 422
    ``idempotency-key-reused``; while the first still streams, 409."""
    app = current_buildmax()
    settings = artifact_settings(app)
    query = query_args()
    name, expected = query["name"], query.get("sha256")
    media_type = _media_type(
        request.headers.get("Content-Type") or "application/octet-stream", "Content-Type"
    )
    link = await requested_link(
        app,
        caller,
        access,
        task=query.get("task"),
        attempt=query.get("attempt"),
        generation=query.get("generation"),
        override_reason=query.get("override_reason"),
    )
    declared = request.content_length
    if declared is not None and declared > settings.max_bytes:
        raise PayloadTooLarge(f"an artifact may have at most {settings.max_bytes} bytes")
    limit = settings.max_bytes if declared is None else declared
    # Before the key is claimed, the quota reserved or a byte stored; a body
    # of unknown length counts as its limit, the most it may bring.
    app.disk.require_room(limit)
    fingerprint = fingerprint_of(sorted(query.items()), media_type)
    async with app.idempotency.streamed(caller, fingerprint) as receipt:
        if receipt.replay is not None:
            await _same_bytes(receipt.replay.body, expected, limit)
            return replayed(receipt.replay)
        return await _store(
            app, caller, access, settings, limit, expected, name, media_type, link, receipt
        )


async def _same_bytes(first: dict[str, Any], expected: str | None, limit: int) -> None:
    """A retry's bytes are the first upload's (422 otherwise): its declared
    digest says so (the fingerprint held it), or its bytes are hashed."""
    if expected is not None:
        return
    digest = hashlib.sha256()
    async for chunk in allow_body(limit):
        digest.update(chunk)
    if digest.hexdigest() != first["sha256"]:
        raise IdempotencyKeyReused("this idempotency key was already used to upload other bytes")


async def _store(
    app: BuildMax,
    caller: Caller,
    access: SpaceAccess,
    settings: ArtifactSettings,
    limit: int,
    expected: str | None,
    name: str | None,
    media_type: str,
    link: Link,
    receipt: Receipt,
) -> Response:
    """Reserve the quota, stream the bytes into the store, and record the
    artifact with its receipt."""
    reservation = await reserve(
        app, settings, access.pk, access.public_id, limit, caller.principal_pk
    )
    try:
        body = allow_body(limit)
        store = blob_store(app)
        ref = await store.put(
            f"{KEY_PREFIX}/space/{access.public_id}",
            body.__aiter__(),
            max_bytes=limit,
            expected_sha256=expected,
        )
    except (BlobTooLarge, RequestEntityTooLarge):
        await uncancellable(release(app, reservation))
        raise PayloadTooLarge(f"the body exceeds {limit} bytes (declared size or limit)") from None
    except BlobDigestMismatch as exc:
        await uncancellable(release(app, reservation))
        raise DigestMismatch(f"the bytes' sha256 is {exc.actual}, not {exc.expected}") from None
    except BaseException:
        await uncancellable(release(app, reservation))
        raise
    try:
        row = await uncancellable(
            _finalize(app, caller, access, reservation, ref, name, media_type, link, receipt)
        )
    except BaseException:
        # No row: the blob is an orphan for the collector; the quota comes back now.
        await uncancellable(release(app, reservation))
        raise
    return json_response(_render(access, row), 201)


async def _finalize(
    app: BuildMax,
    caller: Caller,
    access: SpaceAccess,
    reservation: Reservation,
    ref: Any,
    name: str | None,
    media_type: str,
    link: Link,
    receipt: Receipt,
) -> Any:
    """Write the artifact row, settle its reservation and keep the answer
    for its idempotency key in one transaction, fencing its attempt again
    first: the attempt cannot end, or change hands, between that check and
    the commit."""
    public_id = new_id("af")
    async with app.db.write() as tx:
        override = access.admin_override
        details: dict[str, Any] = {}  # the attempt's generation, an override's reason
        if link.attempt_id is not None and link.generation is not None:
            attempt = await task_queue(app).fence(
                tx,
                link.attempt_id,
                link.generation,
                actor=caller.actor,
                space_id=access.public_id,
                override_reason=link.override_reason,
            )
            details["generation"] = link.generation
            if attempt.claimant_id != caller.actor.principal_id:
                override, details["override_reason"] = True, link.override_reason
        await tx.execute(
            artifacts.insert().values(
                public_id=public_id,
                space_id=access.pk,
                name=name,
                media_type=media_type,
                size=ref.size,
                sha256=ref.sha256,
                blob_key=ref.key,
                task_id=link.task_id,
                attempt_id=link.attempt_id,
                created_at=app.clock.now_ms(),
                created_by=caller.principal_pk,
            )
        )
        await settle(tx, reservation, ref.size, artifact_settings(app))
        await app.audit.record(
            tx,
            caller.actor,
            "artifact.uploaded",
            space_id=access.public_id,
            target_type="artifact",
            target_id=public_id,
            admin_override=override,
            details={
                "name": name,
                "media_type": media_type,
                "size": ref.size,
                "sha256": ref.sha256,
                "task_id": link.task_id,
                "attempt_id": link.attempt_id,
                **details,
            },
        )
        row = await tx.fetch_one(_SELECT.where(artifacts.c.public_id == public_id))
        await receipt.keep(tx, Reply(201, _render(access, row)))
        return row


async def _readable(app: BuildMax, caller: Caller, access: SpaceAccess, row: Any) -> None:
    """An attempt's token reads only the artifacts of its own task, in its
    own space; 404 otherwise, as if they did not exist."""
    if caller.actor.scope_type != "attempt":
        return
    queue = task_queue(app)
    async with app.db.read() as conn:
        attempt = await queue.attempt(conn, str(caller.actor.scope_id))
    if attempt is None or attempt.space_id != access.public_id or row["task_id"] != attempt.task_id:
        raise NotFound("no such artifact in this space")


async def _find(app: BuildMax, access: SpaceAccess, artifact: str) -> Any:
    async with app.db.read() as conn:
        return await _live(conn, access, artifact)


async def _live(conn: Transaction, access: SpaceAccess, artifact: str) -> Any:
    """The space's artifact, not deleted; 404 otherwise."""
    row = await conn.fetch_one(
        _SELECT.where(
            artifacts.c.public_id == artifact,
            artifacts.c.space_id == access.pk,
            artifacts.c.deleted_at.is_(None),
        )
    )
    if row is None:
        raise NotFound("no such artifact in this space")
    return row


@blueprint.get("/v1/spaces/<space>/artifacts")
@api(
    "List a space's artifacts, newest first (viewers)",
    response=ArtifactPage,
    tags=["artifacts"],
    role="viewer",
    action="artifacts.read",
)
async def list_artifacts(access: SpaceAccess) -> Response:
    """Filters: ``task``, ``attempt``, ``media_type``."""
    app = current_buildmax()
    page = page_request()
    query = (
        _SELECT.where(artifacts.c.space_id == access.pk, artifacts.c.deleted_at.is_(None))
        .order_by(artifacts.c.id.desc())
        .limit(page.limit + 1)
    )
    for name, column in (("task", artifacts.c.task_id), ("attempt", artifacts.c.attempt_id)):
        value = _text_arg(name, max_length=64)
        if value is not None:
            query = query.where(column == value)
    if "media_type" in request.args:
        wanted = _media_type(request.args["media_type"], "media_type")
        query = query.where(artifacts.c.media_type == wanted)
    if page.after is not None:
        query = query.where(older_than(artifacts, page.after[0]))
    async with app.db.read() as conn:
        rows = [dict(r) for r in await conn.fetch_all(query)]
    items = [_render(access, r) for r in rows[: page.limit]]
    return json_response(page_body(items, rows, page.limit, lambda r: (r["public_id"],)))


@blueprint.get("/v1/spaces/<space>/artifacts/<artifact>")
@api(
    "An artifact's metadata (viewers; an attempt's token)",
    response=ArtifactOut,
    scopes=["attempt"],
    role="viewer",
    action="artifacts.read",
    tags=["artifacts"],
)
async def get_artifact(artifact: str, caller: Caller, access: SpaceAccess) -> Response:
    """Its digest, size, media type, links and who uploaded it."""
    app = current_buildmax()
    row = await _find(app, access, artifact)
    await _readable(app, caller, access, row)
    return json_response(_render(access, row))


def _range(size: int, sha256: str) -> tuple[int, int] | None:
    """The one byte range asked for (RFC 9110 §14), clipped to the artifact;
    ``None`` for the whole artifact; 416 when the range starts past its end.

    Several ranges, other units or an ``If-Range`` naming another version get
    the whole artifact, as the RFC allows."""
    asked = request.range
    if asked is None or asked.units != "bytes" or len(asked.ranges) != 1:
        return None
    if_range = request.headers.get("If-Range", "").strip()
    if if_range and if_range != f'"{sha256}"':  # a date, a weak or another tag (§13.1.5)
        return None
    start, end = asked.ranges[0]
    if start >= size or size == 0:
        raise RangeNotSatisfiable(
            f"the artifact has {size} bytes", headers={"Content-Range": f"bytes */{size}"}
        )
    if start < 0:  # a suffix: the last -start bytes, all of them if it is longer
        return max(0, size + start), size - 1
    return start, min(size, size if end is None else end) - 1


def _disposition(name: str) -> dict[str, str]:
    """``Content-Disposition`` options (RFC 6266): an ASCII ``filename`` and,
    for any other name, its UTF-8 form in ``filename*``."""
    options = {"filename": name}
    if not name.isascii():
        fallback = name.encode("ascii", "replace").decode().replace("?", "_")
        options = {"filename": fallback, "filename*": "UTF-8''" + quote(name, safe="")}
    return options


@blueprint.get("/v1/spaces/<space>/artifacts/<artifact>/content")
@api(
    "Download an artifact's bytes (viewers; an attempt's token); one byte range is supported",
    scopes=["attempt"],
    role="viewer",
    action="artifacts.read",
    tags=["artifacts"],
    # The artifact's own media type, whatever it was uploaded as.
    content_type="*/*",
    also={206: "The byte range the Range header asked for"},
)
async def download(artifact: str, caller: Caller, access: SpaceAccess) -> Response:
    """``ETag`` is the sha256; anything but a few image types and plain
    text comes as an attachment."""
    app = current_buildmax()
    row = await _find(app, access, artifact)
    await _readable(app, caller, access, row)
    etag = f'"{row["sha256"]}"'
    span = _range(row["size"], row["sha256"])
    try:
        chunks = await open_verified(
            blob_store(app),
            row["blob_key"],
            size=row["size"],
            sha256=row["sha256"],
            span=span,
            what=f"artifact {row['public_id']}",
        )
    except BlobNotFound:
        raise BlobMissing("the artifact's bytes are missing from the blob store") from None
    response = Response(chunks, status=206 if span else 200, mimetype=row["media_type"])
    length = row["size"] if span is None else span[1] - span[0] + 1
    response.headers["Content-Length"] = str(length)
    response.headers["ETag"] = etag
    response.headers["Accept-Ranges"] = "bytes"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Content-Security-Policy"] = "sandbox"
    if span is not None:
        response.headers["Content-Range"] = f"bytes {span[0]}-{span[1]}/{row['size']}"
    disposition = "inline" if row["media_type"] in INLINE else "attachment"
    response.headers.set("Content-Disposition", disposition, **_disposition(row["name"]))
    return response


@blueprint.delete("/v1/spaces/<space>/artifacts/<artifact>")
@api(
    "Delete an artifact: a tombstone; its bytes go with the sweep (members)",
    status=204,
    idempotent=True,
    role="member",
    action="artifacts.delete",
    tags=["artifacts"],
)
async def delete_artifact(artifact: str, caller: Caller, access: SpaceAccess) -> Work:
    """The record keeps who deleted it and when."""
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        await tombstone_artifact(
            app,
            tx,
            caller.actor,
            caller.principal_pk,
            access.pk,
            access.public_id,
            artifact,
            admin_override=access.admin_override,
        )
        return Reply(204, None)

    return work


def _set_pin(caller: Caller, access: SpaceAccess, artifact: str, pinned: bool) -> Work:
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        await set_pinned(
            app,
            tx,
            caller.actor,
            access.pk,
            access.public_id,
            artifact,
            pinned,
            admin_override=access.admin_override,
        )
        return Reply(200, _render(access, await _live(tx, access, artifact)))

    return work


@blueprint.post("/v1/spaces/<space>/artifacts/<artifact>/pin")
@api(
    "Pin an artifact: retention keeps it (members)",
    response=ArtifactOut,
    role="member",
    action="artifacts.pin",
    idempotent=True,
    tags=["artifacts"],
)
async def pin(artifact: str, caller: Caller, access: SpaceAccess) -> Work:
    """Pinning a pinned artifact changes nothing."""
    return _set_pin(caller, access, artifact, True)


@blueprint.post("/v1/spaces/<space>/artifacts/<artifact>/unpin")
@api(
    "Unpin an artifact (members)",
    response=ArtifactOut,
    role="member",
    action="artifacts.pin",
    idempotent=True,
    tags=["artifacts"],
)
async def unpin(artifact: str, caller: Caller, access: SpaceAccess) -> Work:
    """Retention applies to it again."""
    return _set_pin(caller, access, artifact, False)
