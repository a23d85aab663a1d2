"""Serving stored blobs as downloads (``buildmax.downloads``): only the
recorded bytes are ever sent. A blob whose size changed is a 410 before
anything is sent, a small one is checked whole first, and a mismatch found
while streaming ends the body before its last piece.

The store is the real ``file`` store; its bytes are damaged on disk, behind
its back. The HTTP side (a cut-short answer closing the connection cleanly,
the clients naming it) is tested through the plugins' download routes.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from buildmax_hookspecs import BlobNotFound, BlobRef, BlobStoreUnavailable

from buildmax import blobstore
from buildmax.blobstore import FileBlobStore
from buildmax.downloads import open_verified
from buildmax.problems import BlobCorrupted
from buildmax.streaming import ResponseAborted

pytestmark = pytest.mark.engine_independent

DATA = bytes(range(256)) * 40  # 10,240 bytes
PIECE = 1024


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


@pytest.fixture
async def stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[FileBlobStore, str]:
    """A store reading ``PIECE`` bytes at a time, holding ``DATA``."""
    monkeypatch.setattr("buildmax.blobstore.CHUNK", PIECE)
    store = FileBlobStore(tmp_path)
    ref = await store.put("p", _one(DATA))
    return store, ref.key


async def _download(store: Any, key: str, **options: Any) -> tuple[bytes, Exception | None]:
    """What a client receives, and the exception that cut the body short."""
    options.setdefault("size", len(DATA))
    options.setdefault("sha256", hashlib.sha256(DATA).hexdigest())
    body = await open_verified(store, key, what="blob b1", **options)
    received = b""
    try:
        async for chunk in body:
            received += chunk
    except ResponseAborted as exc:
        return received, exc
    finally:
        await body.aclose()
    return received, None


def _damage(store: FileBlobStore, key: str, data: bytes) -> None:
    (store.root / key).write_bytes(data)


def _errors(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "buildmax.downloads"]


class _StaleHead:
    """A store whose ``head`` still answers the recorded size after the
    bytes changed (an object replaced between the two calls)."""

    def __init__(self, store: FileBlobStore, size: int) -> None:
        self.store, self.size = store, size

    async def head(self, key: str) -> BlobRef | None:
        return BlobRef(key=key, size=self.size, sha256=key.rsplit("/", 1)[-1])

    def open(self, key: str, byte_range: tuple[int, int] | None = None) -> AsyncIterator[bytes]:
        return self.store.open(key, byte_range)


async def test_intact_bytes_are_sent_whole_and_nothing_is_logged(stored, caplog):
    store, key = stored
    assert await _download(store, key) == (DATA, None)
    span = await _download(store, key, span=(100, 3099))
    assert span == (DATA[100:3100], None)
    assert _errors(caplog) == []


@pytest.mark.parametrize("change", [b"x", -1], ids=["larger", "smaller"])
async def test_a_blob_whose_size_changed_is_a_410_before_anything_is_sent(stored, caplog, change):
    """Mutation: drop the size check of ``open_verified`` and the smaller
    blob starts a 200 that is cut short instead."""
    store, key = stored
    _damage(store, key, DATA + change if isinstance(change, bytes) else DATA[:change])
    with pytest.raises(BlobCorrupted) as refused:
        await _download(store, key)
    assert refused.value.status == 410 and refused.value.slug == "blob-corrupted"
    assert "blob b1" in refused.value.detail and "not the recorded 10240" in refused.value.detail
    (logged,) = _errors(caplog)
    assert "blob b1" in logged


async def test_a_blob_of_one_piece_is_checked_whole_before_anything_is_sent(tmp_path, caplog):
    """Mutation: skip ``check_whole`` and the wrong bytes start a 200."""
    store = FileBlobStore(tmp_path)
    key = (await store.put("p", _one(b"the evidence"))).key
    _damage(store, key, b"the evidencE")
    with pytest.raises(BlobCorrupted, match="its sha256 is"):
        await _download(store, key, size=12, sha256=key.rsplit("/", 1)[-1])
    _damage(store, key, b"the evidence, and more")  # grown since its size was read
    with pytest.raises(BlobCorrupted, match="it holds more than its 12 recorded bytes"):
        await _download(_StaleHead(store, 12), key, size=12, sha256=key.rsplit("/", 1)[-1])
    empty = (await store.put("p", _one(b""))).key
    assert await _download(store, empty, size=0, sha256=empty.rsplit("/", 1)[-1]) == (b"", None)
    with pytest.raises(BlobCorrupted, match="its sha256 is"):
        await _download(store, empty, size=0, sha256="0" * 64)
    assert len(_errors(caplog)) == 3


async def test_other_bytes_of_the_same_size_are_cut_short_before_the_last_piece(stored, caplog):
    """Mutation: send the last piece without comparing the digest and the
    client receives all of the wrong bytes."""
    store, key = stored
    damaged = DATA[:5000] + b"!" + DATA[5001:]
    _damage(store, key, damaged)
    received, aborted = await _download(store, key)
    assert isinstance(aborted, ResponseAborted) and "blob b1" in str(aborted)
    assert received == damaged[: len(DATA) - PIECE]
    (logged,) = _errors(caplog)
    assert "its sha256 is" in logged


@pytest.mark.parametrize("change", [b"more", -300], ids=["grown", "shrunk"])
async def test_bytes_that_changed_after_their_size_was_read_are_cut_short(stored, caplog, change):
    """The size the store reported was right a moment ago: a grown blob never
    sends more than the recorded length, a shrunk one never ends as if
    complete (mutations: drop the check for bytes beyond the recorded length,
    or for an early end, and the body completes)."""
    store, key = stored
    _damage(store, key, DATA + change if isinstance(change, bytes) else DATA[:change])
    received, aborted = await _download(_StaleHead(store, len(DATA)), key)
    assert isinstance(aborted, ResponseAborted)
    assert len(received) < len(DATA)
    (logged,) = _errors(caplog)
    assert ("more than its 10240" if change == b"more" else "ended after") in logged


async def test_a_missing_blob_is_not_found_and_logged(stored, caplog):
    store, key = stored
    (store.root / key).unlink()
    with pytest.raises(BlobNotFound):
        await _download(store, key)
    assert any("missing" in message for message in _errors(caplog))


class _FailingMidway(_StaleHead):
    """A store that stops answering after its first chunk (an outage)."""

    async def _chunks(self, key: str) -> AsyncIterator[bytes]:
        async for chunk in self.store.open(key):
            yield chunk
            raise BlobStoreUnavailable("the bucket stopped answering")

    def open(self, key: str, byte_range: tuple[int, int] | None = None) -> AsyncIterator[bytes]:
        return self._chunks(key)


async def test_a_store_that_fails_mid_body_ends_the_answer_short_and_logged(stored, caplog):
    """Mutation: let ``BlobStoreUnavailable`` escape the body (the server
    would log it with a traceback as an error of the ASGI framework) and it
    reaches this test instead of ``ResponseAborted``."""
    store, key = stored
    received, aborted = await _download(_FailingMidway(store, len(DATA)), key)
    assert isinstance(aborted, ResponseAborted) and received == DATA[:PIECE]
    (logged,) = _errors(caplog)
    assert "blob b1" in logged and "the bucket stopped answering" in logged


async def test_a_blob_the_disk_cannot_read_is_the_store_failing_not_a_crash(stored, caplog):
    """A blob the disk refuses to read (here a symbolic link that loops; an
    I/O error or a permission reads the same): before anything is sent it
    is the store being unavailable (503 ``blob-store-unavailable`` with
    ``Retry-After``), never an unhandled ``OSError`` (a 500).

    Mutation: drop the ``OSError`` handling of the file store's ``head``."""
    store, key = stored
    path = store.root / key
    path.unlink()
    path.symlink_to(path)
    with pytest.raises(BlobStoreUnavailable, match="could not read blob"):
        await _download(store, key)


async def test_a_read_failing_mid_body_ends_the_answer_short_and_logged(
    stored, caplog, monkeypatch
):
    """The disk fails after the first piece (an I/O error on a bad sector):
    the answer ends short, logged, with no traceback.

    Mutation: drop the ``OSError`` handling of the file store's reads and
    the error escapes the body."""
    store, key = stored
    opened = blobstore._open_for_reading

    class FailingFile:
        def __init__(self, fh: Any) -> None:
            self.fh, self.reads = fh, 0

        def read(self, size: int) -> bytes:
            self.reads += 1
            if self.reads > 1:
                raise OSError(5, "Input/output error")
            return self.fh.read(size)  # type: ignore[no-any-return]

        def __getattr__(self, name: str) -> Any:
            return getattr(self.fh, name)

    async def failing_open(path: Path) -> Any:
        return FailingFile(await opened(path))

    monkeypatch.setattr(blobstore, "_open_for_reading", failing_open)
    received, aborted = await _download(store, key)
    assert isinstance(aborted, ResponseAborted) and received == DATA[:PIECE]
    (logged,) = _errors(caplog)
    assert "Input/output error" in logged
