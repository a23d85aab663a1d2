"""Every mutating route honours ``Idempotency-Key``, or its declaration says
why it cannot; the routes that did not before replay their first answer,
create and audit nothing twice, and refuse a concurrent duplicate (409).

(The streamed uploads have their own tests: plugins/artifacts/tests/
test_idempotent_upload.py and plugins/marketplace/tests/
test_idempotent_publish.py.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_artifacts.tables import artifacts

from buildmax.declaration import route_doc
from buildmax.spaces import put_member
from buildmax.tables import space_members, spaces

MUTATING = {"POST", "PUT", "PATCH", "DELETE"}
API_GUIDE = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def _mutating_routes(app: Any) -> list[tuple[str, str, Any]]:
    """The API's mutating routes. The dashboard's forms under ``/ui/`` are
    not API routes: a browser posts them with a CSRF token (the dashboard's
    tests walk them for it) and each performs an API route in-process."""
    found = []
    for rule in app.url_map.iter_rules():
        if rule.rule.startswith("/ui/"):
            continue
        for method in sorted((rule.methods or set()) & MUTATING):
            found.append((method, rule.rule, route_doc(app.view_functions[rule.endpoint])))
    return found


@pytest.mark.engine_independent
def test_every_mutating_route_honours_the_key_or_says_why_not(app) -> None:
    routes = _mutating_routes(app)
    assert len(routes) > 40, "the route table walk found too few mutating routes"
    silent = [
        f"{m} {path}"
        for m, path, doc in routes
        if doc is None or not (doc.idempotent or doc.not_idempotent)
    ]
    assert silent == []
    guide = API_GUIDE.read_text(encoding="utf-8")
    shipped = [
        (m, path)
        for m, path, doc in routes
        if doc is not None and doc.not_idempotent and "testplugin" not in path
    ]
    assert {(m, path.replace("<", "{").replace(">", "}")) for m, path in shipped} == {
        ("POST", "/v1/sessions"),
        ("DELETE", "/v1/sessions/current"),
        ("POST", "/mcp"),
    }
    for m, path in shipped:
        assert f"`{m} {path.replace('<', '{').replace('>', '}')}`" in guide, (m, path)


@dataclass
class Case:
    """One formerly missing route: how to call it, and the table to hold."""

    method: str
    path: str
    body: Any
    table: sa.Table
    action: str


@pytest.fixture
async def world(app, client, make_principal, make_space) -> dict[str, Any]:
    owner = await make_principal("human")
    member = await make_principal("agent")
    newcomer = await make_principal("agent")
    space = await make_space(owner)
    async with app.db.write() as tx:
        await put_member(tx, space.pk, member.pk, "member", app.clock.now_ms())
    made = await client.post(
        f"/v1/spaces/{space.id}/artifacts",
        data=b"bytes",
        headers={**owner.headers, "Content-Type": "text/plain"},
        query_string={"name": "a.txt"},
    )
    assert made.status_code == 201
    artifact = (await made.get_json())["id"]
    base = f"/v1/spaces/{space.id}"
    kept = await client.post(
        f"/v1/spaces/{space.id}/artifacts",
        data=b"kept",
        headers={**owner.headers, "Content-Type": "text/plain"},
        query_string={"name": "kept.txt"},
    )
    pinned = (await kept.get_json())["id"]
    assert (
        await client.post(f"{base}/artifacts/{pinned}/pin", headers=owner.headers)
    ).status_code == 200
    return {
        "owner": owner,
        "space": space,
        "cases": {
            "pin": Case(
                "POST", f"{base}/artifacts/{artifact}/pin", None, artifacts, "artifact.pinned"
            ),
            "unpin": Case(
                "POST", f"{base}/artifacts/{pinned}/unpin", None, artifacts, "artifact.unpinned"
            ),
            "delete artifact": Case(
                "DELETE", f"{base}/artifacts/{artifact}", None, artifacts, "artifact.deleted"
            ),
            "add member": Case(
                "PUT",
                f"{base}/members/{newcomer.id}",
                {"role": "member"},
                space_members,
                "space.member.added",
            ),
            "remove member": Case(
                "DELETE", f"{base}/members/{member.id}", None, space_members, "space.member.removed"
            ),
            "rename space": Case("PATCH", base, {"name": "Renamed"}, spaces, "space.updated"),
        },
    }


CASES = ["pin", "unpin", "delete artifact", "add member", "remove member", "rename space"]


async def _send(client: Any, case: Case, headers: dict[str, str]) -> Any:
    kwargs: dict[str, Any] = {"headers": headers}
    if case.body is not None:
        kwargs["json"] = case.body
    return await getattr(client, case.method.lower())(case.path, **kwargs)


@pytest.mark.parametrize("name", CASES)
async def test_a_retry_with_the_key_replays_and_does_nothing_twice(
    world, client, audit_log, name
) -> None:
    case = world["cases"][name]
    headers = {**world["owner"].headers, "Idempotency-Key": f"k-{name.replace(' ', '-')}"}
    first = await _send(client, case, headers)
    again = await _send(client, case, headers)
    assert first.status_code in (200, 204) and again.status_code == first.status_code
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert await again.get_data() == await first.get_data()
    assert len(audit_log.of(case.action)) == 1


@contextlib.asynccontextmanager
async def _writes_held(app: Any, table: sa.Table) -> AsyncIterator[None]:
    """Hold ``table`` (on SQLite, the writer) in a transaction of the test's,
    so a request writing to it waits inside its own."""
    async with app.db.write() as tx:
        if tx.dialect == "postgresql":
            await tx.execute(sa.text(f"LOCK TABLE {table.name} IN SHARE ROW EXCLUSIVE MODE"))
        else:
            await tx.execute(sa.update(spaces).where(spaces.c.id == -1).values(name="x"))
        yield


@pytest.mark.parametrize("name", CASES)
async def test_a_concurrent_duplicate_is_409_or_waits_and_the_first_completes(
    app, world, client, audit_log, name
) -> None:
    """A repeat while the first runs: 409 at once on PostgreSQL; on SQLite,
    where mutating handlers are admitted one at a time, it waits for the
    first and replays its answer. The change is made once either way."""
    case = world["cases"][name]
    headers = {**world["owner"].headers, "Idempotency-Key": f"dup-{name.replace(' ', '-')}"}
    postgres = app.db.dialect == "postgresql"
    async with _writes_held(app, case.table):
        first = asyncio.create_task(_send(client, case, headers))
        await asyncio.sleep(0.3)  # the first is waiting inside its transaction
        duplicate = asyncio.create_task(_send(client, case, headers))
        done, _ = await asyncio.wait({duplicate}, timeout=0.5 if postgres else 0.2)
        assert bool(done) == postgres, "the duplicate ran beside the first" if done else ""
    answer, original = await duplicate, await first
    assert original.status_code in (200, 204)
    if postgres:
        assert answer.status_code == 409
        assert (await answer.get_json())["type"] == "urn:buildmax:problem:idempotency-in-progress"
    else:
        assert answer.status_code == original.status_code
        assert answer.headers["Idempotent-Replayed"] == "true"
    assert len(audit_log.of(case.action)) == 1
