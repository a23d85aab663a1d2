"""Fixtures of the tasks plugin's tests: a space with an owner, members and
a project, and a small HTTP helper that checks problem types."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_tasks.tables import TABLES, TABLES_2, attempts, reservations, tasks

from buildmax.spaces import put_member
from buildmax.tables import events, space_members, spaces, tokens
from buildmax.testing import PrincipalHandle, SpaceHandle, call, without_plugins

PROBLEM = "urn:buildmax:problem:"


@dataclass
class Work:
    """A space to work in: its owner, two agent members, a viewer, a project."""

    app: Any
    client: Any
    space: SpaceHandle
    owner: PrincipalHandle
    agent: PrincipalHandle
    agent2: PrincipalHandle
    viewer: PrincipalHandle
    project: str

    @property
    def base(self) -> str:
        return f"/v1/spaces/{self.space.id}"

    async def call(
        self,
        method: str,
        path: str,
        who: PrincipalHandle | str | None = None,
        *,
        expect: int | None = None,
        problem: str | None = None,
        json: Any = None,
        key: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> Any:
        """Call ``base + path`` as ``who`` (a principal, or a raw token; the
        owner by default): :func:`buildmax.testing.call`."""
        url = path if path.startswith("/v1/") else self.base + path
        return await call(
            self.client,
            method,
            url,
            who or self.owner,
            expect=expect,
            problem=problem,
            json=json,
            key=key,
            headers=headers,
        )

    async def task(self, title: str = "do it", **fields: Any) -> dict[str, Any]:
        """Create a task in the project; its body."""
        body = {"project": self.project, "title": title, **fields}
        return await self.call("POST", "/tasks", json=body, expect=201)  # type: ignore[no-any-return]

    async def claim(self, task_id: str, who: PrincipalHandle | None = None, **body: Any) -> Any:
        """Claim a task; the claim body (201 expected)."""
        return await self.call(
            "POST", f"/tasks/{task_id}/claim", who or self.agent, json=body, expect=201
        )

    async def rows(self, table: sa.Table, *where: Any) -> list[dict[str, Any]]:
        """Rows of a table, straight from the database (on a reader of its
        own: a whole table may take longer than a read on the event loop
        may, on a busy machine)."""
        async with self.app.db.read(background=True) as conn:
            return [dict(r) for r in await conn.fetch_all(sa.select(table).where(*where))]

    async def one(self, table: sa.Table, *where: Any) -> dict[str, Any]:
        """The one row of ``table`` matching ``where``."""
        [row] = await self.rows(table, *where)
        return row

    async def task_row(self, public_id: str) -> dict[str, Any]:
        """A task's row by public id."""
        return await self.one(tasks, tasks.c.public_id == public_id)

    async def attempts_of(self, task_id: str) -> list[dict[str, Any]]:
        """A task's attempt rows, by generation."""
        pk = (await self.task_row(task_id))["id"]
        rows = await self.rows(attempts, attempts.c.task_id == pk)
        return sorted(rows, key=lambda r: r["generation"])

    async def ready_ids(self) -> list[str]:
        """The public ids in ``GET /ready``, in queue order."""
        body = await self.call("GET", "/ready", self.viewer, expect=200)
        return [t["id"] for t in body["items"]]

    async def reservations(self) -> list[tuple[str, str]]:
        """Every live reservation: (resource, holding attempt)."""
        rows = await self.rows(reservations)
        return sorted((r["resource"], r["attempt_public_id"]) for r in rows)

    async def report(
        self, claim: dict[str, Any], op: str, who: Any = None, expect: int = 200, **body: Any
    ) -> Any:
        """An attempt operation (``renew``, ``submit``, ...) at the claim's
        generation, with its attempt token unless ``who`` says otherwise."""
        attempt = claim["attempt"]
        return await self.call(
            "POST",
            f"/attempts/{attempt['id']}/{op}",
            who if who is not None else claim["token"],
            json={"generation": attempt["generation"], **body},
            expect=expect,
        )

    async def snapshot(self) -> dict[str, list[str]]:
        """Every row of every tasks table, the event streams, spaces, members
        and tokens: what a refused request must leave as it was."""
        found = {}
        async with self.app.db.read() as conn:
            for table in [*TABLES, *TABLES_2, events, spaces, space_members, tokens]:
                rows = [dict(r) for r in await conn.fetch_all(sa.select(table))]
                if table is tokens:
                    for row in rows:
                        row.pop("last_used_at")  # touched by authenticating, not a change
                found[table.name] = sorted(repr(sorted(r.items())) for r in rows)
        return found


@pytest.fixture
def buildmax_settings(buildmax_settings):
    """The tasks plugin on its own: an installed stage plugin (reviews) would
    add its stages to every workflow, and the marketplace would judge every
    agent revision and run environment; the tests plug their own."""
    return without_plugins(buildmax_settings, "reviews", "marketplace")


async def add_member(app: Any, space: SpaceHandle, who: PrincipalHandle, role: str) -> None:
    """Make ``who`` a member of ``space`` with ``role``."""
    async with app.db.write() as tx:
        await put_member(tx, space.pk, who.pk, role, app.clock.now_ms())


@pytest.fixture
async def work(app, client, make_principal, make_space) -> Work:
    owner = await make_principal("human")
    agent = await make_principal("agent")
    agent2 = await make_principal("agent")
    viewer = await make_principal("agent")
    space = await make_space(owner)
    for who, role in ((agent, "member"), (agent2, "member"), (viewer, "viewer")):
        await add_member(app, space, who, role)
    w = Work(app, client, space, owner, agent, agent2, viewer, "main")
    await w.call("POST", "/projects", json={"name": "main"}, expect=201)
    return w
