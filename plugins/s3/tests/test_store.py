"""The ``s3`` blob store against a local S3-compatible server.

Every assertion about durable state looks inside the bucket (objects and
unfinished multipart uploads), not only at what the store answers.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import os
import tempfile
import threading
import time
from collections.abc import AsyncIterator

import pytest
from buildmax_hookspecs import (
    BlobDigestMismatch,
    BlobKeyError,
    BlobNotFound,
    BlobStore,
    BlobStoreUnavailable,
    BlobTooLarge,
)
from buildmax_s3 import S3BlobStore, testing
from buildmax_s3.settings import MIB, S3Settings

from buildmax.app import create_app
from buildmax.config import Config, ConfigError

pytestmark = pytest.mark.engine_independent
PART = 5 * MIB


async def _stream(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def _pieces(data: bytes, size: int = 64 * 1024) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


async def _read(store: S3BlobStore, key: str, byte_range=None) -> bytes:
    return b"".join([chunk async for chunk in store.open(key, byte_range)])


@pytest.fixture
def spool(tmp_path):
    """The store's spool directory; the test fails if a spool file is still
    open when it ends (they are unlinked at once, so open is what counts)."""
    directory = tmp_path / "spool"
    directory.mkdir()
    yield directory
    assert _open_files_in(directory) == []


def _open_files_in(directory) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(directory)):
                found.append(target)
    return found


@pytest.fixture
async def store(s3_bucket, spool):
    made = S3BlobStore.from_url(
        s3_bucket.url,
        Config(plugins={"s3": {**s3_bucket.settings, "part_size": PART, "spool_dir": str(spool)}}),
    )
    yield made
    await made.aclose()


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_a_small_blob_lands_at_its_digest_under_the_root(store, s3_bucket):
    data = b"hello, world"
    ref = await store.put("artifacts/space/sp_1", _stream(b"hello, ", b"world"))
    assert (ref.key, ref.size, ref.sha256) == (
        f"artifacts/space/sp_1/sha256/{sha(data)}",
        12,
        sha(data),
    )
    assert s3_bucket.stored() == [f"blobs/{ref.key}"]
    assert await _read(store, ref.key) == data
    head = await store.head(ref.key)
    assert (head.size, head.sha256) == (12, sha(data))
    assert abs(head.modified_at - time.time() * 1000) < 60_000


@pytest.mark.parametrize("expected", [False, True], ids=["unknown-digest", "expected-digest"])
async def test_a_blob_of_several_parts_appears_whole_and_leaves_no_temporary(
    store, s3_bucket, expected
):
    data = os.urandom(2 * PART + 12345)
    ref = await store.put(
        "artifacts", _pieces(data), expected_sha256=sha(data) if expected else None
    )
    assert ref.size == len(data) and ref.sha256 == sha(data)
    assert s3_bucket.stored() == [f"blobs/artifacts/sha256/{sha(data)}"]
    assert await _read(store, ref.key) == data
    assert await _read(store, ref.key, (PART - 2, PART + 2)) == data[PART - 2 : PART + 3]


async def test_an_empty_stream_is_an_empty_blob(store):
    ref = await store.put("p", _stream())
    assert (ref.size, ref.sha256) == (0, sha(b""))
    assert await _read(store, ref.key) == b""


@pytest.mark.parametrize("size", [1000, 2 * PART + 7], ids=["one-request", "multipart"])
async def test_an_oversized_stream_raises_and_leaves_nothing(store, s3_bucket, size):
    with pytest.raises(BlobTooLarge):
        await store.put("p", _pieces(os.urandom(size)), max_bytes=size - 1)
    assert s3_bucket.stored() == []


@pytest.mark.parametrize("size", [1000, 2 * PART + 7], ids=["one-request", "multipart"])
async def test_bytes_that_are_not_the_expected_digest_leave_nothing(store, s3_bucket, size):
    with pytest.raises(BlobDigestMismatch):
        await store.put("p", _pieces(os.urandom(size)), expected_sha256="0" * 64)
    assert s3_bucket.stored() == []


async def test_a_wrong_digest_never_touches_an_existing_blob_of_that_digest(store, s3_bucket):
    """The multipart upload to a final key is aborted, not deleted: the
    identical bytes already there may belong to another artifact."""
    data = os.urandom(PART + 10)
    kept = await store.put("p", _pieces(data))
    with pytest.raises(BlobDigestMismatch):
        await store.put("p", _pieces(os.urandom(PART + 10)), expected_sha256=sha(data))
    assert s3_bucket.stored() == [f"blobs/{kept.key}"]
    assert await _read(store, kept.key) == data


async def test_parts_wait_on_disk_not_in_memory(store, spool):
    seen: list[list[str]] = []

    async def watched() -> AsyncIterator[bytes]:
        for _ in range(PART // (256 * 1024) + 8):
            yield os.urandom(256 * 1024)
            seen.append(_open_files_in(spool))

    ref = await store.put("p", watched())
    assert ref.size == PART + 8 * 256 * 1024
    assert max(len(files) for files in seen) == 1  # one spool file per upload in flight


async def test_a_stream_that_fails_midway_leaves_nothing(store, s3_bucket, spool):
    async def failing() -> AsyncIterator[bytes]:
        yield os.urandom(PART)
        yield os.urandom(PART // 2)
        assert len(_open_files_in(spool)) == 1
        raise ConnectionResetError("client went away")

    with pytest.raises(ConnectionResetError):
        await store.put("p", failing())
    assert s3_bucket.stored() == []


async def test_head_delete_list_and_missing_keys(store):
    a = await store.put("artifacts/space/a", _stream(b"a"))
    b = await store.put("artifacts/space/b", _stream(b"b"))
    theirs = await store.put("catalog", _stream(b"c"))
    listed = [ref.key async for ref in store.list("artifacts/")]
    assert listed == sorted([a.key, b.key])
    assert all(ref.modified_at for ref in [r async for r in store.list("artifacts/")])
    assert await store.delete(a.key) is True
    assert await store.delete(a.key) is False
    assert await store.head(a.key) is None
    with pytest.raises(BlobNotFound):
        await _read(store, a.key)
    assert [ref.key async for ref in store.list("catalog/")] == [theirs.key]


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "a//b", ".tmp/x", "a\\b", "a\x00b"])
async def test_a_key_outside_the_store_is_refused_everywhere(store, key):
    with pytest.raises(BlobKeyError):
        await store.put(key, _stream(b"x"))
    with pytest.raises(BlobKeyError):
        await store.head(key)
    with pytest.raises(BlobKeyError):
        await _read(store, key)
    with pytest.raises(BlobKeyError):
        await store.delete(key)
    with pytest.raises(BlobKeyError):
        [ref async for ref in store.list(key)]


async def test_sweep_removes_what_a_dead_server_left_and_nothing_younger(store, s3_bucket):
    client = s3_bucket.server.client()
    client.put_object(Bucket=s3_bucket.name, Key="blobs/.tmp/dead", Body=b"half")
    client.create_multipart_upload(Bucket=s3_bucket.name, Key="blobs/artifacts/sha256/x")
    kept = await store.put("artifacts", _stream(b"kept"))
    # moto dates every multipart upload 2010-11-10 (real S3 dates it when it
    # starts), so the unfinished upload is old here and the temporary object
    # shows the cut-off.
    assert await store.sweep_temporary(older_than=int(time.time() * 1000) - 3_600_000) == 1
    assert s3_bucket.stored() == sorted([f"blobs/{kept.key}", "blobs/.tmp/dead"])
    assert await store.sweep_temporary(older_than=int(time.time() * 1000) + 5_000) == 1
    assert s3_bucket.stored() == [f"blobs/{kept.key}"]


@pytest.mark.parametrize(
    ("url", "bucket", "root"),
    [
        ("s3://b", "b", ""),
        ("s3://b/", "b", ""),
        ("s3://my-bucket/deep/root/", "my-bucket", "deep/root"),
    ],
)
def test_from_url_names_the_bucket_and_root(url, bucket, root):
    store = S3BlobStore.from_url(url, Config())
    assert (store.bucket, store.root) == (bucket, root)


@pytest.mark.parametrize(
    "url",
    [
        "s3:///root",
        "s3://key:secret@bucket/root",
        "s3://bucket:9000/root",
        "s3://bucket/root?endpoint=http://x",
        "s3://bucket/a/../b",
        "file:///tmp/x",
    ],
)
def test_from_url_refuses_what_is_not_a_bucket_and_root(url):
    with pytest.raises(ValueError):
        S3BlobStore.from_url(url, Config())


@pytest.mark.parametrize(
    "table",
    [
        {"endpoint": "http://x"},
        {"endpoint_url": "ftp://x"},
        {"endpoint_url": 5},
        {"addressing_style": "sideways"},
        {"part_size": 1024},
        {"part_size": True},
        {"max_attempts": 0},
        {"spool_dir": "/nonexistent/spool"},
        {"max_attempts": "3"},
    ],
)
def test_bad_settings_are_refused_naming_the_key(table):
    with pytest.raises(ConfigError, match=r"\[plugins.s3\]"):
        S3Settings.from_mapping(table)


async def test_an_app_with_an_s3_url_stores_through_it_and_closes_it(tmp_path, s3_bucket):
    settings = Config(
        data_dir=str(tmp_path / "data"),
        blob_store_url=s3_bucket.url,
        plugins={"s3": s3_bucket.settings},
    )
    app = create_app(settings, auto_migrate=True)
    async with app.test_app():
        store = app.services.get(BlobStore)
        assert isinstance(store, S3BlobStore)
        assert app.services.provider(BlobStore) == "s3"
        ref = await store.put("x", _stream(b"through the app"))
        assert store._client is not None
    assert store._client is None
    assert s3_bucket.stored() == [f"blobs/{ref.key}"]
    assert not (tmp_path / "data" / "blobs").exists()


async def test_a_spool_that_cannot_be_written_is_unavailable_and_leaves_nothing(
    store, s3_bucket, spool
):
    spool.rmdir()  # the directory vanished after the server started
    with pytest.raises(BlobStoreUnavailable, match="spool"):
        await store.put("p", _pieces(os.urandom(3 * MIB)))
    assert s3_bucket.stored() == []


class _Quiet(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.engine_independent
def test_the_local_s3_server_is_never_another_process_on_its_port(monkeypatch) -> None:
    """The port is free when chosen, not when moto binds it: a server that
    took it meanwhile is seen for what it is, and another port is tried."""
    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quiet)
    thread = threading.Thread(target=other.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    chosen = iter([other.server_address[1]])
    real = testing.free_port
    monkeypatch.setattr(testing, "free_port", lambda: next(chosen, None) or real())
    try:
        with tempfile.TemporaryFile() as log:
            process, port = testing._start(log)
            try:
                assert port != other.server_address[1] and process.poll() is None
            finally:
                testing._stop(process)
    finally:
        other.shutdown()
        other.server_close()
