"""Typed calls for the artifacts plugin's routes, on top of :mod:`buildmax.client`.

:class:`ArtifactsClient` wraps a kernel :class:`~buildmax.client.Client`
(and :class:`AsyncArtifactsClient` an :class:`~buildmax.client.AsyncClient`)::

    with Client() as bmx:
        artifacts = ArtifactsClient(bmx)
        made = artifacts.upload("web", "build/report.xml", attempt=attempt_id, generation=1)
        artifacts.download("web", made["id"], "/tmp/report.xml")

An upload streams the file from disk with its sha256, so the server refuses
bytes that changed on the way (or on disk while they were sent). A download
streams into a temporary file beside the destination and renames it into
place only when its sha256 is the artifact's. Neither is retried on its own:
a body that failed half-way is sent again by calling again.

Wrapping a kernel client with one of these gives it the plugin's problems as
typed exceptions (:data:`ERRORS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import mimetypes
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

from buildmax.client import (
    BlobMissing,
    BlobStoreUnavailable,
    BuildMaxError,
    Calls,
    Conflict,
    OverAsyncClient,
    OverClient,
    ValidationError,
    present,
    space_path,
)
from buildmax_artifacts import problems

#: Bytes read from disk per piece of an upload or written per piece of a download.
PIECE = 256 * 1024
#: Media types guessed from names: Python's own table (not the machine's, so
#: the guess is the same everywhere) plus what agents often upload.
_TYPES = mimetypes.MimeTypes(filenames=())
for _suffix, _type in ((".log", "text/plain"), (".patch", "text/x-diff"), (".diff", "text/x-diff")):
    _TYPES.add_type(_type, _suffix)


class QuotaExceeded(Conflict, answers=problems.QuotaExceeded):
    """the artifact would exceed a storage quota."""


class DigestMismatch(ValidationError, answers=problems.DigestMismatch):
    """the bytes are not the ones the sha256 names."""


class RangeNotSatisfiable(BuildMaxError, answers=problems.RangeNotSatisfiable):
    """the byte range asked for lies outside the artifact."""


class CorruptDownload(Exception):
    """The downloaded bytes are not the artifact's (nothing was written)."""


#: The plugin's exception classes, one per problem of :mod:`buildmax_artifacts.problems`
#: (bytes gone from the store raise the kernel's :class:`~buildmax.client.BlobMissing`).
ERRORS: tuple[type[BuildMaxError], ...] = (QuotaExceeded, DigestMismatch, RangeNotSatisfiable)

_One = TypeVar("_One")
_Many = TypeVar("_Many")
_Done = TypeVar("_Done")
Source = str | os.PathLike[str] | bytes


def _links(
    task: str | None, attempt: str | None, generation: int | None, override_reason: str | None
) -> dict[str, str]:
    """The query naming what an upload belongs to; ``ValueError`` for an
    attempt without its generation (the server would refuse it)."""
    if attempt is not None and generation is None:
        raise ValueError("an upload naming an attempt names its generation too")
    return present(
        task=task,
        attempt=attempt,
        generation=None if generation is None else str(generation),
        override_reason=override_reason,
    )


def _upload_request(
    source: Source, name: str | None, media_type: str | None, links: dict[str, str]
) -> tuple[dict[str, str], dict[str, str], int, str]:
    """Query, headers, size and digest of an upload (a file is hashed first)."""
    if isinstance(source, bytes):
        if name is None:
            raise ValueError("name is required when uploading bytes")
        size, digest = len(source), hashlib.sha256(source).hexdigest()
    else:
        path = Path(source)
        name = path.name if name is None else name
        with path.open("rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
            size = os.fstat(fh.fileno()).st_size
    media_type = media_type or _TYPES.guess_type(name)[0] or "application/octet-stream"
    query = {**present(name=name, sha256=digest), **links}
    headers = {"Content-Type": media_type, "Content-Length": str(size)}
    return query, headers, size, digest


def _read_pieces(fh: IO[bytes], size: int) -> Iterator[bytes]:
    """The file's first ``size`` bytes, piece by piece."""
    left = size
    while left > 0:
        piece = fh.read(min(PIECE, left))
        if not piece:
            raise OSError("the file shrank while it was uploaded")
        left -= len(piece)
        yield piece


def _temporary_beside(dest: Path) -> Path:
    return dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.part")


def _check(expected: str, actual: str, temporary: Path) -> None:
    if actual != expected:
        temporary.unlink(missing_ok=True)
        raise CorruptDownload(f"the bytes' sha256 is {actual}, not the artifact's {expected}")


class _ArtifactRoutes(Calls[_One, _Many, _Done]):
    """The JSON calls, shared by both clients."""

    def list(
        self,
        space: str,
        *,
        task: str | None = None,
        attempt: str | None = None,
        media_type: str | None = None,
    ) -> _Many:
        """The space's live artifacts, newest first (viewers)."""
        params = present(task=task, attempt=attempt, media_type=media_type)
        return self._many(space_path(space, "artifacts"), params)

    def get(self, space: str, artifact: str) -> _One:
        """An artifact's metadata."""
        return self._one("GET", space_path(space, "artifacts", artifact))

    def delete(self, space: str, artifact: str) -> _Done:
        """Tombstone an artifact (members); its bytes go with the collector."""
        return self._done("DELETE", space_path(space, "artifacts", artifact))

    def pin(self, space: str, artifact: str) -> _One:
        """Keep an artifact past retention."""
        return self._one("POST", space_path(space, "artifacts", artifact, "pin"))

    def unpin(self, space: str, artifact: str) -> _One:
        """Let retention expire an artifact again."""
        return self._one("POST", space_path(space, "artifacts", artifact, "unpin"))


class ArtifactsClient(OverClient, _ArtifactRoutes[dict[str, Any], list[dict[str, Any]], None]):
    """The artifacts plugin's calls over a synchronous :class:`~buildmax.client.Client`."""

    ERRORS = ERRORS

    def upload(
        self,
        space: str,
        source: Source,
        *,
        name: str | None = None,
        media_type: str | None = None,
        task: str | None = None,
        attempt: str | None = None,
        generation: int | None = None,
        override_reason: str | None = None,
    ) -> dict[str, Any]:
        """Upload a file (streamed from disk) or bytes; the new artifact.

        ``name`` defaults to the file's name, ``media_type`` to a guess from
        the name (else ``application/octet-stream``). ``attempt`` (with its
        ``generation``) attaches it to an attempt you own; a space admin
        attaches to someone else's with ``override_reason`` (audited). An
        attempt's token that names no attempt attaches to its own."""
        links = _links(task, attempt, generation, override_reason)
        query, headers, size, _ = _upload_request(source, name, media_type, links)
        with contextlib.ExitStack() as stack:
            if isinstance(source, bytes):
                content: bytes | Iterator[bytes] = source
            else:
                content = _read_pieces(stack.enter_context(Path(source).open("rb")), size)
            with self.client.stream(
                "POST",
                space_path(space, "artifacts"),
                params=query,
                content=content,
                headers=headers,
            ) as response:
                response.read()
                return response.json()  # type: ignore[no-any-return]

    def download(self, space: str, artifact: str, dest: str | os.PathLike[str]) -> dict[str, Any]:
        """Write the artifact's bytes to ``dest``; its metadata.

        Raises :class:`CorruptDownload` (and writes nothing) when the bytes
        are not the artifact's."""
        dest = Path(dest)
        temporary = _temporary_beside(dest)
        digest = hashlib.sha256()
        try:
            with (
                self.client.stream(
                    "GET", space_path(space, "artifacts", artifact, "content")
                ) as got,
                temporary.open("xb") as fh,
            ):
                for piece in got.iter_bytes(PIECE):
                    digest.update(piece)
                    fh.write(piece)
                expected = got.headers["ETag"].strip('"')
            _check(expected, digest.hexdigest(), temporary)
            temporary.replace(dest)
        finally:
            temporary.unlink(missing_ok=True)
        return self.get(space, artifact)


class AsyncArtifactsClient(
    OverAsyncClient,
    _ArtifactRoutes[Awaitable[dict[str, Any]], Awaitable[list[dict[str, Any]]], Awaitable[None]],
):
    """The asynchronous twin of :class:`ArtifactsClient`, over an
    :class:`~buildmax.client.AsyncClient`."""

    ERRORS = ERRORS

    async def upload(
        self,
        space: str,
        source: Source,
        *,
        name: str | None = None,
        media_type: str | None = None,
        task: str | None = None,
        attempt: str | None = None,
        generation: int | None = None,
        override_reason: str | None = None,
    ) -> dict[str, Any]:
        """Like :meth:`ArtifactsClient.upload`, awaited (disk reads run in a thread)."""
        links = _links(task, attempt, generation, override_reason)
        query, headers, size, _ = await asyncio.to_thread(
            _upload_request, source, name, media_type, links
        )
        async with contextlib.AsyncExitStack() as stack:
            content: bytes | AsyncIterator[bytes]
            if isinstance(source, bytes):
                content = source
            else:
                fh = await asyncio.to_thread(Path(source).open, "rb")
                stack.callback(fh.close)
                content = _read_pieces_async(fh, size)
            async with self.client.stream(
                "POST",
                space_path(space, "artifacts"),
                params=query,
                content=content,
                headers=headers,
            ) as response:
                await response.aread()
                return response.json()  # type: ignore[no-any-return]

    async def download(
        self, space: str, artifact: str, dest: str | os.PathLike[str]
    ) -> dict[str, Any]:
        """Like :meth:`ArtifactsClient.download`, awaited."""
        dest = Path(dest)
        temporary = _temporary_beside(dest)
        digest = hashlib.sha256()
        try:
            async with self.client.stream(
                "GET", space_path(space, "artifacts", artifact, "content")
            ) as got:
                fh = await asyncio.to_thread(temporary.open, "xb")
                try:
                    async for piece in got.aiter_bytes(PIECE):
                        digest.update(piece)
                        await asyncio.to_thread(fh.write, piece)
                finally:
                    # Shielded: a cancelled download still closes its file.
                    await asyncio.shield(asyncio.to_thread(fh.close))
                expected = got.headers["ETag"].strip('"')
            _check(expected, digest.hexdigest(), temporary)
            await asyncio.to_thread(temporary.replace, dest)
        finally:
            temporary.unlink(missing_ok=True)
        return await self.get(space, artifact)


async def _read_pieces_async(fh: IO[bytes], size: int) -> AsyncIterator[bytes]:
    pieces = _read_pieces(fh, size)
    while (piece := await asyncio.to_thread(next, pieces, None)) is not None:
        yield piece


__all__ = [
    "ArtifactsClient",
    "AsyncArtifactsClient",
    "BlobMissing",
    "BlobStoreUnavailable",
    "CorruptDownload",
    "DigestMismatch",
    "QuotaExceeded",
    "RangeNotSatisfiable",
]
