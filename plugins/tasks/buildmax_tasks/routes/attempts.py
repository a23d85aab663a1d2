"""Claims, attempts and submissions.

Claim answers carry a token scoped to the new attempt, shown once: a
replay of the claim (same ``Idempotency-Key``) revokes the unseen token and
answers with a fresh one for the same attempt. Attempt routes accept that
token (for its own attempt only) or the claimant's own token.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from buildmax_hookspecs import Transaction
from quart import Blueprint, Response

from buildmax.access import SpaceAccess, recheck_space
from buildmax.apidoc import api
from buildmax.auth import Caller
from buildmax.bodies import json_response
from buildmax.current import current_buildmax
from buildmax.idempotency import Reply, Work
from buildmax.pagination import page_body, page_request
from buildmax.problems import NotFound

from .. import attempts as ops
from ..attempt_tokens import TOKEN_KIND
from ..change import Change, change
from ..claims import Claim, ClaimFilters, claim_named, claim_next, recover_before_claim
from ..problems import NotAttemptOwner, TaskHeld
from ..records import (
    ATTEMPT_SELECT,
    SUBMISSION_SELECT,
    agent_pk,
    find_project,
    load_attempt,
    task_or_404,
)
from ..rows import AttemptRow, SubmissionRow, TaskRow
from ..schemas import (
    AttemptOut,
    AttemptPage,
    CancelAttemptBody,
    CheckpointBody,
    CheckpointItem,
    CheckpointOut,
    CheckpointPage,
    ClaimBody,
    ClaimNextBody,
    ClaimOut,
    FailBody,
    ReleaseBody,
    RenewBody,
    SubmissionOut,
    SubmissionPage,
    SubmitBody,
    SubmitOut,
)
from ..tables import attempts, submissions
from ..views import attempt_body, submission_body, task_body
from . import caller_authority, lease_ms, render_one, task_children, tasks_state

if TYPE_CHECKING:
    from ..engine import StageEngine

blueprint = Blueprint("tasks_attempts", __name__)
ATTEMPT_SCOPE = ["attempt"]

_CHECKPOINT_OUT = CheckpointOut()
_CHECKPOINT_ITEM = CheckpointItem()


def _claim_body(claim: Claim | None, skipped: int, engine: StageEngine) -> dict[str, Any]:
    """A claim's answer: the task, the attempt and its run token (or no task)."""
    if claim is None:
        return {"task": None, "attempt": None, "token": None, "token_id": None, "skipped": skipped}
    return {
        # The claim checked that no hold or decision parks the task.
        "task": task_body(claim.task, [], [], engine),
        "attempt": attempt_body(claim.attempt),
        "token": claim.token,
        "token_id": claim.token_id,
        "skipped": skipped,
    }


def _claim_reply(body: dict[str, Any], status: int) -> Reply:
    secret = body["token"] is not None
    return Reply(
        status,
        body,
        secret_field="token" if secret else None,
        secret_kind=TOKEN_KIND if secret else None,
    )


@blueprint.post("/v1/spaces/<space>/tasks/<task>/claim")
@api(
    "Claim a task (members): an attempt with a lease and a token scoped to it",
    body=ClaimBody,
    response=ClaimOut,
    status=201,
    idempotent=True,
    role="member",
    action="tasks.claim",
    tags=["claims"],
)
async def claim(task: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """409 when another attempt holds it or a resource it needs is reserved
    (the holder is named), 403 when a hold or a claim check refuses, 422
    when the run environment cannot be resolved."""
    app = current_buildmax()
    lease = lease_ms(tasks_state(app).settings, data["lease_seconds"])
    await recover_before_claim(app, caller, access, task)

    async def work(tx: Transaction) -> Reply:
        await recheck_space(tx, access, caller, "member")  # the body took its time
        ch = change(app, tx, caller, access)
        made = await claim_named(ch, caller.principal_pk, task, lease)
        return _claim_reply(_claim_body(made, 0, tasks_state(app).engine), 201)

    return work


@blueprint.post("/v1/spaces/<space>/claims")
@api(
    "Claim the next ready task matching the filters (members)",
    body=ClaimNextBody,
    response=ClaimOut,
    status=201,
    also={200: "Nothing is claimable: task, attempt, token and token_id are null"},
    idempotent=True,
    role="member",
    action="tasks.claim",
    tags=["claims"],
)
async def claim_next_route(caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """201 with the claim; 200 with ``task: null`` when nothing is claimable.
    ``skipped`` counts candidates passed over (vetoed, resource reserved,
    run environment unresolved)."""
    app = current_buildmax()
    state = tasks_state(app)
    lease = lease_ms(state.settings, data["lease_seconds"])

    async def work(tx: Transaction) -> Reply:
        await recheck_space(tx, access, caller, "member")  # the body took its time
        ch = change(app, tx, caller, access)
        filters = ClaimFilters(
            project_pk=(await find_project(tx, access.pk, data["project"])).pk
            if data["project"]
            else None,
            kind=data["kind"],
            label=data.get("label"),
            agent_pk=await agent_pk(tx, access.pk, data["agent"]),
        )
        made, skipped = await claim_next(
            ch, caller.principal_pk, filters, lease, state.settings.claim_scan_limit
        )
        return _claim_reply(
            _claim_body(made, skipped, tasks_state(app).engine), 201 if made else 200
        )

    return work


Operation = Callable[[Change, AttemptRow, TaskRow, dict[str, Any]], Awaitable[Reply]]


def _on_attempt(
    caller: Caller,
    access: SpaceAccess,
    data: dict[str, Any],
    attempt: str,
    operation: Operation,
    *,
    allow_lapsed: bool = False,
) -> Work:
    """The work of a report on an attempt: fence the attempt, then run
    ``operation`` in the same write transaction."""
    app = current_buildmax()
    authority = caller_authority(access, caller, data.get("override_reason"))
    if authority.scope_id is not None and authority.scope_id != attempt:
        # Refused before the idempotency layer, which would otherwise replay
        # the principal's stored answer for that other attempt.
        raise NotAttemptOwner("this token is scoped to another attempt")

    async def work(tx: Transaction) -> Reply:
        ch = change(app, tx, caller, access)
        row, task = await ops.fenced(
            ch, attempt, data["generation"], authority, allow_lapsed=allow_lapsed
        )
        return await operation(ch, row, task, data)

    return work


@blueprint.post("/v1/spaces/<space>/attempts/<attempt>/renew")
@api(
    "Renew an attempt's lease, with optional progress (the owner)",
    body=RenewBody,
    response=AttemptOut,
    scopes=ATTEMPT_SCOPE,
    role="member",
    action="tasks.attempt.renew",
    idempotent=True,
    tags=["attempts"],
)
async def renew(attempt: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """The lease runs ``lease_seconds`` (default: the configured lease) from
    now. A stopped hold refuses renewals (403); the lapse that follows is not
    charged against the task's attempts."""
    app = current_buildmax()

    async def operation(ch: Change, row: AttemptRow, task: TaskRow, data: dict[str, Any]) -> Reply:
        lease = lease_ms(tasks_state(app).settings, data["lease_seconds"])
        try:
            updated = await ops.renew(ch, row, task, lease, data["progress"])
        except TaskHeld:
            ch.tx.after_rollback(remember_refusal)
            raise
        return Reply(200, attempt_body(updated))

    async def remember_refusal() -> None:
        # In a transaction of its own: the refused renewal changed nothing else.
        async with app.db.write() as tx:
            await ops.mark_hold_refused(
                change(app, tx, caller, access), attempt, data["generation"]
            )

    return _on_attempt(caller, access, data, attempt, operation)


@blueprint.post("/v1/spaces/<space>/attempts/<attempt>/checkpoint")
@api(
    "Record a checkpoint (the owner)",
    body=CheckpointBody,
    response=CheckpointOut,
    status=201,
    scopes=ATTEMPT_SCOPE,
    role="member",
    action="tasks.attempt.update",
    idempotent=True,
    tags=["attempts"],
)
async def checkpoint(
    attempt: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]
) -> Work:
    """Checkpoints are kept in order; ``data`` is any JSON value."""

    async def operation(ch: Change, row: AttemptRow, task: TaskRow, data: dict[str, Any]) -> Reply:
        made = await ops.checkpoint(ch, row, data["data"])
        return Reply(
            201,
            _CHECKPOINT_OUT.dump(
                {"attempt_id": row.id, "number": made["number"], "created_at": ch.now}
            ),
        )

    return _on_attempt(caller, access, data, attempt, operation)


def _give_up(
    caller: Caller, access: SpaceAccess, data: dict[str, Any], attempt: str, state: str
) -> Work:
    async def operation(ch: Change, row: AttemptRow, task: TaskRow, data: dict[str, Any]) -> Reply:
        await ops.give_up(ch, row, task, state, data.get("reason"))
        fresh = await load_attempt(ch.tx, row.id)
        assert fresh is not None
        return Reply(200, attempt_body(fresh))

    return _on_attempt(caller, access, data, attempt, operation, allow_lapsed=state == "canceled")


@blueprint.post("/v1/spaces/<space>/attempts/<attempt>/release")
@api(
    "Release an attempt: the task goes back to the queue (the owner)",
    body=ReleaseBody,
    response=AttemptOut,
    scopes=ATTEMPT_SCOPE,
    role="member",
    action="tasks.attempt.update",
    idempotent=True,
    tags=["attempts"],
)
async def release(attempt: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """Not charged against the task's attempts."""
    return _give_up(caller, access, data, attempt, "released")


@blueprint.post("/v1/spaces/<space>/attempts/<attempt>/fail")
@api(
    "Fail an attempt (the owner); the task fails once its attempts are spent",
    body=FailBody,
    response=AttemptOut,
    scopes=ATTEMPT_SCOPE,
    role="member",
    action="tasks.attempt.update",
    idempotent=True,
    tags=["attempts"],
)
async def fail(attempt: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """Charged against ``max_attempts``; otherwise the task is ready again."""
    return _give_up(caller, access, data, attempt, "failed")


@blueprint.post("/v1/spaces/<space>/attempts/<attempt>/cancel")
@api(
    "Cancel an attempt (the owner, or a space admin with override_reason)",
    body=CancelAttemptBody,
    response=AttemptOut,
    scopes=ATTEMPT_SCOPE,
    role="member",
    action="tasks.attempt.cancel",
    idempotent=True,
    tags=["attempts"],
)
async def cancel(attempt: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """Terminal for the attempt (later reports are refused); the task is ready again."""
    return _give_up(caller, access, data, attempt, "canceled")


@blueprint.post("/v1/spaces/<space>/attempts/<attempt>/submit")
@api(
    "Hand in the attempt's work (the owner)",
    body=SubmitBody,
    response=SubmitOut,
    status=201,
    scopes=ATTEMPT_SCOPE,
    role="member",
    action="tasks.attempt.update",
    idempotent=True,
    tags=["attempts"],
)
async def submit(attempt: str, caller: Caller, access: SpaceAccess, data: dict[str, Any]) -> Work:
    """Accepted under a stopped hold, so finished work is not lost. With no
    workflow stage loaded the task is done; otherwise it waits while the
    first stage's linked work is created."""
    app = current_buildmax()

    async def operation(ch: Change, row: AttemptRow, task: TaskRow, data: dict[str, Any]) -> Reply:
        submission, outcome = await ops.submit(ch, tasks_state(app).engine, row, task, data)
        access_task = await task_or_404(ch.tx, ch.space_pk, task.id)
        return Reply(
            201,
            {
                "submission": submission_body(submission),
                "task": await render_one(ch.tx, access_task, ch.now),
                "stage": outcome.get("stage"),
                "work_ids": outcome.get("work_ids", []),
            },
        )

    return _on_attempt(caller, access, data, attempt, operation)


@blueprint.get("/v1/spaces/<space>/attempts/<attempt>")
@api(
    "Show an attempt (viewers; its own token too)",
    response=AttemptOut,
    scopes=ATTEMPT_SCOPE,
    role="viewer",
    action="tasks.read",
    tags=["attempts"],
)
async def show(attempt: str, caller: Caller, access: SpaceAccess) -> Response:
    """With its lease, run environment and last progress."""
    app = current_buildmax()
    if caller.actor.scope_type == "attempt" and caller.actor.scope_id != attempt:
        raise NotAttemptOwner("this token is scoped to another attempt")
    async with app.db.read() as conn:
        row = await load_attempt(conn, attempt, space_pk=access.pk)
    if row is None:
        raise NotFound("no such attempt in this space")
    return json_response(attempt_body(row))


@blueprint.get("/v1/spaces/<space>/attempts/<attempt>/checkpoints")
@api(
    "An attempt's checkpoints, newest first (viewers; its own token too)",
    response=CheckpointPage,
    scopes=ATTEMPT_SCOPE,
    role="viewer",
    action="tasks.read",
    tags=["attempts"],
)
async def list_checkpoints(attempt: str, caller: Caller, access: SpaceAccess) -> Response:
    """Each with its number and the JSON value its owner recorded."""
    app = current_buildmax()
    if caller.actor.scope_type == "attempt" and caller.actor.scope_id != attempt:
        raise NotAttemptOwner("this token is scoped to another attempt")
    page = page_request(key_types=(int,))
    async with app.db.read() as conn:
        row = await load_attempt(conn, attempt, space_pk=access.pk)
        if row is None:
            raise NotFound("no such attempt in this space")
        before = int(page.after[0]) if page.after is not None else None
        rows = await ops.checkpoints_of(conn, row.pk, page.limit + 1, before)
    items = [_CHECKPOINT_ITEM.dump(r) for r in rows]
    return json_response(page_body(items, rows, page.limit, lambda r: (r["number"],)))


@blueprint.get("/v1/spaces/<space>/tasks/<task>/attempts")
@api(
    "A task's attempts, by generation (viewers)",
    response=AttemptPage,
    role="viewer",
    action="tasks.read",
    tags=["attempts"],
)
async def list_attempts(task: str, access: SpaceAccess) -> Response:
    """Every attempt, ended ones included."""
    return await task_children(
        access,
        task,
        lambda pk: ATTEMPT_SELECT.where(attempts.c.task_id == pk),
        attempts.c.generation,
        lambda row: attempt_body(AttemptRow.of(row)),
    )


@blueprint.get("/v1/spaces/<space>/tasks/<task>/submissions")
@api(
    "A task's submissions, oldest first (viewers)",
    response=SubmissionPage,
    role="viewer",
    action="tasks.read",
    tags=["attempts"],
)
async def list_submissions(task: str, access: SpaceAccess) -> Response:
    """Submissions are immutable."""
    return await task_children(
        access,
        task,
        lambda pk: SUBMISSION_SELECT.where(submissions.c.task_id == pk),
        submissions.c.generation,  # one submission per attempt, so unique per task
        lambda row: submission_body(SubmissionRow.of(row)),
    )


@blueprint.get("/v1/spaces/<space>/submissions/<submission>")
@api(
    "Show a submission (viewers)",
    response=SubmissionOut,
    tags=["attempts"],
    role="viewer",
    action="tasks.read",
)
async def show_submission(submission: str, access: SpaceAccess) -> Response:
    """The immutable candidate an attempt handed in."""
    app = current_buildmax()
    async with app.db.read() as conn:
        row = await conn.fetch_one(
            SUBMISSION_SELECT.where(
                submissions.c.public_id == submission, attempts.c.space_id == access.pk
            )
        )
    if row is None:
        raise NotFound("no such submission in this space")
    return json_response(submission_body(SubmissionRow.of(row)))
