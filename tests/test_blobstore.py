"""The ``file`` blob store (``buildmax.blobstore.FileBlobStore``) and the
``buildmax_blob_stores`` hook that lets a plugin provide another scheme.

Every assertion about durable state looks at the bytes on disk, not only at
what the store answers.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from buildmax_hookspecs import (
    BlobDigestMismatch,
    BlobNotFound,
    BlobStore,
    BlobTooLarge,
    hookimpl,
)

from buildmax.app import create_app
from buildmax.blobstore import CHUNK, TMP_DIR, BlobKeyError, FileBlobStore
from buildmax.config import Config
from buildmax.plugins import ESSENTIAL

pytestmark = pytest.mark.engine_independent


async def _stream(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def _read(store: FileBlobStore, key: str, byte_range=None) -> bytes:
    return b"".join([chunk async for chunk in store.open(key, byte_range)])


def _files(root: Path) -> list[str]:
    """Every regular file under ``root``, relative, sorted."""
    return sorted(
        (Path(dirpath) / name).relative_to(root).as_posix()
        for dirpath, _dirs, names in os.walk(root)
        for name in names
    )


@pytest.fixture
def store(tmp_path: Path) -> FileBlobStore:
    return FileBlobStore(tmp_path / "blobs")


# -- put and read back ---------------------------------------------------------


async def test_put_stores_the_bytes_at_their_digest_under_the_prefix(store):
    data = b"hello, " * 1000 + b"world"
    ref = await store.put("spaces/sp1", _stream(data[:10], data[10:]))
    digest = hashlib.sha256(data).hexdigest()
    assert (ref.key, ref.size, ref.sha256) == (f"spaces/sp1/sha256/{digest}", len(data), digest)
    assert ref.modified_at is not None and abs(ref.modified_at - time.time() * 1000) < 60_000
    on_disk = store.root / "spaces" / "sp1" / "sha256" / digest
    assert on_disk.read_bytes() == data
    assert await _read(store, ref.key) == data
    # Nothing else was left anywhere: the temporary file was moved, not copied.
    assert _files(store.root) == [f"spaces/sp1/sha256/{digest}"]


async def test_a_blob_larger_than_one_chunk_reads_back_equal(store):
    data = os.urandom(2 * CHUNK + 12345)
    ref = await store.put("big", _stream(data[: CHUNK + 7], data[CHUNK + 7 :]))
    assert ref.size == len(data)
    assert ref.sha256 == hashlib.sha256(data).hexdigest()
    assert await _read(store, ref.key) == data


async def test_an_empty_stream_is_an_empty_blob(store):
    ref = await store.put("p", _stream())
    assert ref.size == 0
    assert ref.sha256 == hashlib.sha256(b"").hexdigest()
    assert await _read(store, ref.key) == b""


async def test_the_same_bytes_twice_are_one_blob(store):
    first = await store.put("p", _stream(b"same"))
    second = await store.put("p", _stream(b"sa", b"me"))
    assert (first.key, first.size) == (second.key, second.size)
    assert [ref.key async for ref in store.list("p")] == [first.key]


async def test_byte_ranges_are_inclusive_and_clipped_to_the_blob(store):
    data = bytes(range(256)) * (CHUNK // 256 + 2)
    ref = await store.put("r", _stream(data))
    assert await _read(store, ref.key, (0, 0)) == data[:1]
    assert await _read(store, ref.key, (2, 5)) == data[2:6]
    across = (CHUNK - 3, CHUNK + 3)
    assert await _read(store, ref.key, across) == data[CHUNK - 3 : CHUNK + 4]
    assert await _read(store, ref.key, (len(data) - 2, len(data) + 100)) == data[-2:]
    assert await _read(store, ref.key, (len(data) + 5, len(data) + 10)) == b""


@pytest.mark.parametrize("byte_range", [(5, 2), (-1, 3)])
async def test_an_invalid_byte_range_is_refused(store, byte_range):
    ref = await store.put("r", _stream(b"0123456789"))
    with pytest.raises(ValueError, match="invalid byte range"):
        await _read(store, ref.key, byte_range)


# -- head, delete, list ---------------------------------------------------------


async def test_head_delete_and_list(store):
    a = await store.put("s/a", _stream(b"alpha"))
    b = await store.put("s/a", _stream(b"beta"))
    other = await store.put("s/ab", _stream(b"other prefix"))

    assert await store.head(a.key) == a
    assert await store.head("s/a/sha256/" + "0" * 64) is None
    # A directory is not a blob.
    assert await store.head("s/a/sha256") is None

    listed = [ref async for ref in store.list("s/a")]
    assert listed == sorted([a, b], key=lambda r: r.key)
    # A trailing slash names the same prefix; a sibling prefix is not inside it.
    assert [ref async for ref in store.list("s/a/")] == listed
    assert other.key not in [ref.key for ref in listed]
    assert [ref async for ref in store.list("nothing/here")] == []

    assert await store.delete(a.key) is True
    assert await store.delete(a.key) is False
    assert not (store.root / a.key).exists()
    assert await store.head(a.key) is None
    assert [ref.key async for ref in store.list("s/a")] == [b.key]
    with pytest.raises(BlobNotFound):
        await _read(store, a.key)


async def test_opening_a_missing_key_or_a_directory_is_blob_not_found(store):
    await store.put("d", _stream(b"x"))
    with pytest.raises(BlobNotFound):
        await _read(store, "d/sha256/" + "f" * 64)
    with pytest.raises(BlobNotFound):
        await _read(store, "d/sha256")


# -- failed uploads leave nothing ----------------------------------------------------


async def test_an_oversized_stream_raises_and_leaves_no_file(store):
    with pytest.raises(BlobTooLarge) as caught:
        await store.put("up", _stream(b"x" * 60, b"y" * 60), max_bytes=100)
    assert caught.value.max_bytes == 100
    assert not (store.root / "up").exists()
    assert list((store.root / TMP_DIR).iterdir()) == []
    assert _files(store.root) == []


async def test_bytes_that_are_not_the_expected_digest_leave_nothing(store):
    data = b"the expected bytes"
    with pytest.raises(BlobDigestMismatch) as caught:
        await store.put("up", _stream(data), expected_sha256="0" * 64)
    assert caught.value.actual == hashlib.sha256(data).hexdigest()
    assert _files(store.root) == []
    assert list((store.root / TMP_DIR).iterdir()) == []
    ref = await store.put("up", _stream(data), expected_sha256=hashlib.sha256(data).hexdigest())
    assert _files(store.root) == [ref.key]


async def test_a_stream_of_exactly_max_bytes_is_accepted(store):
    ref = await store.put("up", _stream(b"x" * 60, b"y" * 40), max_bytes=100)
    assert ref.size == 100
    assert _files(store.root) == [ref.key]


async def test_a_stream_that_fails_midway_leaves_nothing(store):
    async def broken() -> AsyncIterator[bytes]:
        yield b"first chunk"
        raise ConnectionResetError("client went away")

    with pytest.raises(ConnectionResetError):
        await store.put("up", broken())
    assert not (store.root / "up").exists()
    assert list((store.root / TMP_DIR).iterdir()) == []
    assert _files(store.root) == []


# -- keys that would leave the root --------------------------------------------------


BAD_KEYS = [
    "",
    "..",
    "../outside",
    "a/../../outside",
    "a/./b",
    "a//b",
    "/etc/passwd",
    ".tmp",
    ".tmp/somefile",
    "a\\..\\b",
    "a\x00b",
]


@pytest.mark.parametrize("key", BAD_KEYS)
async def test_a_key_that_could_escape_the_root_is_refused_everywhere(store, tmp_path, key):
    with pytest.raises(BlobKeyError):
        await store.put(key, _stream(b"data"))
    with pytest.raises(BlobKeyError):
        await _read(store, key)
    with pytest.raises(BlobKeyError):
        await store.head(key)
    with pytest.raises(BlobKeyError):
        await store.delete(key)
    with pytest.raises(BlobKeyError):
        _ = [ref async for ref in store.list(key)]
    # Nothing was written, inside the root or next to it.
    assert _files(tmp_path) == []


async def test_a_refused_key_is_a_value_error_for_callers_that_catch_those(store):
    with pytest.raises(ValueError, match="invalid blob key"):
        await store.head("../x")


# -- from_url ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "root"),
    [
        ("file:///var/lib/buildmax/blobs", "/var/lib/buildmax/blobs"),
        ("file://localhost/var/lib/buildmax/blobs", "/var/lib/buildmax/blobs"),
        ("file:///srv/with%20space", "/srv/with space"),
    ],
)
def test_from_url_roots_the_store_at_the_path(url, root):
    assert FileBlobStore.from_url(url).root == Path(root)


@pytest.mark.parametrize(
    "url", ["file://fileserver/share/blobs", "s3://bucket/blobs", "/var/lib/blobs"]
)
def test_from_url_refuses_what_is_not_a_local_file_url(url):
    with pytest.raises(ValueError, match="not a local file URL"):
        FileBlobStore.from_url(url)


@pytest.mark.parametrize("odd", ["x#y", "q?z", "a%41b"])
def test_the_default_store_of_a_data_dir_with_url_characters_stays_inside_it(tmp_path, odd):
    config = Config(data_dir=str(tmp_path / odd))
    store = FileBlobStore.from_url(config.effective_blob_store_url, config)
    assert store.root == config.data_path / "blobs"


def test_the_default_app_store_is_the_kernels_file_store_in_the_data_dir(tmp_path):
    app = create_app(Config(data_dir=str(tmp_path), load_plugins=""))
    store = app.services.get(BlobStore)
    assert isinstance(store, FileBlobStore)
    assert store.root == tmp_path.resolve() / "blobs"
    assert app.services.provider(BlobStore) == ESSENTIAL


# -- the buildmax_blob_stores hook ----------------------------------------------------


class MemoryBlobStore:
    """A dict-backed store: enough of the protocol for the app to hold it."""

    def __init__(self, url: str, config: Config) -> None:
        self.url = url
        self.config = config
        self.blobs: dict[str, bytes] = {}


class MemStorePlugin:
    def __init__(self) -> None:
        self.built: list[MemoryBlobStore] = []
        self.other_calls = 0

    def make(self, url: str, config: Config) -> MemoryBlobStore:
        store = MemoryBlobStore(url, config)
        self.built.append(store)
        return store

    def make_other(self, url: str, config: Config) -> MemoryBlobStore:
        self.other_calls += 1
        return MemoryBlobStore(url, config)

    @hookimpl
    def buildmax_blob_stores(self):
        return {"mem": self.make, "othermem": self.make_other}


def test_buildmax_blob_stores_a_plugin_scheme_becomes_the_apps_blob_store(tmp_path):
    plugin = MemStorePlugin()
    settings = Config(data_dir=str(tmp_path), blob_store_url="mem://x", load_plugins="")
    app = create_app(settings, extra_plugins=[("memstore", plugin)])
    assert len(plugin.built) == 1
    built = plugin.built[0]
    assert app.services.get(BlobStore) is built
    assert app.services.provider(BlobStore) == "memstore"
    # factory(url, config): the URL unchanged and the app's settings.
    assert built.url == "mem://x"
    assert built.config is app.settings
    # Only the configured scheme's factory runs.
    assert plugin.other_calls == 0
    # The kernel's file store was not built: nothing appeared in the data dir.
    assert not (tmp_path / "blobs").exists()


def test_buildmax_blob_stores_file_stays_the_kernels_even_if_a_plugin_offers_it(tmp_path):
    plugin_calls = []

    class Usurper:
        @hookimpl
        def buildmax_blob_stores(self):
            return {"file": lambda url, config: plugin_calls.append(url)}

    app = create_app(
        Config(data_dir=str(tmp_path), load_plugins=""), extra_plugins=[("usurper", Usurper())]
    )
    assert isinstance(app.services.get(BlobStore), FileBlobStore)
    assert app.services.provider(BlobStore) == ESSENTIAL
    assert plugin_calls == []


def test_buildmax_blob_stores_an_unknown_scheme_fails_app_creation_naming_it(tmp_path):
    settings = Config(data_dir=str(tmp_path), blob_store_url="nosuch://bucket", load_plugins="")
    with pytest.raises(ValueError, match="'nosuch'") as caught:
        create_app(settings, extra_plugins=[("memstore", MemStorePlugin())])
    message = str(caught.value)
    assert "no loaded plugin provides a blob store" in message
    assert "file" in message and "mem" in message  # the known schemes are listed


async def test_a_read_cancelled_while_the_file_opens_closes_the_file(store, monkeypatch):
    """A client that hangs up while its blob is being opened: the file the
    worker thread opened anyway is closed, not left for the collector."""
    import asyncio
    import builtins

    from buildmax import blobstore

    ref = await store.put("p", _stream(b"bytes"))
    opened = []

    def slow_open(path, mode="r", *args, **kwargs):
        time.sleep(0.2)
        fh = builtins.open(path, mode, *args, **kwargs)  # noqa: SIM115 - the test closes it
        opened.append(fh)
        return fh

    monkeypatch.setattr(blobstore, "open", slow_open, raising=False)
    reading = asyncio.ensure_future(anext(store.open(ref.key)))
    await asyncio.sleep(0.05)
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    for _ in range(50):
        if opened and opened[0].closed:
            break
        await asyncio.sleep(0.02)
    assert len(opened) == 1 and opened[0].closed


async def test_a_read_cancelled_while_its_file_closes_still_closes_it(store):
    """A client that hangs up while its finished read is being closed (the
    worker threads all busy, so the close waits its turn): the file is closed
    all the same, never left for the collector."""
    import asyncio
    import contextlib
    import threading
    from concurrent.futures import ThreadPoolExecutor

    ref = await store.put("p", _stream(b"bytes"))
    loop = asyncio.get_running_loop()
    busy = threading.Event()
    one_worker = ThreadPoolExecutor(max_workers=1)
    loop.set_default_executor(one_worker)
    chunks = store.open(ref.key)
    assert await anext(chunks) == b"bytes"
    frame = chunks.ag_frame
    assert frame is not None
    fh = frame.f_locals["fh"]
    blocker = loop.run_in_executor(None, busy.wait)  # the only worker is taken
    closing = asyncio.ensure_future(chunks.aclose())
    await asyncio.sleep(0.05)
    closing.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await closing
    busy.set()
    await blocker
    assert fh.closed
