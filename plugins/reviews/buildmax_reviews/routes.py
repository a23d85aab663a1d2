"""Reviews, integrations and findings over HTTP, under ``/v1/spaces/{space}``.

``GET /reviews`` lists the work items of the review and integrate stages
(newest first) with what was recorded on each; ``GET /reviews/{id}`` shows
one (by its work item's task id, or a review's or integration's id) with its
findings. ``POST /reviews/{task}`` records a review on a review work item:
the reviewer who holds it hands it in, or a human reviews an unheld one in
one request. ``GET /findings`` and ``POST /findings/{id}/resolve`` read and
resolve findings. An attempt's token reaches these routes of its attempt's
space only (404 in any other).
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import TaskQueue, TaskRef, Transaction
from marshmallow import EXCLUDE, RAISE, Schema, ValidationError, fields, validate, validates_schema
from quart import Blueprint, Response

from buildmax.access import SpaceAccess
from buildmax.apidoc import api, query_args
from buildmax.auth import Caller
from buildmax.bodies import json_response
from buildmax.clock import to_rfc3339
from buildmax.current import current_buildmax
from buildmax.idempotency import Reply, Work
from buildmax.pagination import older_than, page_body, page_request
from buildmax.problems import NotFound
from buildmax.schemas import Pattern, StrictBoolean, revision_number

from .candidates import FindingIn
from .findings import FINDING_SELECT, resolve
from .tables import DECISIONS, KINDS, activities, findings, integrations, reviews
from .workflow import activity_view, stale

blueprint = Blueprint("reviews", __name__)

ATTEMPT_SCOPE = ("attempt",)
#: Work item states in which nothing more will be recorded on it.
_FINISHED = ("done", "canceled", "failed")
_ID_CHARS = Pattern(r"^[A-Za-z0-9_-]{1,64}$", error="Not a valid id.")


class ReviewBody(Schema):
    """A review to record."""

    class Meta:
        unknown = RAISE

    decision = fields.String(required=True, validate=validate.OneOf(DECISIONS))
    summary = fields.String(load_default="", validate=validate.Length(max=4000))
    findings = fields.List(fields.Nested(FindingIn), load_default=list)
    human = StrictBoolean(load_default=False)
    generation = revision_number(load_default=None)

    @validates_schema
    def _reject_says_why(self, data: dict[str, Any], **_: Any) -> None:
        if data["decision"] == "reject" and not data["summary"].strip():
            raise ValidationError("A rejection says why in its summary.", "summary")


class ResolveBody(Schema):
    """How a finding was resolved."""

    class Meta:
        unknown = RAISE

    resolution = fields.String(load_default="", validate=validate.Length(max=4000))


class ReviewItem(Schema):
    """A work item of the review or integrate stage and what was recorded on it."""

    kind = fields.String()
    task_id = fields.String()
    task_state = fields.String(allow_none=True)
    subject_id = fields.String()
    submission_id = fields.String()
    slot = fields.Integer()
    human_only = fields.Boolean()
    task_revision = fields.Integer()
    stale = fields.Boolean()
    target = fields.String(allow_none=True)
    decision_id = fields.String(allow_none=True)
    review = fields.Dict(allow_none=True)
    integration = fields.Dict(allow_none=True)
    findings = fields.List(fields.Dict())


class ReviewPage(Schema):
    items = fields.List(fields.Nested(ReviewItem))
    next_cursor = fields.String(allow_none=True)


class FindingOut(Schema):
    id = fields.String()
    review_id = fields.String()
    subject_id = fields.String()
    severity = fields.String()
    path = fields.String(allow_none=True)
    line = fields.Integer(allow_none=True)
    text = fields.String()
    resolved = fields.Boolean()
    resolved_at = fields.String(allow_none=True)
    resolved_by = fields.String(allow_none=True)
    resolution = fields.String(allow_none=True)
    created_at = fields.String()


class FindingPage(Schema):
    items = fields.List(fields.Nested(FindingOut))
    next_cursor = fields.String(allow_none=True)


_ITEM_SELECT = (
    sa.select(
        activities,
        reviews.c.public_id.label("review_public_id"),
        reviews.c.reviewer_id,
        reviews.c.reviewer_kind,
        reviews.c.decision,
        reviews.c.summary,
        reviews.c.created_at.label("reviewed_at"),
        integrations.c.public_id.label("integration_public_id"),
        integrations.c.integrator_id,
        integrations.c.outcome,
        integrations.c.before_ref,
        integrations.c.after_ref,
        integrations.c.reason,
        integrations.c.created_at.label("integrated_at"),
    )
    .select_from(
        activities.outerjoin(reviews, reviews.c.activity_id == activities.c.id).outerjoin(
            integrations, integrations.c.activity_id == activities.c.id
        )
    )
    .order_by(activities.c.id.desc())
)


class ReviewListQuery(Schema):
    """The filters of the review and integration work list."""

    class Meta:
        unknown = EXCLUDE  # the page's limit and cursor are read on their own

    kind = fields.String(
        validate=validate.OneOf(KINDS), metadata={"description": "review or integration"}
    )
    subject = fields.String(validate=_ID_CHARS, metadata={"description": "Only work on this task"})
    pending = fields.String(
        validate=validate.OneOf(("true", "false")),
        metadata={"description": "true: nothing recorded yet and the work item still open"},
    )


class FindingListQuery(Schema):
    """The filters of the finding list."""

    class Meta:
        unknown = EXCLUDE

    subject = fields.String(
        validate=_ID_CHARS, metadata={"description": "Only findings on this task's work"}
    )
    review = fields.String(
        validate=_ID_CHARS, metadata={"description": "Only this review's findings"}
    )
    state = fields.String(
        validate=validate.OneOf(("open", "resolved")), metadata={"description": "open or resolved"}
    )


def _finding_view(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row["public_id"],
        "review_id": row["review_public_id"],
        "subject_id": row["subject_task_id"],
        "severity": row["severity"],
        "path": row["path"],
        "line": row["line"],
        "text": row["text"],
        "resolved": row["resolved_at"] is not None,
        "resolved_at": to_rfc3339(row["resolved_at"]) if row["resolved_at"] else None,
        "resolved_by": row["resolved_by"],
        "resolution": row["resolution"],
        "created_at": to_rfc3339(row["created_at"]),
    }


def _open(row: dict[str, Any], task: TaskRef | None) -> bool:
    """Nothing recorded on the work item, and it is still to be done."""
    recorded = row["review_public_id"] or row["integration_public_id"]
    return not recorded and task is not None and task.state not in _FINISHED


def _item_view(
    row: dict[str, Any], work: dict[str, TaskRef], found: list[dict[str, Any]]
) -> dict[str, Any]:
    item = activity_view(row)
    task = work.get(row["work_task_id"])
    subject = work.get(row["subject_task_id"])
    item["task_state"] = task.state if task else None
    # Criteria edited after the submission: a review still to be made is stale.
    item["stale"] = bool(
        row["kind"] == "review" and _open(row, task) and subject is not None and stale(subject, row)
    )
    item["review"] = (
        {
            "id": row["review_public_id"],
            "decision": row["decision"],
            "summary": row["summary"],
            "reviewer_id": row["reviewer_id"],
            "human": row["reviewer_kind"] == "human",
            "created_at": to_rfc3339(row["reviewed_at"]),
        }
        if row["review_public_id"]
        else None
    )
    item["integration"] = (
        {
            "id": row["integration_public_id"],
            "outcome": row["outcome"],
            "before": row["before_ref"],
            "after": row["after_ref"],
            "reason": row["reason"],
            "integrator_id": row["integrator_id"],
            "created_at": to_rfc3339(row["integrated_at"]),
        }
        if row["integration_public_id"]
        else None
    )
    item["findings"] = [_finding_view(f) for f in found]
    return item


async def _render(conn: Transaction, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items with their work items' states and their findings, in two reads."""
    queue = current_buildmax().services.get(TaskQueue)
    ids = {r["work_task_id"] for r in rows} | {r["subject_task_id"] for r in rows}
    work = dict(await queue.tasks(conn, sorted(ids)))
    found: dict[str, list[dict[str, Any]]] = {}
    review_ids = [r["review_public_id"] for r in rows if r["review_public_id"]]
    if review_ids:
        for f in await conn.fetch_all(
            FINDING_SELECT.where(reviews.c.public_id.in_(review_ids)).order_by(findings.c.id)
        ):
            found.setdefault(f["review_public_id"], []).append(dict(f))
    return [_item_view(r, work, found.get(r["review_public_id"], [])) for r in rows]


@blueprint.get("/v1/spaces/<space>/reviews")
@api(
    "List the review and integration work of a space, newest first (viewers)",
    response=ReviewPage,
    query=ReviewListQuery,
    role="viewer",
    action="reviews.read",
    tags=["reviews"],
)
async def list_reviews(access: SpaceAccess) -> Response:
    """Filters: ``kind`` (review, integration), ``subject`` (a task id),
    ``pending=true`` (nothing recorded yet and the work item still open)."""
    app = current_buildmax()
    page = page_request()
    query = _ITEM_SELECT.where(activities.c.space_id == access.pk).limit(page.limit + 1)
    filters = query_args()
    kind = filters.get("kind")
    if kind is not None:
        query = query.where(activities.c.kind == kind)
    subject = filters.get("subject")
    if subject is not None:
        query = query.where(activities.c.subject_task_id == subject)
    pending = filters.get("pending") == "true"
    if pending:
        query = query.where(reviews.c.id.is_(None), integrations.c.id.is_(None))
    if page.after is not None:
        query = query.where(
            activities.c.id
            < sa.select(activities.c.id)
            .where(activities.c.work_task_id == page.after[0])
            .scalar_subquery()
        )
    async with app.db.read() as conn:
        rows = [dict(r) for r in await conn.fetch_all(query)]
        items = await _render(conn, rows[: page.limit])
    if pending:
        # Canceled or failed work items are not pending (a page may come
        # out shorter than ``limit``; the cursor still moves on).
        items = [i for i in items if i["task_state"] not in _FINISHED]
    return json_response(page_body(items, rows, page.limit, lambda r: (r["work_task_id"],)))


async def _own_space(caller: Caller, access: SpaceAccess) -> None:
    """An attempt's token reaches the reviews and findings of its attempt's
    space only: 404 in any other, as if the space did not exist."""
    if caller.actor.scope_type != "attempt":
        return
    app = current_buildmax()
    async with app.db.read() as conn:
        attempt = await app.services.get(TaskQueue).attempt(conn, str(caller.actor.scope_id))
    if attempt is None or attempt.space_id != access.public_id:
        raise NotFound("no such space")


async def _find(conn: Transaction, access: SpaceAccess, ident: str) -> dict[str, Any]:
    """An item by its work item's task id, its review's or its integration's id."""
    query = _ITEM_SELECT.where(
        activities.c.space_id == access.pk,
        sa.or_(
            activities.c.work_task_id == ident,
            reviews.c.public_id == ident,
            integrations.c.public_id == ident,
        ),
    )
    row = await conn.fetch_one(query)
    if row is None:
        raise NotFound("no such review or integration work in this space")
    return dict(row)


@blueprint.get("/v1/spaces/<space>/reviews/<ident>")
@api(
    "Show review or integration work with what was recorded on it (viewers)",
    response=ReviewItem,
    scopes=ATTEMPT_SCOPE,
    role="viewer",
    action="reviews.read",
    tags=["reviews"],
)
async def show_review(ident: str, caller: Caller, access: SpaceAccess) -> Response:
    """By its work item's task id, a review id (``rv_``) or an integration id (``ig_``)."""
    app = current_buildmax()
    await _own_space(caller, access)
    async with app.db.read() as conn:
        row = await _find(conn, access, ident)
        (item,) = await _render(conn, [row])
    return json_response(item)


@blueprint.post("/v1/spaces/<space>/reviews/<ident>")
@api(
    "Record a review on a review work item (its holder; a human may review an unheld one)",
    body=ReviewBody,
    response=ReviewItem,
    status=201,
    scopes=ATTEMPT_SCOPE,
    idempotent=True,
    role="member",
    action="reviews.record",
    tags=["reviews"],
)
async def record_review(
    ident: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]
) -> Work:
    """``ident`` is the review work item's task id. The reviewer who claimed
    the work item hands it in (with the claim's token or the principal's,
    fenced at ``generation`` when given). A human may record a review on an
    unheld work item in this one request: it is claimed and handed in
    together, under the same checks, with no lease to manage. Independence,
    the human slot and stale criteria are checked."""
    task = ident
    app = current_buildmax()
    queue = app.services.get(TaskQueue)
    await _own_space(caller, access)

    async def work(tx: Transaction) -> Reply:
        row = await _find(tx, access, task)
        if row["kind"] != "review" or row["work_task_id"] != task:
            raise NotFound("no such review work item in this space")
        candidate: dict[str, Any] = {
            "decision": data["decision"],
            "findings": [_present(f) for f in data["findings"]],
        }
        if data["human"]:
            candidate["human"] = True
        await queue.hand_in(
            tx,
            task,
            actor=caller.actor,
            summary=data["summary"],
            candidate=candidate,
            generation=data["generation"],
        )
        (item,) = await _render(tx, [await _find(tx, access, task)])
        return Reply(201, item)

    return work


def _present(finding: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in finding.items() if v is not None}


@blueprint.get("/v1/spaces/<space>/findings")
@api(
    "List review findings, newest first (viewers)",
    response=FindingPage,
    query=FindingListQuery,
    scopes=ATTEMPT_SCOPE,
    tags=["reviews"],
    role="viewer",
    action="reviews.read",
)
async def list_findings(caller: Caller, access: SpaceAccess) -> Response:
    """Filters: ``subject`` (the reviewed task), ``review``, ``state``
    (``open`` or ``resolved``)."""
    app = current_buildmax()
    await _own_space(caller, access)
    page = page_request()
    query = (
        FINDING_SELECT.where(findings.c.space_id == access.pk)
        .order_by(findings.c.id.desc())
        .limit(page.limit + 1)
    )
    filters = query_args()
    subject = filters.get("subject")
    if subject is not None:
        query = query.where(findings.c.subject_task_id == subject)
    review = filters.get("review")
    if review is not None:
        query = query.where(reviews.c.public_id == review)
    state = filters.get("state")
    if state is not None:
        resolved = findings.c.resolved_at.is_not(None)
        query = query.where(resolved if state == "resolved" else sa.not_(resolved))
    if page.after is not None:
        query = query.where(older_than(findings, page.after[0]))
    async with app.db.read() as conn:
        rows = [dict(r) for r in await conn.fetch_all(query)]
    items = [_finding_view(r) for r in rows[: page.limit]]
    return json_response(page_body(items, rows, page.limit, lambda r: (r["public_id"],)))


@blueprint.post("/v1/spaces/<space>/findings/<finding>/resolve")
@api(
    "Mark a finding resolved (members; an attempt's token, for its own task's findings)",
    body=ResolveBody,
    response=FindingOut,
    scopes=ATTEMPT_SCOPE,
    idempotent=True,
    role="member",
    action="reviews.resolve",
    tags=["reviews"],
)
async def resolve_finding(
    finding: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]
) -> Work:
    """Resolving twice keeps the first resolution (and answers it)."""
    app = current_buildmax()
    await _own_space(caller, access)

    async def work(tx: Transaction) -> Reply:
        row = await resolve(
            app,
            tx,
            caller.actor,
            access.pk,
            access.public_id,
            finding,
            data["resolution"],
            admin_override=access.admin_override,
        )
        return Reply(200, _finding_view(row))

    return work
