"""The catalog over HTTP, under ``/v1/catalog``.

Every authenticated principal browses the catalog and downloads packages;
a token scoped to an attempt (a run token) is refused here. System admins
and operators publish, yank and archive; only a system admin marks a
release eligible for unattended use, naming the digest of the release whose
capability report they read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from buildmax_hookspecs import BlobNotFound, TaskQueue, Transaction
from marshmallow import RAISE, Schema, fields, validate
from quart import Blueprint, Response, request
from werkzeug.exceptions import RequestEntityTooLarge

from buildmax.access import require_space
from buildmax.apidoc import api
from buildmax.app import BuildMax, blob_store
from buildmax.auth import Caller
from buildmax.bodies import json_response
from buildmax.clock import to_rfc3339
from buildmax.current import current_buildmax
from buildmax.downloads import open_verified
from buildmax.idempotency import Reply, Work, fingerprint_of, replayed
from buildmax.pagination import page_body, page_request
from buildmax.problems import (
    BlobMissing,
    Conflict,
    IdempotencyKeyReused,
    NotFound,
    PayloadTooLarge,
)
from buildmax.roles import SYSTEM_ROLES
from buildmax.schemas import Pattern, StrictBoolean
from buildmax.spaces import space_pk
from buildmax.streaming import allow_body

from .catalog import (
    PLUGIN_SELECT,
    Spooled,
    archive_plugin,
    checked_name,
    plugin_or_404,
    publish,
    release,
    release_or_404,
    releases_of,
    set_eligibility,
    spool,
    yank_release,
)
from .diagnostics import record_failure
from .materialize import REASONS
from .settings import marketplace_settings
from .tables import plugins

blueprint = Blueprint("catalog", __name__)


class ReasonBody(Schema):
    class Meta:
        unknown = RAISE

    reason = fields.String(required=True, validate=validate.Length(min=1, max=1000))


class EligibilityBody(Schema):
    class Meta:
        unknown = RAISE

    eligible = StrictBoolean(required=True)
    sha256 = fields.String(required=True, validate=Pattern(r"^[0-9a-f]{64}$"))


class ReleaseOut(Schema):
    name = fields.String()
    version = fields.String()
    sha256 = fields.String()
    size = fields.Integer()
    description = fields.String()
    report = fields.Dict()
    executable = fields.Boolean()
    published_by = fields.String()
    published_at = fields.String()
    yanked = fields.Boolean()
    yank_reason = fields.String(allow_none=True)
    eligible = fields.Boolean()
    eligible_by = fields.String(allow_none=True)
    eligible_at = fields.String(allow_none=True)
    package_url = fields.String()


class PluginOut(Schema):
    name = fields.String()
    description = fields.String()
    publisher = fields.String()
    archived = fields.Boolean()
    archive_reason = fields.String(allow_none=True)
    latest = fields.String(allow_none=True)
    releases = fields.List(fields.Nested(ReleaseOut))


class PluginPage(Schema):
    items = fields.List(fields.Nested(PluginOut))
    next_cursor = fields.String(allow_none=True)


def release_view(row: dict[str, Any]) -> dict[str, Any]:
    """A release's public fields."""
    return {
        "name": row["name"],
        "version": row["version"],
        "sha256": row["sha256"],
        "size": row["size"],
        "description": row["description"],
        "report": json.loads(row["report"]),
        "executable": bool(row["executable"]),
        "published_by": row["published_by_id"],
        "published_at": to_rfc3339(row["published_at"]),
        "yanked": row["yanked_at"] is not None,
        "yank_reason": row["yank_reason"],
        "eligible": row["eligible_at"] is not None,
        "eligible_by": row["eligible_by_id"],
        "eligible_at": to_rfc3339(row["eligible_at"]),
        "package_url": f"/v1/catalog/{row['name']}/releases/{row['version']}/package",
    }


def latest(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest unyanked release of ``rows`` (newest first), if any."""
    return next((r for r in rows if r["yanked_at"] is None), None)


async def _plugin_view(conn: Transaction, row: dict[str, Any]) -> dict[str, Any]:
    found = await releases_of(conn, row["name"])
    newest = latest(found)
    return {
        "name": row["name"],
        "description": row["description"],
        "publisher": row["publisher"],
        "archived": row["archived_at"] is not None,
        "archive_reason": row["archive_reason"],
        "latest": newest["version"] if newest else None,
        "releases": [release_view(r) for r in found],
    }


@blueprint.post("/v1/catalog/<name>/releases")
@api(
    "Publish a release (system admins and operators); the body is the .tar.gz or .zip",
    response=ReleaseOut,
    status=201,
    also={200: "This version exists with the same bytes: the existing release"},
    system_roles=SYSTEM_ROLES,
    idempotent=True,
    tags=["catalog"],
    body_type="application/octet-stream",
)
async def publish_release(name: str, caller: Caller) -> Response:
    """The bytes are streamed to disk (413 past the size limit; 507
    ``disk-reserve-reached`` first, when the declared size, or the limit for
    a body of unknown length, would leave less free disk than the server
    keeps in reserve), inspected (422 ``package-invalid`` naming the
    reason), stored and recorded. The
    same version again: 200 with the existing release if the bytes are the
    same, 409 ``release-exists`` if not. A retry with the same
    ``Idempotency-Key`` answers the first answer when its bytes are the
    same (422 ``idempotency-key-reused`` if not), and a duplicate while the
    first still streams is 409."""
    app = current_buildmax()
    checked_name(name)
    limit = marketplace_settings(app).max_package_bytes
    if (request.content_length or 0) > limit:
        raise PayloadTooLarge(f"a release archive may have at most {limit} bytes")
    # Before the key is claimed or a byte spooled; a body of unknown length
    # counts as its limit, the most it may bring.
    app.disk.require_room(limit if request.content_length is None else request.content_length)
    async with app.idempotency.streamed(caller, fingerprint_of(name)) as receipt:
        spooled = await _spooled_body(app, limit)
        try:
            if receipt.replay is not None:
                if spooled.sha256 != receipt.replay.body["sha256"]:
                    raise IdempotencyKeyReused(
                        "this idempotency key was already used to publish other bytes"
                    )
                return replayed(receipt.replay)
            row, created = await publish(app, caller.actor, name, spooled)
        finally:
            await asyncio.to_thread(spooled.path.unlink, missing_ok=True)
        reply = Reply(201 if created else 200, release_view(row))
        # A release is named by its version and bytes, so the receipt needs
        # no transaction of the release's: a retry finds the same release.
        async with app.db.write() as tx:
            await receipt.keep(tx, reply)
    return json_response(reply.body, reply.status)


async def _spooled_body(app: BuildMax, limit: int) -> Spooled:
    try:
        return await spool(app, allow_body(limit).__aiter__(), limit)
    except RequestEntityTooLarge:
        raise PayloadTooLarge(f"a release archive may have at most {limit} bytes") from None


@blueprint.get("/v1/catalog")
@api(
    "Browse the catalog by name (any principal; not a run token)",
    response=PluginPage,
    tags=["catalog"],
)
async def list_plugins() -> Response:
    """``archived=true`` includes archived plugins."""
    app = current_buildmax()
    page = page_request()
    query = PLUGIN_SELECT.order_by(plugins.c.name).limit(page.limit + 1)
    if request.args.get("archived") != "true":
        query = query.where(plugins.c.archived_at.is_(None))
    if page.after is not None:
        query = query.where(plugins.c.name > page.after[0])
    async with app.db.read() as conn:
        rows = [dict(r) for r in await conn.fetch_all(query)]
        items = [await _plugin_view(conn, r) for r in rows[: page.limit]]
    return json_response(page_body(items, rows, page.limit, lambda r: (r["name"],)))


@blueprint.get("/v1/catalog/<name>")
@api("A plugin with its releases, newest first", response=PluginOut, tags=["catalog"])
async def show_plugin(name: str) -> Response:
    app = current_buildmax()
    async with app.db.read() as conn:
        return json_response(await _plugin_view(conn, await plugin_or_404(conn, name)))


@blueprint.get("/v1/catalog/<name>/releases/<version>")
@api("A release with its capability report", response=ReleaseOut, tags=["catalog"])
async def show_release(name: str, version: str) -> Response:
    app = current_buildmax()
    async with app.db.read() as conn:
        return json_response(release_view(await release_or_404(conn, name, version)))


@blueprint.get("/v1/catalog/<name>/releases/<version>/package")
@api(
    "Download a release's exact bytes (any principal; not a run token)",
    tags=["catalog"],
    content_type="application/octet-stream",
)
async def download_package(name: str, version: str) -> Response:
    """``ETag`` is the sha256 of the bytes."""
    app = current_buildmax()
    async with app.db.read() as conn:
        row = await release_or_404(conn, name, version)
    return await package_response(app, row)


async def package_response(app: BuildMax, row: dict[str, Any]) -> Response:
    """A release's bytes as a download: 410 when the store lost them or they
    no longer match the release's size and sha256 (a mismatch found while
    sending cuts the answer short; see :mod:`buildmax.downloads`)."""
    what = f"{row['name']} {row['version']}"
    try:
        body = await open_verified(
            blob_store(app), row["blob_key"], size=row["size"], sha256=row["sha256"], what=what
        )
    except BlobNotFound:
        raise BlobMissing(f"the bytes of {what} are missing from the store") from None
    first = body.first
    extension = "zip" if first.startswith(b"PK") else "tar.gz"
    response = Response(body, content_type="application/octet-stream")
    response.headers["Content-Length"] = str(row["size"])
    response.headers["ETag"] = f'"{row["sha256"]}"'
    response.headers["Content-Disposition"] = (
        f'attachment; filename="{row["name"]}-{row["version"]}.{extension}"'
    )
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


@blueprint.post("/v1/catalog/<name>/releases/<version>/yank")
@api(
    "Yank a release (system admins and operators): no longer offered; pins stay",
    body=ReasonBody,
    response=ReleaseOut,
    system_roles=SYSTEM_ROLES,
    idempotent=True,
    tags=["catalog"],
)
async def yank(name: str, version: str, caller: Caller, data: dict[str, Any]) -> Work:
    """A yanked release stays pinned wherever it is activated and keeps
    working there; it is no longer the latest. Yanking twice keeps the first reason."""
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        row = await yank_release(app, tx, caller.actor, caller.principal_pk, name, version, data)
        return Reply(200, release_view(row))

    return work


@blueprint.post("/v1/catalog/<name>/archive")
@api(
    "Archive a plugin (system admins and operators): nothing more is published; pins stay",
    body=ReasonBody,
    response=PluginOut,
    system_roles=SYSTEM_ROLES,
    idempotent=True,
    tags=["catalog"],
)
async def archive(name: str, caller: Caller, data: dict[str, Any]) -> Work:
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        row = await archive_plugin(app, tx, caller.actor, caller.principal_pk, name, data)
        return Reply(200, await _plugin_view(tx, row))

    return work


@blueprint.post("/v1/catalog/<name>/releases/<version>/eligibility")
@api(
    "Mark a release eligible for unattended use, or not (system admins only)",
    body=EligibilityBody,
    response=ReleaseOut,
    system_roles=["admin"],
    idempotent=True,
    tags=["catalog"],
)
async def eligibility(name: str, version: str, caller: Caller, data: dict[str, Any]) -> Work:
    """``sha256`` names the release whose capability report the admin read:
    409 when it is not this release's. Eligibility belongs to this release
    only; the next version starts ineligible."""
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        row = await set_eligibility(app, tx, caller.actor, caller.principal_pk, name, version, data)
        return Reply(200, release_view(row))

    return work


# -- a run's packages --------------------------------------------------------------


async def _run_pins(
    app: BuildMax, caller: Caller, attempt_id: str
) -> tuple[Any, list[dict[str, Any]]]:
    """The attempt a run token (or its claimant) may read, and its pins.

    These routes are not under ``/v1/spaces/{space}``, so the attempt's
    space is asked here, as every space route asks it: only a current member
    who may run work there (``member`` role) reads, whichever token it
    shows; a stranger gets the 404 of an attempt that does not exist."""
    scoped = caller.actor.scope_type == "attempt"
    if scoped and caller.actor.scope_id != attempt_id:
        raise NotFound("no such attempt")
    queue = task_queue(app)
    async with app.db.read() as conn:
        attempt = await queue.attempt(conn, attempt_id)
    if attempt is None or (not scoped and attempt.claimant_id != caller.actor.principal_id):
        raise NotFound("no such attempt")
    try:
        await require_space(attempt.space_id, "member", caller, "catalog.run.read")
    except NotFound:
        raise NotFound("no such attempt") from None
    if attempt.state != "active":
        raise Conflict(f"the attempt is {attempt.state}", state=attempt.state)
    environment = attempt.run_environment.get("plugins") or {}
    return attempt, list(environment.get("pins", []))


def task_queue(app: BuildMax) -> TaskQueue:
    """The tasks plugin's service."""
    return app.services.get(TaskQueue)


@blueprint.get("/v1/attempts/<attempt>/packages")
@api(
    "The packages pinned for an attempt (its run token, or its claimant)",
    scopes=["attempt"],
    tags=["catalog"],
)
async def run_packages(attempt: str, caller: Caller) -> Response:
    """The pins resolved at claim (name, version, sha256), the attempt's
    space and generation, and the agent revision they came from."""
    app = current_buildmax()
    found, pinned = await _run_pins(app, caller, attempt)
    return json_response(
        {
            "attempt_id": found.id,
            "space_id": found.space_id,
            "task_id": found.task_id,
            "generation": found.generation,
            "agent_revision_id": (found.run_environment.get("plugins") or {}).get(
                "agent_revision_id"
            ),
            # The server's reader limits: what it accepted, its workers accept.
            "limits": dataclasses.asdict(marketplace_settings(app).limits),
            "pins": [
                {
                    "name": p["name"],
                    "version": p["version"],
                    "sha256": p["sha256"],
                    "package_url": f"/v1/attempts/{found.id}/packages/{p['name']}",
                }
                for p in pinned
            ],
        }
    )


@blueprint.get("/v1/attempts/<attempt>/packages/<name>")
@api(
    "Download one of an attempt's pinned packages (its run token, or its claimant)",
    scopes=["attempt"],
    tags=["catalog"],
    content_type="application/octet-stream",
)
async def run_package(attempt: str, name: str, caller: Caller) -> Response:
    """Only a package the attempt's pins name, at the pinned version and digest."""
    app = current_buildmax()
    _, pinned = await _run_pins(app, caller, attempt)
    wanted = next((p for p in pinned if p["name"] == name), None)
    if wanted is None:
        raise NotFound("this attempt has no pin of that plugin")
    async with app.db.read() as conn:
        row = await release(conn, name, wanted["version"])
    if row is None or row["sha256"] != wanted["sha256"]:
        raise NotFound("the pinned release is no longer in the catalog")
    return await package_response(app, row)


class FailureBody(Schema):
    """Why a run could not materialize its packages."""

    class Meta:
        unknown = RAISE

    reason = fields.String(required=True, validate=validate.OneOf(tuple(REASONS)))


class FailureOut(Schema):
    attempt_id = fields.String()
    reason = fields.String()
    recorded_at = fields.String()


@blueprint.post("/v1/attempts/<attempt>/materialization-failures")
@api(
    "Report that a run could not materialize its packages (its run token, or its claimant)",
    body=FailureBody,
    response=FailureOut,
    status=201,
    scopes=["attempt"],
    idempotent=True,
    tags=["catalog"],
)
async def report_failure(attempt: str, caller: Caller, data: dict[str, Any]) -> Work:
    """``reason`` is a code (``listing``, ``download``, ``digest``,
    ``package``, ``server``, ``local``); the error's words stay on the
    worker. The attempt must still be active: report before failing it. The
    space's admins see it on their attention list for a day."""
    app = current_buildmax()
    found, _ = await _run_pins(app, caller, attempt)

    async def work(tx: Transaction) -> Reply:
        pk = await space_pk(tx, found.space_id)
        assert pk is not None, "the space of an attempt exists"
        at = await record_failure(app, tx, caller, found, pk, data["reason"])
        return Reply(
            201, {"attempt_id": found.id, "reason": data["reason"], "recorded_at": to_rfc3339(at)}
        )

    return work
