"""The ``file`` blob store: content-addressed blobs on the local disk.

Layout: ``<root>/<prefix>/sha256/<digest>``, written first to
``<root>/.tmp/<random>`` and renamed into place only when complete (rename
is atomic on one filesystem), so a reader never sees half a blob and a
failed upload leaves nothing under the prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import secrets
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import unquote, urlsplit

from buildmax_hookspecs import (
    BLOB_TMP_DIR,
    BlobDigestMismatch,
    BlobKeyError,
    BlobNotFound,
    BlobRef,
    BlobStoreUnavailable,
    BlobTooLarge,
)
from buildmax_hookspecs import check_blob_key as _check_key

CHUNK = 256 * 1024
#: Bytes gathered into one piece: hashed and written by one worker-thread call.
WRITE_SIZE = 1024 * 1024
TMP_DIR = BLOB_TMP_DIR

__all__ = ["CHUNK", "TMP_DIR", "WRITE_SIZE", "BlobKeyError", "FileBlobStore"]


def _ref(key: str, stat: os.stat_result) -> BlobRef:
    return BlobRef(
        key=key,
        size=stat.st_size,
        sha256=key.rsplit("/", 1)[-1],
        modified_at=stat.st_mtime_ns // 1_000_000,
    )


def _unreadable(key: str, exc: OSError) -> BlobStoreUnavailable:
    """The disk refused to read a blob (an I/O error, a permission, a link
    loop): the store is failing, not the request."""
    return BlobStoreUnavailable(f"the disk could not read blob {key}: {exc.strerror or exc}")


def _fsync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (skipped on filesystems that
    cannot fsync a directory)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


async def _open_for_reading(path: Path) -> BinaryIO:
    """``open(path, "rb")`` in a worker thread. A caller cancelled meanwhile
    (its client hung up) gets the cancellation and the file, once opened,
    is closed rather than left for the collector."""
    opening: asyncio.Future[BinaryIO] = asyncio.ensure_future(asyncio.to_thread(open, path, "rb"))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        opening.add_done_callback(_close_opened)
        raise


def _close_opened(opening: asyncio.Future[BinaryIO]) -> None:
    if not opening.cancelled() and opening.exception() is None:
        opening.result().close()


class _TempFile:
    """The temporary file of one upload, hashed as it is written.

    Its methods run on worker threads, one at a time (a lock orders a
    cleanup after a write still in progress)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.digest = hashlib.sha256()
        self._fh: BinaryIO | None = None
        self._lock = threading.Lock()

    def create(self) -> None:
        """Create the file (and its directory, the first time)."""
        with self._lock:
            try:
                self._fh = open(self.path, "xb")  # noqa: SIM115 - closed by finish or discard
            except FileNotFoundError:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fh = open(self.path, "xb")  # noqa: SIM115

    def write(self, chunks: list[bytes]) -> None:
        """Hash and append ``chunks`` (``hashlib`` releases the GIL meanwhile)."""
        with self._lock:
            self._write(chunks)

    def _write(self, chunks: list[bytes]) -> None:
        assert self._fh is not None, "create() first"
        for chunk in chunks:
            self.digest.update(chunk)
            self._fh.write(chunk)

    def finish(
        self, chunks: list[bytes], directory: Path, expected_sha256: str | None
    ) -> os.stat_result:
        """Append the last ``chunks``, ``fsync`` and close; if the digest is
        ``expected_sha256`` (or none was given), rename the file to
        ``directory/<digest>`` (made if missing). The blob's stat."""
        with self._lock:
            self._write(chunks)
            assert self._fh is not None
            self._fh.flush()
            os.fsync(self._fh.fileno())
            stat = os.fstat(self._fh.fileno())  # a rename keeps size and mtime
            self._fh.close()
            actual = self.digest.hexdigest()
            if expected_sha256 is not None and actual != expected_sha256:
                raise BlobDigestMismatch(expected_sha256, actual)
            try:
                os.replace(self.path, directory / actual)
            except FileNotFoundError:
                directory.mkdir(parents=True, exist_ok=True)
                os.replace(self.path, directory / actual)
            _fsync_directory(directory)  # the rename survives a crash too
            return stat

    def discard(self) -> None:
        """Close and remove the file, if it is still there."""
        with self._lock:
            if self._fh is not None:
                self._fh.close()
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()


class FileBlobStore:
    """A :class:`~buildmax_hookspecs.BlobStore` on a local directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    @classmethod
    def from_url(cls, url: str, config: Any = None) -> FileBlobStore:
        """``file:///var/lib/buildmax/blobs`` -> a store rooted there."""
        parts = urlsplit(url)
        if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
            raise ValueError(f"not a local file URL: {url!r}")
        return cls(unquote(parts.path))

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    async def put(
        self,
        prefix: str,
        stream: AsyncIterator[bytes],
        *,
        max_bytes: int | None = None,
        expected_sha256: str | None = None,
    ) -> BlobRef:
        """Stream to a temporary file, hashing; move to ``<prefix>/sha256/<digest>``
        (only when the digest is ``expected_sha256``, if given).

        The chunks are gathered into pieces of about :data:`WRITE_SIZE`; each
        piece is hashed and written by one worker-thread call (``hashlib``
        releases the GIL), while the event loop reads the next piece from
        ``stream``; the piece after it is handed over only once that write is
        done, so the stream is read no faster than the disk takes it and at
        most two pieces per upload are in memory. The last piece, ``fsync``,
        the digest check and the rename are one thread call."""
        _check_key(prefix)
        directory = self._path(f"{prefix}/sha256")
        temp = _TempFile(self.root / TMP_DIR / secrets.token_hex(16))
        loop = asyncio.get_running_loop()
        # The file is created while the first piece arrives. ``busy`` is the
        # last thread call: the next one is made only once it is done.
        busy: asyncio.Future[Any] = loop.run_in_executor(None, temp.create)
        size = 0
        try:
            piece: list[bytes] = []
            gathered = 0
            async for chunk in stream:
                size += len(chunk)
                if max_bytes is not None and size > max_bytes:
                    raise BlobTooLarge(max_bytes)
                if piece and gathered + len(chunk) > WRITE_SIZE:
                    await busy
                    busy = loop.run_in_executor(None, temp.write, piece)
                    piece, gathered = [], 0
                piece.append(chunk)
                gathered += len(chunk)
            await busy
            busy = loop.run_in_executor(None, temp.finish, piece, directory, expected_sha256)
            stat: os.stat_result = await busy
        except BaseException:
            if not busy.done():
                busy.cancel()  # its result no longer matters; discard runs after it
            elif not busy.cancelled():
                busy.exception()  # retrieved: raised already, or superseded
            # Shielded: a second cancellation does not leave the file behind.
            await asyncio.shield(loop.run_in_executor(None, temp.discard))
            raise
        return _ref(f"{prefix}/sha256/{temp.digest.hexdigest()}", stat)

    async def open(
        self, key: str, byte_range: tuple[int, int] | None = None
    ) -> AsyncIterator[bytes]:
        """Stream the blob (optionally bytes ``start..end`` inclusive)."""
        path = self._path(key)
        try:
            fh = await _open_for_reading(path)
        except (FileNotFoundError, IsADirectoryError):
            raise BlobNotFound(key) from None
        except OSError as exc:
            raise _unreadable(key, exc) from None
        try:
            remaining: int | None = None
            if byte_range is not None:
                start, end = byte_range
                if start < 0 or end < start:
                    raise ValueError(f"invalid byte range {byte_range}")
                await asyncio.to_thread(fh.seek, start)
                remaining = end - start + 1
            while remaining is None or remaining > 0:
                want = CHUNK if remaining is None else min(CHUNK, remaining)
                try:
                    chunk = await asyncio.to_thread(fh.read, want)
                except OSError as exc:
                    raise _unreadable(key, exc) from None
                if not chunk:
                    break
                if remaining is not None:
                    remaining -= len(chunk)
                yield chunk
        finally:
            # Closed here, not in a worker thread: a close waiting for a free
            # worker would be dropped if the reader were cancelled meanwhile,
            # and closing a file opened for reading does not block.
            fh.close()

    async def head(self, key: str) -> BlobRef | None:
        """The blob's size and digest (from its key), or ``None``."""
        path = self._path(key)
        try:
            stat = await asyncio.to_thread(path.stat)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _unreadable(key, exc) from None
        if not path.is_file():
            return None
        return _ref(key, stat)

    async def delete(self, key: str) -> bool:
        """Remove the blob; ``True`` if it existed."""
        path = self._path(key)
        try:
            await asyncio.to_thread(path.unlink)
        except FileNotFoundError:
            return False
        return True

    async def aclose(self) -> None:
        """Nothing to release: files are opened per call."""

    async def sweep_temporary(self, older_than: int) -> int:
        """Remove temporary files of puts cut off by a dead server, last
        written before ``older_than`` (UTC epoch milliseconds); how many."""
        tmp_dir = self.root / TMP_DIR

        def sweep() -> int:
            removed = 0
            with contextlib.suppress(FileNotFoundError), os.scandir(tmp_dir) as entries:
                for entry in entries:
                    if entry.is_file() and entry.stat().st_mtime_ns // 1_000_000 < older_than:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(entry.path)
                            removed += 1
            return removed

        return await asyncio.to_thread(sweep)

    async def list(self, prefix: str) -> AsyncIterator[BlobRef]:
        """Every blob under ``prefix`` (a key prefix ending at a ``/`` boundary)."""
        base = self._path(prefix.rstrip("/"))

        def walk() -> list[BlobRef]:
            found: list[BlobRef] = []
            if not base.is_dir():
                return found
            for dirpath, _dirs, files in os.walk(base):
                for name in files:
                    full = Path(dirpath) / name
                    found.append(_ref(full.relative_to(self.root).as_posix(), full.stat()))
            return sorted(found, key=lambda ref: ref.key)

        for ref in await asyncio.to_thread(walk):
            yield ref
