"""The statement budget of each hot operation, on each engine, with every
installed plugin loaded (the first-party set: the claim checks, the run
environment, reviews, artifacts and the audit trail all join these paths).

Each operation runs once to warm the caches (compiled and prepared
statements, the token's last-used time), then once more while every
statement the app sends is counted (:mod:`buildmax.testing.statements`;
on PostgreSQL each is a round trip). The count must equal the budget
below: a change that adds a statement to a hot path fails here and raises
the budget on purpose, saying why in its commit; one that saves a
statement lowers it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from buildmax.config import Config
from buildmax.spaces import put_member
from buildmax.testing import PrincipalHandle, SpaceHandle, call
from buildmax.testing.statements import StatementLog, watching_statements

#: Statements per operation, by engine, measured on the first-party plugin
#: set. Raise one only on purpose, with the reason in the commit. A claim
#: in a project with no lesson reads none (the lessons plugin remembers it);
#: with one, it reads the lessons to offer (one statement). A submission
#: carrying a lesson writes it: its row, its revision, its index entry and
#: its space's key (four; its audit event joins the submission's). On
#: PostgreSQL publishing events is one statement in the transaction (into
#: the outbox, no lock) and one after its commit (the sequencer numbers and
#: notifies); on SQLite it is one plus one per event.
BUDGET: dict[str, dict[str, int]] = {
    "sqlite": {
        "authenticated read": 4,
        "ready": 5,
        "claim-next": 16,
        "claim": 17,
        "renew": 12,
        "checkpoint": 12,
        "artifact upload": 18,
        "submit": 29,
        "claim offering a lesson": 18,
        "submit carrying a lesson": 33,
        "review submit": 49,
    },
    "postgresql": {
        "authenticated read": 4,
        "ready": 5,
        "claim-next": 14,
        "claim": 16,
        "renew": 10,
        "checkpoint": 10,
        "artifact upload": 16,
        "submit": 26,
        "claim offering a lesson": 17,
        "submit carrying a lesson": 30,
        "review submit": 45,
    },
}


@pytest.fixture
def buildmax_settings(buildmax_settings: Config) -> Config:
    """Every pooled connection open from the start, so each is watched."""
    return buildmax_settings.replace(pg_pool_min=4, pg_pool_max=4)


async def _member(app: Any, space: SpaceHandle, who: PrincipalHandle, role: str) -> None:
    async with app.db.write() as tx:
        await put_member(tx, space.pk, who.pk, role, app.clock.now_ms())


async def test_hot_operations_stay_within_their_statement_budget(
    app: Any,
    client: Any,
    make_principal: Callable[..., Awaitable[PrincipalHandle]],
    make_space: Callable[..., Awaitable[SpaceHandle]],
) -> None:
    owner = await make_principal("human")
    agent = await make_principal("agent")
    reviewer = await make_principal("agent")
    space = await make_space(owner)
    for who in (agent, reviewer):
        await _member(app, space, who, "member")
    base = f"/v1/spaces/{space.id}"

    async def as_(who: PrincipalHandle, method: str, path: str, **kw: Any) -> Any:
        return await call(client, method, base + path, who, **kw)

    await as_(owner, "POST", "/projects", json={"name": "main"}, expect=201)
    tasks = [
        (
            await as_(
                owner, "POST", "/tasks", json={"project": "main", "title": f"t{n}"}, expect=201
            )
        )["id"]
        for n in range(6)
    ]
    counted: dict[str, StatementLog] = {}

    async def twice(
        name: str, first: Callable[[], Awaitable[Any]], then: Callable[[], Awaitable[Any]]
    ) -> Any:
        await first()
        async with watching_statements(app) as log:
            result = await then()
        counted[name] = log
        return result

    read = lambda: as_(agent, "GET", f"/tasks/{tasks[0]}", expect=200)  # noqa: E731
    await twice("authenticated read", read, read)
    ready = lambda: as_(agent, "GET", "/ready", expect=200)  # noqa: E731
    await twice("ready", ready, ready)

    claims: list[dict[str, Any]] = []

    async def claim_next() -> None:
        claims.append(await as_(agent, "POST", "/claims", json={}, expect=201))

    await twice("claim-next", claim_next, claim_next)
    taken = {c["task"]["id"] for c in claims}
    left = [t for t in tasks if t not in taken]

    async def claim(task: str) -> None:
        claims.append(await as_(agent, "POST", f"/tasks/{task}/claim", json={}, expect=201))

    await twice("claim", lambda: claim(left[0]), lambda: claim(left[1]))
    # A lesson in the project: a claim reads the lessons it offers.
    lesson = {"project": "main", "kind": "note", "title": "a lesson", "text": "offered"}
    await as_(owner, "POST", "/lessons", json=lesson, expect=201)
    await twice("claim offering a lesson", lambda: claim(left[2]), lambda: claim(left[3]))
    assert claims[-1]["attempt"]["run_environment"]["lessons"][0]["title"] == "a lesson"
    attempts = [c["attempt"] for c in claims]

    def on(
        attempt: dict[str, Any], action: str, expect: int, **body: Any
    ) -> Callable[[], Awaitable[Any]]:
        return lambda: as_(
            agent,
            "POST",
            f"/attempts/{attempt['id']}/{action}",
            json={"generation": attempt["generation"], **body},
            expect=expect,
        )

    await twice("renew", on(attempts[0], "renew", 200), on(attempts[1], "renew", 200))
    await twice(
        "checkpoint",
        on(attempts[0], "checkpoint", 201, data={"step": 1}),
        on(attempts[1], "checkpoint", 201, data={"step": 1}),
    )

    async def upload(text: bytes) -> None:
        digest = hashlib.sha256(text).hexdigest()
        await as_(
            agent,
            "POST",
            f"/artifacts?name=notes.txt&sha256={digest}",
            data=text,
            content_type="text/plain",
            expect=201,
        )

    await twice("artifact upload", lambda: upload(b"first"), lambda: upload(b"second"))
    await twice(
        "submit",
        on(attempts[0], "submit", 201, summary="done"),
        on(attempts[1], "submit", 201, summary="done"),
    )

    carried = {"lessons": [{"kind": "note", "title": "learned", "text": "carried"}]}
    await twice(
        "submit carrying a lesson",
        on(attempts[4], "submit", 201, summary="done", extensions=carried),
        on(attempts[5], "submit", 201, summary="done", extensions=carried),
    )

    items = [await as_(reviewer, "POST", "/claims", json={"kind": "review"}, expect=201)]
    items.append(await as_(reviewer, "POST", "/claims", json={"kind": "review"}, expect=201))

    def approve(item: dict[str, Any]) -> Callable[[], Awaitable[Any]]:
        body = {
            "decision": "approve",
            "summary": "fine",
            "generation": item["attempt"]["generation"],
        }
        return lambda: as_(
            reviewer, "POST", f"/reviews/{item['task']['id']}", json=body, expect=201
        )

    await twice("review submit", approve(items[0]), approve(items[1]))

    engine = app.db.dialect
    found = {name: len(log) for name, log in counted.items()}
    over = {
        name: f"{found[name]} statements, budget {BUDGET[engine].get(name)}:\n{counted[name]}"
        for name in found
        if found[name] != BUDGET[engine].get(name)
    }
    assert not over, f"{engine}: {found}\n\n" + "\n\n".join(f"{k}: {v}" for k, v in over.items())
