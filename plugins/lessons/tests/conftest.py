"""Fixtures of the lessons plugin's tests: a space with an owner, two agent
members and a viewer, a project ``main`` and another ``web``, and helpers
to publish and find lessons over HTTP and read what was committed."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import pytest
import sqlalchemy as sa
from buildmax_audit.tables import events as audit_events
from buildmax_lessons.tables import lessons, revisions, votes

from buildmax.spaces import put_member
from buildmax.testing import PrincipalHandle, SpaceHandle, call

PROBLEM = "urn:buildmax:problem:"


@dataclass
class Lab:
    """A space where lessons are learned, and the people in it."""

    app: Any
    client: Any
    space: SpaceHandle
    owner: PrincipalHandle
    agent: PrincipalHandle
    agent2: PrincipalHandle
    viewer: PrincipalHandle

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
        **kw: Any,
    ) -> Any:
        """Call ``base + path`` as ``who`` (the owner by default)."""
        url = path if path.startswith("/v1/") else self.base + path
        return await call(
            self.client, method, url, who or self.owner, expect=expect, problem=problem, **kw
        )

    async def lesson(self, title: str, text: str = "", **fields: Any) -> dict[str, Any]:
        """Publish a lesson (by the first agent unless ``who`` is given)."""
        who = fields.pop("who", self.agent)
        body = {"kind": "gotcha", "title": title, "text": text or title, **fields}
        return await self.call("POST", "/lessons", who, json=body, expect=201)  # type: ignore[no-any-return]

    async def search(
        self, who: PrincipalHandle | None = None, **query: Any
    ) -> list[dict[str, Any]]:
        """Every item of a list or search (following the cursor)."""
        found: list[dict[str, Any]] = []
        params = {k: str(v) for k, v in query.items()}
        while True:
            page = await self.call("GET", "/lessons?" + urlencode(params), who, expect=200)
            found.extend(page["items"])
            if not page["next_cursor"]:
                return found
            params["cursor"] = page["next_cursor"]

    async def rows(self) -> dict[str, list[dict[str, Any]]]:
        """Every lesson, revision and vote row of the space."""
        async with self.app.db.read() as conn:
            mine = sa.select(lessons.c.id).where(lessons.c.space_id == self.space.pk)
            return {
                "lessons": [
                    dict(r)
                    for r in await conn.fetch_all(
                        sa.select(lessons).where(lessons.c.id.in_(mine)).order_by(lessons.c.id)
                    )
                ],
                "revisions": [
                    dict(r)
                    for r in await conn.fetch_all(
                        sa.select(revisions)
                        .where(revisions.c.lesson_id.in_(mine))
                        .order_by(revisions.c.id)
                    )
                ],
                "votes": [
                    dict(r)
                    for r in await conn.fetch_all(
                        sa.select(votes).where(votes.c.lesson_id.in_(mine)).order_by(votes.c.id)
                    )
                ],
            }

    async def audit(self, prefix: str = "lesson.") -> list[dict[str, Any]]:
        """The space's audit events whose action starts with ``prefix``, oldest first."""
        async with self.app.db.read() as conn:
            rows = await conn.fetch_all(
                sa.select(audit_events)
                .where(audit_events.c.action.startswith(prefix))
                .order_by(audit_events.c.id)
            )
        return [dict(r) for r in rows if r["space_id"] == self.space.id]


@pytest.fixture
async def lab(
    app: Any,
    client: Any,
    make_principal: Callable[..., Awaitable[PrincipalHandle]],
    make_space: Callable[..., Awaitable[SpaceHandle]],
) -> Lab:
    owner = await make_principal("human")
    agent = await make_principal("agent")
    agent2 = await make_principal("agent")
    viewer = await make_principal("human")
    space = await make_space(owner)
    async with app.db.write() as tx:
        now = app.clock.now_ms()
        for who, role in ((agent, "member"), (agent2, "member"), (viewer, "viewer")):
            await put_member(tx, space.pk, who.pk, role, now)
    found = Lab(app, client, space, owner, agent, agent2, viewer)
    for name in ("main", "web"):
        await found.call("POST", "/projects", json={"name": name}, expect=201)
    return found
