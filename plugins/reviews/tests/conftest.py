"""Fixtures of the reviews plugin's tests: a space with a human owner, an
author agent, two reviewer agents, an integrator agent, a human member and
a viewer; a project with a repository target; helpers to drive a task
through implement → review → integrate over HTTP and to read what was
committed (rows, audit events)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_audit.tables import events as audit_events
from buildmax_reviews.tables import TABLES as REVIEW_TABLES
from buildmax_tasks.tables import TABLES as TASK_TABLES
from buildmax_tasks.tables import reservations, tasks

from buildmax.spaces import put_member
from buildmax.testing import PrincipalHandle, SpaceHandle, call

PROBLEM = "urn:buildmax:problem:"
REPO = "https://git.test/app.git"
TARGET = f"repo:{REPO}@main"


@dataclass
class Flow:
    """A space to review in and the people who work there."""

    app: Any
    client: Any
    space: SpaceHandle
    owner: PrincipalHandle
    author: PrincipalHandle
    reviewer: PrincipalHandle
    reviewer2: PrincipalHandle
    integrator: PrincipalHandle
    human: PrincipalHandle
    viewer: PrincipalHandle
    project: str = "main"

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
        client: Any = None,
    ) -> Any:
        """Call ``base + path`` as ``who`` (a principal or a raw token; the
        owner by default): :func:`buildmax.testing.call`."""
        url = path if path.startswith("/v1/") else self.base + path
        return await call(
            client or self.client,
            method,
            url,
            who or self.owner,
            expect=expect,
            problem=problem,
            json=json,
        )

    async def policy(self, **fields: Any) -> Any:
        """Set the project's workflow policy."""
        body = {"approvals_required": 1, **fields}
        return await self.call("POST", f"/projects/{self.project}/policy", json=body, expect=201)

    async def task(self, title: str = "do it", **fields: Any) -> dict[str, Any]:
        """A task in the project (created by the owner)."""
        body = {"project": self.project, "title": title, **fields}
        return await self.call("POST", "/tasks", json=body, expect=201)  # type: ignore[no-any-return]

    async def claim(self, task_id: str, who: PrincipalHandle, **kw: Any) -> Any:
        """Claim a task by id (201 expected unless ``expect`` says otherwise)."""
        kw.setdefault("expect", 201)
        return await self.call("POST", f"/tasks/{task_id}/claim", who, json={}, **kw)

    async def submit(self, claim: dict[str, Any], expect: int = 201, **candidate: Any) -> Any:
        """Hand in a claim's attempt with its own token."""
        attempt = claim["attempt"]
        return await self.call(
            "POST",
            f"/attempts/{attempt['id']}/submit",
            claim["token"],
            json={
                "generation": attempt["generation"],
                "summary": "handed in",
                "candidate": candidate,
            },
            expect=expect,
        )

    async def implemented(self, title: str = "the subject", **fields: Any) -> tuple[Any, Any]:
        """A task claimed and handed in by the author: (task, submit answer)."""
        subject = await self.task(title, **fields)
        claim = await self.claim(subject["id"], self.author)
        return subject, await self.submit(claim)

    async def review(
        self,
        task_id: str,
        who: PrincipalHandle | str,
        decision: str = "approve",
        *,
        expect: int = 201,
        problem: str | None = None,
        **body: Any,
    ) -> Any:
        """Record a review on a review work item."""
        return await self.call(
            "POST",
            f"/reviews/{task_id}",
            who,
            json={"decision": decision, **body},
            expect=expect,
            problem=problem,
        )

    async def state(self, task_id: str) -> dict[str, Any]:
        """A task as the API shows it."""
        return await self.call("GET", f"/tasks/{task_id}", self.viewer, expect=200)  # type: ignore[no-any-return]

    async def rows(self, table: sa.Table, *where: Any) -> list[dict[str, Any]]:
        """Committed rows of ``table``."""
        async with self.app.db.read() as conn:
            return [dict(r) for r in await conn.fetch_all(sa.select(table).where(*where))]

    async def linked(self, subject_id: str) -> list[dict[str, Any]]:
        """The subject's stage work items, oldest first."""
        subject = (await self.rows(tasks, tasks.c.public_id == subject_id))[0]
        rows = await self.rows(tasks, tasks.c.subject_task_id == subject["id"])
        return sorted(rows, key=lambda r: r["id"])

    async def audited(self, action: str, target_id: str | None = None) -> list[dict[str, Any]]:
        """Committed audit events of ``action`` (about ``target_id``)."""
        where = [audit_events.c.action == action]
        if target_id is not None:
            where.append(audit_events.c.target_id == target_id)
        return await self.rows(audit_events, *where)

    async def reservations(self) -> list[tuple[str, str]]:
        """Every live reservation: (resource, holding attempt)."""
        rows = await self.rows(reservations)
        return sorted((r["resource"], r["attempt_public_id"]) for r in rows)

    async def snapshot(self) -> dict[str, list[str]]:
        """Every row of the tasks and reviews tables and the audit trail:
        what a refused request must leave as it was."""
        found = {}
        async with self.app.db.read() as conn:
            for table in [*TASK_TABLES, *REVIEW_TABLES, audit_events]:
                rows = await conn.fetch_all(sa.select(table))
                found[table.name] = sorted(repr(sorted(dict(r).items())) for r in rows)
        return found


async def add_member(app: Any, space: SpaceHandle, who: PrincipalHandle, role: str) -> None:
    """Make ``who`` a member of ``space`` with ``role``."""
    async with app.db.write() as tx:
        await put_member(tx, space.pk, who.pk, role, app.clock.now_ms())


@pytest.fixture
async def flow(app, client, make_principal, make_space) -> Flow:
    owner = await make_principal("human")
    space = await make_space(owner)
    people = {}
    for name, kind, role in (
        ("author", "agent", "member"),
        ("reviewer", "agent", "member"),
        ("reviewer2", "agent", "member"),
        ("integrator", "agent", "member"),
        ("human", "human", "member"),
        ("viewer", "agent", "viewer"),
    ):
        people[name] = await make_principal(kind, name=name)
        await add_member(app, space, people[name], role)
    f = Flow(app, client, space, owner, **people)
    await f.call(
        "POST",
        "/projects",
        json={"name": "main", "repository_url": REPO, "target_branch": "main"},
        expect=201,
    )
    return f
