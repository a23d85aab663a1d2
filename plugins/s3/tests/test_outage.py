"""S3 down: every store call is ``BlobStoreUnavailable`` and every route
that needs the store answers a 503 problem, changing nothing."""

from __future__ import annotations

import http.server
import threading
from collections.abc import AsyncIterator

import pytest
from buildmax_artifacts.tables import artifacts, quotas, uploads
from buildmax_hookspecs import BlobStoreUnavailable
from buildmax_s3 import S3BlobStore
from buildmax_s3.settings import S3Settings
from buildmax_s3.testing import CREDENTIALS

from buildmax.config import Config
from buildmax.testing import free_port


async def _stream(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


@pytest.fixture
def nowhere(monkeypatch: pytest.MonkeyPatch) -> str:
    """An S3 endpoint where nothing listens."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture
def buildmax_settings(buildmax_database_url: str, tmp_path, nowhere: str) -> Config:
    url = buildmax_database_url if buildmax_database_url.startswith("postgresql") else ""
    return Config(
        data_dir=str(tmp_path / "data"),
        database_url=url,
        blob_store_url="s3://bucket/blobs",
        plugins={"s3": {"endpoint_url": nowhere, "addressing_style": "path", "max_attempts": 1}},
    )


async def test_an_unreachable_s3_is_blob_store_unavailable_for_every_call(nowhere):
    store = S3BlobStore(
        "bucket", "blobs", S3Settings(endpoint_url=nowhere, addressing_style="path", max_attempts=1)
    )
    key = "p/sha256/" + "0" * 64
    try:
        with pytest.raises(BlobStoreUnavailable):
            await store.put("p", _stream(b"x"))
        with pytest.raises(BlobStoreUnavailable):
            await store.head(key)
        with pytest.raises(BlobStoreUnavailable):
            [chunk async for chunk in store.open(key)]
        with pytest.raises(BlobStoreUnavailable):
            [ref async for ref in store.list("p/")]
        with pytest.raises(BlobStoreUnavailable):
            await store.sweep_temporary(0)
    finally:
        await store.aclose()


async def test_an_upload_while_s3_is_down_is_a_503_and_leaves_nothing(
    app, client, make_principal, make_space, nowhere
):
    owner = await make_principal("human")
    space = await make_space(owner)
    got = await client.post(
        f"/v1/spaces/{space.id}/artifacts",
        data=b"evidence",
        headers=owner.headers,
        query_string={"name": "log.txt"},
    )
    problem = await got.get_json()
    assert got.status_code == 503, problem
    assert problem["type"] == "urn:buildmax:problem:blob-store-unavailable"
    assert got.headers["Retry-After"] == "5"
    assert nowhere.rsplit(":", 1)[1] not in problem["detail"]  # where it is stays in the log
    async with app.db.read() as conn:
        assert await conn.fetch_all(artifacts.select()) == []
        assert await conn.fetch_all(uploads.select()) == []
        assert {r["reserved"] for r in await conn.fetch_all(quotas.select())} == {0}


class _Failing(http.server.BaseHTTPRequestHandler):
    """An S3 endpoint that answers every request with one status."""

    status = 500
    protocol_version = "HTTP/1.1"  # answers Expect: 100-continue

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        body = b"<Error><Code>InternalError</Code><Message>down</Message></Error>"
        self.send_response(self.status)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("status", [500, 503, 403])
async def test_s3_failing_or_refusing_is_unavailable(monkeypatch, status):
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    handler = type("Handler", (_Failing,), {"status": status})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    # It looks for a shutdown every 0.05 s (not 0.5 s: a wait of each test).
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}"
    settings = S3Settings(endpoint_url=endpoint, addressing_style="path", max_attempts=1)
    store = S3BlobStore("bucket", "blobs", settings)
    try:
        with pytest.raises(BlobStoreUnavailable):
            await store.put("p", _stream(b"x"))
        with pytest.raises(BlobStoreUnavailable):
            await store.head("p/sha256/" + "0" * 64)
    finally:
        await store.aclose()
        server.shutdown()
        server.server_close()


async def test_a_missing_key_is_not_an_outage(s3_bucket):
    store = S3BlobStore.from_url(s3_bucket.url, Config(plugins={"s3": s3_bucket.settings}))
    try:
        assert await store.head("p/sha256/" + "0" * 64) is None
        assert await store.delete("p/sha256/" + "0" * 64) is False
    finally:
        await store.aclose()
