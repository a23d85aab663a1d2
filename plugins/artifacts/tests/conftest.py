"""Fixtures of the artifacts plugin's tests: small limits, a space with an
owner, a member and an outsider, and helpers that look at every place an
upload could leave something behind."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_artifacts.schema import artifacts, quotas, uploads

from buildmax.config import Config
from buildmax.spaces import put_member
from buildmax.testing import PrincipalHandle, SpaceHandle

KIB = 1024
#: The test deployment's limits.
MAX_BYTES = 256 * KIB
QUOTA_BYTES = 1024 * KIB
PROBLEM = "urn:buildmax:problem:"


@pytest.fixture
def buildmax_settings(buildmax_database_url: str, tmp_path: Path) -> Config:
    """The kernel's test settings with small artifact limits."""
    url = buildmax_database_url if buildmax_database_url.startswith("postgresql") else ""
    return Config(
        data_dir=str(tmp_path / "data"),
        database_url=url,
        plugins={"artifacts": {"max_bytes": MAX_BYTES, "quota_bytes": QUOTA_BYTES}},
    )


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class Shelf:
    """A space to upload into and the people around it."""

    app: Any
    client: Any
    space: SpaceHandle
    owner: PrincipalHandle
    member: PrincipalHandle
    outsider: PrincipalHandle
    other_space: SpaceHandle

    @property
    def base(self) -> str:
        return f"/v1/spaces/{self.space.id}/artifacts"

    async def upload(
        self,
        data: bytes,
        who: PrincipalHandle | str | None = None,
        *,
        name: str = "log.txt",
        media_type: str = "text/plain",
        expect: int = 201,
        **query: str,
    ) -> Any:
        """Upload ``data``; the JSON answer (status checked)."""
        token = who if isinstance(who, str) else (who or self.member).token
        response = await self.client.post(
            self.base,
            data=data,
            headers={"Authorization": f"Bearer {token}", "Content-Type": media_type},
            query_string={"name": name, **query},
        )
        body = await response.get_json()
        assert response.status_code == expect, body
        return body

    async def rows(self, table: sa.Table) -> list[dict[str, Any]]:
        async with self.app.db.read() as conn:
            return [dict(r) for r in await conn.fetch_all(sa.select(table))]

    def blob_files(self) -> list[str]:
        """Every file in the blob store, temporary ones included."""
        root = Path(self.app.settings.data_dir) / "blobs"
        if not root.exists():
            return []
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())

    async def leftovers(self) -> dict[str, Any]:
        """What a refused upload must not leave: artifacts, reservations,
        reserved bytes, blobs."""
        quota_rows = await self.rows(quotas)
        return {
            "artifacts": await self.rows(artifacts),
            "uploads": await self.rows(uploads),
            "reserved": sum(row["reserved"] for row in quota_rows),
            "blobs": self.blob_files(),
        }


@pytest.fixture
async def shelf(app, client, make_principal, make_space) -> Shelf:
    owner = await make_principal("human")
    member = await make_principal("agent")
    outsider = await make_principal("agent")
    space = await make_space(owner)
    other = await make_space(outsider)
    async with app.db.write() as tx:
        await put_member(tx, space.pk, member.pk, "member", app.clock.now_ms())
    return Shelf(app, client, space, owner, member, outsider, other)
