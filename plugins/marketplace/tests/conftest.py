"""Fixtures of the marketplace plugin's tests: a system admin, an operator,
a space with its owner and an agent member, and a small HTTP helper."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_audit.tables import events as audit_events

from buildmax.spaces import put_member
from buildmax.testing import PrincipalHandle, SpaceHandle, call

PROBLEM = "urn:buildmax:problem:"
#: The test deployment's largest release archive.
MAX_PACKAGE_BYTES = 256 * 1024


@dataclass
class Market:
    """The people who publish, certify and use the catalog."""

    app: Any
    client: Any
    admin: PrincipalHandle
    operator: PrincipalHandle
    owner: PrincipalHandle
    agent: PrincipalHandle
    space: SpaceHandle

    async def call(
        self,
        method: str,
        path: str,
        who: PrincipalHandle | str,
        *,
        expect: int | None = None,
        problem: str | None = None,
        json: Any = None,
        data: bytes | None = None,
        key: str | None = None,
    ) -> Any:
        """Call ``path`` as ``who``: :func:`buildmax.testing.call`."""
        return await call(
            self.client,
            method,
            path,
            who,
            expect=expect,
            problem=problem,
            json=json,
            data=data,
            key=key,
        )

    async def claim_new(self, base: str, title: str, agent: str) -> Any:
        """Create a task of project ``main`` for ``agent`` in the space at
        ``base`` and claim it as the agent principal; the claim's answer."""
        task = await self.call(
            "POST",
            f"{base}/tasks",
            self.owner,
            json={"project": "main", "title": title, "agent": agent},
            expect=201,
        )
        return await self.call(
            "POST", f"{base}/tasks/{task['id']}/claim", self.agent, json={}, expect=201
        )

    async def publish(self, archive: Path, name: str, who: Any = None, **kw: Any) -> Any:
        """Publish the archive at ``archive`` as a release of ``name``."""
        kw.setdefault("expect", 201)
        return await self.call(
            "POST",
            f"/v1/catalog/{name}/releases",
            who or self.admin,
            data=archive.read_bytes(),  # noqa: ASYNC240 - a small test file
            **kw,
        )

    async def rows(self, table: sa.Table, *where: Any) -> list[dict[str, Any]]:
        """Committed rows of ``table``."""
        async with self.app.db.read() as conn:
            return [dict(r) for r in await conn.fetch_all(sa.select(table).where(*where))]

    async def audited(self, action: str) -> list[dict[str, Any]]:
        """Committed audit events of ``action``."""
        return await self.rows(audit_events, audit_events.c.action == action)


@pytest.fixture
def buildmax_settings(buildmax_settings):
    return dataclasses.replace(
        buildmax_settings,
        plugins={"marketplace": {"max_package_bytes": MAX_PACKAGE_BYTES}},
    )


@pytest.fixture
async def market(app, client, make_principal, make_space) -> Market:
    admin = await make_principal("human", system_role="admin", name="admin")
    operator = await make_principal("human", system_role="operator", name="operator")
    owner = await make_principal("human", name="owner")
    agent = await make_principal("agent", name="agent")
    space = await make_space(owner)
    async with app.db.write() as tx:
        await put_member(tx, space.pk, agent.pk, "member", app.clock.now_ms())
    return Market(app, client, admin, operator, owner, agent, space)
