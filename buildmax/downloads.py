"""Serving a stored blob as a download that sends exactly the recorded bytes.

A blob's bytes can change behind the store's back (a disk fault, an
operator's mistake, an object replaced in a bucket). A route that serves a
blob whose size and sha256 it recorded opens it with :func:`open_verified`:

- before any header is sent, the store's size for the key must be the
  recorded one, and a blob that fits in its first chunk is checked whole;
  otherwise the answer is 410 ``blob-corrupted`` (or :class:`BlobNotFound`
  when it is gone, which the route answers with its own problem);
- while the bytes stream, they are counted and hashed, and the chunk that
  completes the answer is held back until the count and the digest match.
  On a mismatch the body raises :class:`~buildmax.streaming.ResponseAborted`:
  the connection closes before the declared ``Content-Length`` is reached, so
  the client sees an incomplete answer rather than wrong bytes.

Every mismatch is logged (an error, without a traceback) naming the blob,
and so is a store that fails mid-body (the answer ends short the same way).
A byte range is counted but not hashed: its digest is not recorded.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncIterator

from buildmax_hookspecs import BlobNotFound, BlobStore, BlobStoreUnavailable

from .problems import BlobCorrupted
from .streaming import ResponseAborted

log = logging.getLogger("buildmax.downloads")


class VerifiedBlob:
    """A blob's bytes, counted and hashed as they are sent (see the module).

    Iterate it as a response body; closing it (Quart does when the answer
    ends or the client goes away) closes the blob."""

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        first: bytes,
        expected: int,
        sha256: str | None,
        what: str,
    ) -> None:
        self._chunks = chunks
        #: The blob's first bytes, read before the answer starts.
        self.first = first
        self._next: bytes | None = first
        self._expected = expected
        self._sha256 = sha256
        self._digest = hashlib.sha256()
        self._seen = 0
        self._finished = False
        self._what = what

    def __aiter__(self) -> VerifiedBlob:
        return self

    async def __anext__(self) -> bytes:
        if self._finished:
            raise StopAsyncIteration
        chunk = self._next if self._next is not None else await self._read()
        self._next = None
        if not chunk:
            self._finished = True
            reason = self._mismatch(self._seen, False, self._digest.hexdigest())
            if reason is not None:
                raise ResponseAborted(self._logged(reason))
            raise StopAsyncIteration
        self._seen += len(chunk)
        self._digest.update(chunk)
        if self._seen < self._expected:
            return chunk
        # The chunk that completes the answer: sent only if everything matches.
        self._finished = True
        more = self._seen <= self._expected and bool(await self._read())
        reason = self._mismatch(self._seen, more, self._digest.hexdigest())
        if reason is not None:
            raise ResponseAborted(self._logged(reason))
        return chunk

    async def _read(self) -> bytes:
        """The next chunk (empty at the end); a store that fails meanwhile
        ends the answer short, logged, rather than with a traceback."""
        try:
            return await anext(self._chunks, b"")
        except BlobStoreUnavailable as exc:
            log.error("the blob store failed while %s was sent: %s", self._what, exc)
            raise ResponseAborted(f"the blob store failed while {self._what} was sent") from None

    async def check_whole(self) -> None:
        """Read and check the whole blob now, before anything is sent (it is
        empty or no larger than its first chunk): :class:`BlobCorrupted`."""
        first = self._next or b""
        try:
            more = await anext(self._chunks, b"")
        except BaseException:
            await self.aclose()
            raise
        reason = self._mismatch(len(first), bool(more), hashlib.sha256(first).hexdigest())
        if reason is not None:
            await self.aclose()
            raise BlobCorrupted(self._logged(reason))

    def _mismatch(self, seen: int, more: bool, actual: str) -> str | None:
        """Why ``seen`` bytes (``more`` when the store had more) of digest
        ``actual`` are not the recorded ones, or ``None``."""
        if more or seen > self._expected:
            return f"it holds more than its {self._expected} recorded bytes"
        if seen != self._expected:
            return f"it ended after {seen} of its {self._expected} recorded bytes"
        if self._sha256 is not None and actual != self._sha256:
            return f"its sha256 is {actual}, not the recorded {self._sha256}"
        return None

    def _logged(self, reason: str) -> str:
        detail = f"the stored bytes of {self._what} are corrupted: {reason}"
        log.error("%s; the download was refused or cut short", detail)
        return detail

    async def aclose(self) -> None:
        """Close the blob."""
        close = getattr(self._chunks, "aclose", None)
        if close is not None:
            await close()


async def open_verified(
    store: BlobStore,
    key: str,
    *,
    size: int,
    sha256: str,
    span: tuple[int, int] | None = None,
    what: str,
) -> VerifiedBlob:
    """Open the blob at ``key`` recorded as ``size`` bytes of digest ``sha256``
    (``span``: only bytes ``start..end``, inclusive) to send as a download;
    ``what`` names it in logs and problems.

    Raises :class:`BlobNotFound` when the store has no such blob and
    :class:`BlobCorrupted` when its size differs or, for a blob that fits in
    its first chunk, its bytes do; a mismatch found later aborts the body."""
    ref = await store.head(key)
    if ref is None:
        log.error("the stored bytes of %s are missing (%s)", what, key)
        raise BlobNotFound(key)
    if ref.size != size:
        detail = (
            f"the stored bytes of {what} are corrupted: {ref.size} bytes, not the recorded {size}"
        )
        log.error("%s; the download was refused", detail)
        raise BlobCorrupted(detail)
    expected = size if span is None else span[1] - span[0] + 1
    chunks = store.open(key, span)
    first = await anext(chunks, b"")
    blob = VerifiedBlob(chunks, first, expected, sha256 if span is None else None, what)
    if not first or len(first) >= expected:
        await blob.check_whole()
    return blob
