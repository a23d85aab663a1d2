"""The in-process API (``buildmax.internal``): how a plugin reads another
plugin's views and performs its operations as its own caller.

A throwaway "board" plugin serves two routes the way a dashboard or an MCP
tool would: a board of ready work read through the tasks plugin's list
route, and "take the next task" performed through its claim route. It
imports nothing of the tasks plugin and touches none of its tables; the
API's role checks, idempotency and audit apply to the caller.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_hookspecs import hookimpl
from buildmax_tasks.tables import attempts
from quart import Blueprint, Response, request

from buildmax.apidoc import api
from buildmax.app import create_app
from buildmax.auth import Caller
from buildmax.bodies import json_response
from buildmax.current import current_buildmax
from buildmax.database.base import NestedTransactionError
from buildmax.internal import InternalApi
from buildmax.problems import Problem
from buildmax.tables import tokens

from .conftest import PROBLEM

board = Blueprint("board", __name__)


@board.get("/v1/spaces/<space>/board")
@api("The space's ready work, as you may see it", tags=["board"])
async def show_board(space: str, caller: Caller) -> Response:
    """The space's ready work, every page of it, as the caller may see it."""
    internal = InternalApi(current_buildmax(), caller)
    ready = [task async for task in internal.paginate(f"/v1/spaces/{space}/ready", {"limit": "1"})]
    return json_response({"ready": [task["id"] for task in ready]})


@board.post("/v1/spaces/<space>/board/take")
@api(
    "Claim the next ready task for you",
    status=201,
    not_idempotent="the claim it makes honours the Idempotency-Key it passes on",
    tags=["board"],
)
async def take(space: str, caller: Caller) -> Response:
    """Claim the next ready task for the caller: a declared view calling an
    idempotent route in process, whose work the kernel runs for that
    request (the view's own request is still running)."""
    internal = InternalApi(current_buildmax(), caller)
    claimed = await internal.request(
        "POST",
        f"/v1/spaces/{space}/claims",
        json={},
        idempotency_key=request.headers.get("Idempotency-Key"),
    )
    return json_response({"task": claimed["task"]["id"], "attempt": claimed["attempt"]["id"]}, 201)


class Board:
    @hookimpl
    def buildmax_blueprints(self) -> list[Blueprint]:
        return [board]


@pytest.fixture
async def app(buildmax_settings, clock):
    application = create_app(
        buildmax_settings, clock=clock, extra_plugins=[("board", Board())], auto_migrate=True
    )
    async with application.test_app():
        yield application


async def token_pk(app: Any, principal_pk: int) -> int:
    async with app.db.read() as conn:
        return int(
            await conn.fetch_val(
                sa.select(tokens.c.id).where(tokens.c.principal_id == principal_pk)
            )
        )


async def test_the_board_reads_every_page_of_the_list_route_as_the_caller(work):
    made = [await work.task(f"task {n}") for n in range(3)]
    listed = await work.call("GET", "/board", work.viewer, expect=200)
    direct = await work.call("GET", "/ready", work.viewer, expect=200)
    assert sorted(listed["ready"]) == sorted(t["id"] for t in made)
    assert listed["ready"] == [t["id"] for t in direct["items"]]


async def test_a_caller_the_api_refuses_is_refused_by_the_board_with_the_same_problem(
    work, make_principal
):
    outsider = await make_principal("agent")
    direct = await work.call("GET", "/ready", outsider)
    shown = await work.call("GET", "/board", outsider)
    assert shown["type"] == direct["type"] and shown["status"] == direct["status"] >= 403
    assert shown["detail"] == direct["detail"]


async def test_take_claims_as_the_caller_under_the_apis_checks_and_audit(work, audit_log):
    task = await work.task()
    refused = await work.call("POST", "/board/take", work.viewer, expect=403)
    assert refused["type"].startswith(PROBLEM)
    assert await work.rows(attempts) == []

    taken = await work.call("POST", "/board/take", work.agent, expect=201, key="take-1")
    again = await work.call("POST", "/board/take", work.agent, expect=201, key="take-1")
    assert taken == again and taken["task"] == task["id"]
    (attempt,) = await work.rows(attempts)
    assert (attempt["public_id"], attempt["claimant_id"]) == (taken["attempt"], work.agent.pk)
    (event,) = audit_log.of("task.claimed")
    assert event.actor_id == work.agent.id


async def test_a_background_job_acts_as_a_caller_whose_token_is_checked_again(work):
    await work.task()
    app = work.app
    caller = Caller(
        actor=None,  # type: ignore[arg-type]  # rebuilt from the token as it stands
        principal_pk=work.agent.pk,
        token_pk=await token_pk(app, work.agent.pk),
    )
    api = InternalApi(app, caller)
    page = await api.get(f"/v1/spaces/{work.space.id}/ready")
    assert len(page["items"]) == 1
    async with app.db.write() as tx:
        await tx.execute(
            sa.update(tokens).where(tokens.c.id == caller.token_pk).values(revoked_at=1)
        )
    with pytest.raises(Problem) as refused:
        await api.request("POST", f"/v1/spaces/{work.space.id}/claims", json={})
    assert (refused.value.status, refused.value.slug) == (401, "unauthenticated")
    assert await work.rows(attempts) == []


async def test_it_refuses_to_run_inside_a_write_transaction(work):
    app = work.app
    caller = Caller(
        actor=None,  # type: ignore[arg-type]
        principal_pk=work.agent.pk,
        token_pk=await token_pk(app, work.agent.pk),
    )
    async with app.db.write():
        with pytest.raises(NestedTransactionError):
            await InternalApi(app, caller).get(f"/v1/spaces/{work.space.id}/ready")


@pytest.mark.parametrize("change", ["disabled", "expired", "demoted"])
async def test_the_caller_is_taken_as_it_stands_at_each_call(work, make_principal, change):
    """A disabled principal or an expired token is 401; a system admin
    demoted since the caller was made no longer reads a space it is not a
    member of."""
    from buildmax.tables import principals

    admin = await make_principal("human", system_role="admin")
    app = work.app
    caller = Caller(
        actor=None,  # type: ignore[arg-type]
        principal_pk=admin.pk,
        token_pk=await token_pk(app, admin.pk),
    )
    api = InternalApi(app, caller)
    assert (await api.get(f"/v1/spaces/{work.space.id}/ready"))["items"] == []
    async with app.db.write() as tx:
        if change == "disabled":
            await tx.execute(
                sa.update(principals).where(principals.c.id == admin.pk).values(disabled_at=1)
            )
        elif change == "expired":
            await tx.execute(
                sa.update(tokens).where(tokens.c.id == caller.token_pk).values(expires_at=1)
            )
        else:
            await tx.execute(
                sa.update(principals).where(principals.c.id == admin.pk).values(system_role=None)
            )
    with pytest.raises(Problem) as refused:
        await api.get(f"/v1/spaces/{work.space.id}/ready")
    assert refused.value.status == (404 if change == "demoted" else 401)


async def test_a_key_no_header_can_carry_is_the_routes_400_and_a_page_that_is_not_json_is_refused(
    work,
):
    await work.task()
    bad = await work.call("POST", "/board/take", work.agent, key="clé-ünïcode")
    assert (bad["status"], bad["type"]) == (400, PROBLEM + "bad-request")
    app = work.app
    caller = Caller(
        actor=None,  # type: ignore[arg-type]
        principal_pk=work.agent.pk,
        token_pk=await token_pk(app, work.agent.pk),
    )
    with pytest.raises(Problem) as beyond:
        await InternalApi(app, caller).request(
            "POST", f"/v1/spaces/{work.space.id}/claims", json={}, idempotency_key="→"
        )
    assert (beyond.value.status, beyond.value.slug) == (400, "bad-request")
    with pytest.raises(ValueError, match="JSON routes only"):
        await InternalApi(app, caller).get("/docs")
    assert await work.rows(attempts) == []


async def test_a_path_that_would_reach_another_route_is_404(work):
    """A dot segment (the HTTP client folds it away) or an encoded ``/``
    (the router decodes it) in an in-process path would name another
    route than the caller meant: refused, for every in-process caller."""
    task = await work.task()
    app = work.app
    caller = Caller(
        actor=None,  # type: ignore[arg-type]
        principal_pk=work.agent.pk,
        token_pk=await token_pk(app, work.agent.pk),
    )
    api = InternalApi(app, caller)
    base = f"/v1/spaces/{work.space.id}"
    assert (await api.get(f"{base}/tasks/{task['id']}"))["id"] == task["id"]
    for path in (
        f"{base}/tasks/..",
        f"{base}/tasks/.",
        f"{base}/tasks/%2e%2E",
        f"{base}/tasks/{task['id']}%2Fdependencies",
        f"{base}/tasks/{task['id']}%5cx",
    ):
        with pytest.raises(Problem) as refused:
            await api.get(path)
        assert (refused.value.status, refused.value.slug) == (404, "not-found"), path
        with pytest.raises(Problem):
            async with api.stream(path):
                pass
