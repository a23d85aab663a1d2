"""Fixtures of the artifacts plugin's tests: small limits, a space with an
owner, a member and an outsider, and helpers that look at every place an
upload could leave something behind."""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_artifacts.tables import artifacts, quotas, uploads
from buildmax_s3.testing import S3Bucket, s3_bucket, s3_server  # noqa: F401

from buildmax.config import Config
from buildmax.spaces import put_member
from buildmax.testing import PrincipalHandle, SpaceHandle

KIB = 1024
#: The test deployment's limits.
MAX_BYTES = 256 * KIB
QUOTA_BYTES = 1024 * KIB
PROBLEM = "urn:buildmax:problem:"


@dataclass
class Backend:
    """Where the test app's blob store keeps its bytes, and a way to look
    (and reach) there without going through the store."""

    kind: str
    root: Path
    bucket: S3Bucket | None = None

    def settings(self) -> dict[str, Any]:
        if self.bucket is None:
            return {"blob_store_url": ""}
        return {"blob_store_url": self.bucket.url, "plugins": {"s3": self.bucket.settings}}

    def keys(self) -> list[str]:
        """Every stored thing, temporary bytes and unfinished uploads included."""
        if self.bucket is not None:
            return [key.replace("blobs/", "", 1) for key in self.bucket.stored()]
        if not self.root.exists():
            return []
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file())

    def put(self, key: str, data: bytes) -> None:
        """Write bytes under a key behind the store's back."""
        if self.bucket is not None:
            client = self.bucket.server.client()
            client.put_object(Bucket=self.bucket.name, Key=f"blobs/{key}", Body=data)
        else:
            (self.root / key).write_bytes(data)

    def leave_temporary(self) -> None:
        """What a server killed mid-upload leaves: a temporary object (and,
        on S3, an unfinished multipart upload)."""
        if self.bucket is not None:
            client = self.bucket.server.client()
            client.put_object(Bucket=self.bucket.name, Key="blobs/.tmp/dead", Body=b"half")
            client.create_multipart_upload(Bucket=self.bucket.name, Key="blobs/.tmp/dead-too")
        else:
            (self.root / ".tmp").mkdir(parents=True, exist_ok=True)
            (self.root / ".tmp" / "dead").write_bytes(b"half")

    def remove(self, key: str) -> None:
        """Make a blob vanish behind the store's back."""
        if self.bucket is not None:
            self.bucket.server.client().delete_object(Bucket=self.bucket.name, Key=f"blobs/{key}")
        else:
            (self.root / key).unlink()


@pytest.fixture(params=["file", "s3"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    """Every artifacts test runs on the file store and on S3 (a local server)."""
    bucket = request.getfixturevalue("s3_bucket") if request.param == "s3" else None
    return Backend(request.param, tmp_path / "data" / "blobs", bucket)


@pytest.fixture
def buildmax_settings(buildmax_database_url: str, tmp_path: Path, backend: Backend) -> Config:
    """The kernel's test settings with small artifact limits, on ``backend``."""
    url = buildmax_database_url if buildmax_database_url.startswith("postgresql") else ""
    store = backend.settings()
    return Config(
        data_dir=str(tmp_path / "data"),
        database_url=url,
        blob_store_url=store["blob_store_url"],
        plugins={
            "artifacts": {"max_bytes": MAX_BYTES, "quota_bytes": QUOTA_BYTES},
            **store.get("plugins", {}),
        },
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
    backend: Backend

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
        key: str | None = None,
        **query: str,
    ) -> Any:
        """Upload ``data`` (with an ``Idempotency-Key`` when given); the
        JSON answer (status checked)."""
        token = who if isinstance(who, str) else (who or self.member).token
        headers = {"Authorization": f"Bearer {token}", "Content-Type": media_type}
        if key is not None:
            headers["Idempotency-Key"] = key
        response = await self.client.post(
            self.base,
            data=data,
            headers=headers,
            query_string={"name": name, **query},
        )
        body = await response.get_json()
        assert response.status_code == expect, body
        return body

    async def raw_upload(
        self, receive: Any, name: str, declared: int, key: str | None = None
    ) -> list[dict[str, Any]]:
        """Upload through the app's ASGI interface, the body coming from
        ``receive`` and ``declared`` bytes announced (with an
        ``Idempotency-Key`` when given); the messages answered."""
        answers: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            answers.append(message)

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": self.base,
            "raw_path": self.base.encode(),
            "query_string": f"name={name}".encode(),
            "root_path": "",
            "headers": [
                (b"host", b"test"),
                (b"authorization", f"Bearer {self.member.token}".encode()),
                (b"content-type", b"text/plain"),
                (b"content-length", str(declared).encode()),
                *([(b"idempotency-key", key.encode())] if key else []),
            ],
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 8420),
        }
        await asyncio.wait_for(self.app(scope, receive, send), 10)
        return answers

    async def rows(self, table: sa.Table) -> list[dict[str, Any]]:
        async with self.app.db.read() as conn:
            return [dict(r) for r in await conn.fetch_all(sa.select(table))]

    def blob_files(self) -> list[str]:
        """Every key in the blob store, temporary ones included."""
        return self.backend.keys()

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
async def shelf(app, client, make_principal, make_space, backend) -> Shelf:
    owner = await make_principal("human")
    member = await make_principal("agent")
    outsider = await make_principal("agent")
    space = await make_space(owner)
    other = await make_space(outsider)
    async with app.db.write() as tx:
        await put_member(tx, space.pk, member.pk, "member", app.clock.now_ms())
    return Shelf(app, client, space, owner, member, outsider, other, backend)
