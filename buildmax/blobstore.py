"""The ``file`` blob store: content-addressed blobs on the local disk.

Layout: ``<root>/<prefix>/sha256/<digest>``, written first to
``<root>/.tmp/<random>`` and renamed into place only when complete (rename
is atomic on one filesystem), so a reader never sees half a blob and a
failed upload leaves nothing under the prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from buildmax_hookspecs import BlobDigestMismatch, BlobNotFound, BlobRef, BlobTooLarge

CHUNK = 256 * 1024
#: Bytes gathered before one write to the temporary file.
WRITE_SIZE = 1024 * 1024
TMP_DIR = ".tmp"


class BlobKeyError(ValueError):
    """A key or prefix that would leave the store's root."""


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise BlobKeyError(f"invalid blob key {key!r}")
    if parts[0] == TMP_DIR or "\\" in key or "\x00" in key:
        raise BlobKeyError(f"invalid blob key {key!r}")
    return key


def _ref(key: str, stat: os.stat_result) -> BlobRef:
    return BlobRef(
        key=key,
        size=stat.st_size,
        sha256=key.rsplit("/", 1)[-1],
        modified_at=stat.st_mtime_ns // 1_000_000,
    )


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
        (only when the digest is ``expected_sha256``, if given)."""
        _check_key(prefix)
        tmp_dir = self.root / TMP_DIR
        await asyncio.to_thread(tmp_dir.mkdir, parents=True, exist_ok=True)
        tmp = tmp_dir / secrets.token_hex(16)
        digest = hashlib.sha256()
        size = 0
        fh = await asyncio.to_thread(open, tmp, "xb")
        try:
            try:
                pending = bytearray()  # written in pieces of WRITE_SIZE: fewer thread hops
                async for chunk in stream:
                    size += len(chunk)
                    if max_bytes is not None and size > max_bytes:
                        raise BlobTooLarge(max_bytes)
                    digest.update(chunk)
                    pending += chunk
                    if len(pending) >= WRITE_SIZE:
                        await asyncio.to_thread(fh.write, bytes(pending))
                        pending.clear()
                if pending:
                    await asyncio.to_thread(fh.write, bytes(pending))
                await asyncio.to_thread(fh.flush)
                await asyncio.to_thread(os.fsync, fh.fileno())
            finally:
                await asyncio.to_thread(fh.close)
            if expected_sha256 is not None and digest.hexdigest() != expected_sha256:
                raise BlobDigestMismatch(expected_sha256, digest.hexdigest())
            key = f"{prefix}/sha256/{digest.hexdigest()}"
            final = self._path(key)
            await asyncio.to_thread(final.parent.mkdir, parents=True, exist_ok=True)
            await asyncio.to_thread(os.replace, tmp, final)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        return _ref(key, await asyncio.to_thread(final.stat))

    async def open(
        self, key: str, byte_range: tuple[int, int] | None = None
    ) -> AsyncIterator[bytes]:
        """Stream the blob (optionally bytes ``start..end`` inclusive)."""
        path = self._path(key)
        try:
            fh = await asyncio.to_thread(open, path, "rb")
        except (FileNotFoundError, IsADirectoryError):
            raise BlobNotFound(key) from None
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
                chunk = await asyncio.to_thread(fh.read, want)
                if not chunk:
                    break
                if remaining is not None:
                    remaining -= len(chunk)
                yield chunk
        finally:
            await asyncio.to_thread(fh.close)

    async def head(self, key: str) -> BlobRef | None:
        """The blob's size and digest (from its key), or ``None``."""
        path = self._path(key)
        try:
            stat = await asyncio.to_thread(path.stat)
        except FileNotFoundError:
            return None
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
