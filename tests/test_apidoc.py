"""The OpenAPI document says what the server does, by construction.

Every path of the document answers ``OPTIONS`` with exactly the methods the
document lists for it (no undocumented method behind a documented path, no
two templates of one shape); a route keeps idempotency receipts only if it
declares ``idempotent=True`` (which is what puts ``Idempotency-Key`` in the
document); a route that reads a query or header schema answers 422 naming
what it refused.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_hookspecs import Transaction, hookimpl
from quart import Blueprint, Response

from buildmax.apidoc import api
from buildmax.app import create_app
from buildmax.auth import Caller
from buildmax.current import current_buildmax
from buildmax.idempotency import Reply, Work
from buildmax.tables import idempotency_receipts, sign_in_failures

_PARAM = re.compile(r"\{[^}]+\}")


async def test_every_documented_path_allows_exactly_its_documented_methods(client):
    """Catches a method the server serves on a documented path but the
    document leaves out (``PATCH /v1/principals/me`` was served by
    ``/v1/principals/{ref}``; ``GET`` and ``POST /reviews/...`` were two
    templates of one path with different parameter names)."""
    document = await (await client.get("/v1/openapi.json")).get_json()
    failures = []
    for path, operations in document["paths"].items():
        documented = {method.upper() for method in operations}
        if "GET" in documented:
            documented.add("HEAD")
        documented.add("OPTIONS")
        concrete = _PARAM.sub("x1", path)
        answer = await client.options(concrete)
        allowed = {m.strip() for m in answer.headers.get("Allow", "").split(",") if m.strip()}
        if allowed != documented:
            failures.append(f"{path}: Allow {sorted(allowed)}, documented {sorted(documented)}")
    shapes: dict[str, str] = {}
    for path in document["paths"]:
        other = shapes.setdefault(_PARAM.sub("{}", path), path)
        if other != path:
            failures.append(f"{path} and {other} are one path with two templates")
    assert not failures, "\n".join(failures)


def _patterns(node: object) -> list[str]:
    if isinstance(node, dict):
        found = [node["pattern"]] if isinstance(node.get("pattern"), str) else []
        return found + [p for value in node.values() for p in _patterns(value)]
    if isinstance(node, list):
        return [p for value in node for p in _patterns(value)]
    return []


async def test_every_pattern_is_portable_and_matched_in_full(client, admin):
    """The document's patterns are what JSON Schema (ECMA 262) reads, anchored
    with ``^`` and ``$``, and the server matches them in full: ``$`` lets no
    trailing newline through. Catches Python-only syntax (``\\Z`` is a
    literal ``Z`` to a JavaScript client) and a ``Pattern`` that matches
    from the start only."""
    document = await (await client.get("/v1/openapi.json")).get_json()
    patterns = _patterns(document)
    assert len(patterns) >= 10
    python_only = ("\\Z", "\\A", "(?P", "(?i", "(?s", "(?m", "(?x")
    bad = [p for p in patterns if not (p.startswith("^") and p.endswith("$"))]
    bad += [p for p in patterns if any(token in p for token in python_only)]
    assert bad == []
    refused = await client.post(
        "/v1/principals", json={"kind": "agent", "name": "trailing\n"}, headers=admin.headers
    )
    assert refused.status_code == 422
    assert "name" in (await refused.get_json())["errors"]


blueprint = Blueprint("undeclared_receipts", __name__)


@blueprint.post("/v1/undeclared-receipts")
@api("Keeps receipts without declaring it")
async def undeclared() -> Work:
    """Returns work for the idempotency layer although its declaration says nothing."""

    async def work(tx: Transaction) -> Reply:
        return Reply(200, {"ok": True})

    return work


@blueprint.post("/v1/self-run-receipts")
@api("Declares receipts and runs its own work, as views did before", idempotent=True)
async def self_run(caller: Caller) -> Response:
    """Writes a row through the idempotency layer itself."""

    async def work(tx: Transaction) -> Reply:
        await tx.execute(sign_in_failures.insert().values(name="self-run", address="x", at=1))
        return Reply(200, {"ok": True})

    return await current_buildmax().idempotency.run(caller, work)


@blueprint.post("/v1/workless-receipts")
@api("Declares receipts and answers itself", idempotent=True)
async def workless() -> Response:
    """Answers without handing the kernel its work, so no receipt is kept."""
    return Response(status=204)


class UndeclaredReceipts:
    @hookimpl
    def buildmax_blueprints(self, app):
        return [blueprint]


async def _post_to_probes(settings, caller, path: str, caplog) -> Any:
    """POST ``path`` with a key, as ``caller``, to an app that serves the
    probe routes above; errors are captured from the log."""
    other = create_app(settings, extra_plugins=[("undeclared", UndeclaredReceipts())])
    caplog.set_level(logging.ERROR)
    async with other.test_app():
        return await other.test_client().post(
            path, headers={**caller.headers, "Idempotency-Key": "k-1"}
        )


@pytest.mark.engine_independent
async def test_a_route_keeps_receipts_only_where_it_declares_so(
    buildmax_settings, make_principal, caplog
):
    """A route that calls the idempotency layer without ``idempotent=True``
    is a server bug, reported as one (500, logged) on its first request, so
    it cannot ship with a header the document does not show. Catches the
    check in ``Idempotency.run`` removed (the undeclared route answers 200)."""
    caller = await make_principal("agent")  # in the database the app fixture migrated
    answer = await _post_to_probes(buildmax_settings, caller, "/v1/undeclared-receipts", caplog)
    assert answer.status_code == 500
    assert "not declared idempotent" in caplog.text


@pytest.mark.engine_independent
async def test_an_idempotent_route_hands_its_work_to_the_kernel(
    buildmax_settings, make_principal, caplog
):
    """A route declared idempotent that answers by itself would ignore the
    key it advertises: a server bug, reported as one (500, logged). Catches
    the check in ``api`` removed (the route answers 204)."""
    caller = await make_principal("agent")
    answer = await _post_to_probes(buildmax_settings, caller, "/v1/workless-receipts", caplog)
    assert answer.status_code == 500
    assert "is idempotent but returned no work" in caplog.text


@pytest.mark.engine_independent
async def test_a_view_that_runs_its_own_work_is_refused_before_it_writes(
    app, buildmax_settings, make_principal, caplog
):
    """A plugin view written to run its work itself (``idempotency.run``)
    would commit the work, keep a receipt and then fail on the kernel's
    run: it is refused before anything is written (500, logged, no row, no
    receipt). Catches the guard in ``Idempotency.run`` removed (the row and
    the receipt are written)."""
    caller = await make_principal("agent")
    answer = await _post_to_probes(buildmax_settings, caller, "/v1/self-run-receipts", caplog)
    assert answer.status_code == 500
    assert "runs its own work" in caplog.text
    async with app.db.read() as conn:
        rows = await conn.fetch_all(sa.select(sign_in_failures.c.id))
        receipts = await conn.fetch_all(sa.select(idempotency_receipts.c.id))
    assert rows == []
    assert receipts == []
