"""The ``s3`` blob store: content-addressed blobs in an S3-compatible bucket.

``s3://<bucket>/<root>`` keeps the blob ``<key>`` as the object
``<root>/<key>``. A blob becomes visible at its final key only whole and
only once its digest is known and checked, so no reader (and no collector)
ever sees half a blob:

- a blob smaller than one part is gathered in memory and sent with one
  ``PutObject`` to its final key, with its sha256 for the server to check;
- a larger blob with an expected digest goes to its final key as a multipart
  upload, completed only if the digest matches (an incomplete multipart
  upload is invisible);
- a larger blob of unknown digest goes to ``<root>/.tmp/<random>`` as a
  multipart upload, then is copied server-side to its final key.

On any failure (too large, wrong digest, a cancelled request, an S3 error)
the multipart upload is aborted or the temporary object deleted before the
error is raised. A server killed mid-upload leaves temporary bytes that
:meth:`S3BlobStore.sweep_temporary` removes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import secrets
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from typing import Any, BinaryIO
from urllib.parse import unquote, urlsplit

from botocore.exceptions import BotoCoreError, ClientError
from buildmax_hookspecs import (
    BLOB_TMP_DIR,
    BlobDigestMismatch,
    BlobNotFound,
    BlobRef,
    BlobStoreUnavailable,
    BlobTooLarge,
)
from buildmax_hookspecs import check_blob_key as check_key

from buildmax.database.base import uncancellable

from .settings import S3Settings

log = logging.getLogger(__name__)

#: Bytes of an upload's part kept in memory before they go to its spool file.
SPOOL_PIECE = 1024 * 1024
#: Bytes read from S3 per chunk of a download.
CHUNK = 256 * 1024
_MISSING = frozenset({"404", "NoSuchKey", "NotFound"})


def _millis(when: datetime) -> int:
    return int(when.timestamp() * 1000)


def _missing(exc: ClientError) -> bool:
    return str(exc.response.get("Error", {}).get("Code")) in _MISSING


@contextlib.contextmanager
def _answering() -> Iterator[None]:
    """Turn S3 being unreachable, slow, failing (5xx) or refusing our
    credentials into :class:`BlobStoreUnavailable`; other S3 errors (a
    missing key, a bad request) pass through."""
    try:
        yield
    except BotoCoreError as exc:  # connection, timeout, credentials
        raise BlobStoreUnavailable(f"S3 could not be reached: {exc}") from exc
    except ClientError as exc:
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if status >= 500 or status in (401, 403):
            raise BlobStoreUnavailable(f"S3 refused: {exc}") from exc
        raise
    except OSError as exc:  # the HTTP client's own errors (timeouts included)
        raise BlobStoreUnavailable(f"S3 could not be reached: {exc!r}") from exc


class S3BlobStore:
    """A :class:`~buildmax_hookspecs.BlobStore` in an S3 bucket."""

    def __init__(self, bucket: str, root: str, settings: S3Settings | None = None) -> None:
        self.bucket = bucket
        self.root = root.strip("/")
        self.settings = settings or S3Settings()
        self._client: Any = None
        self._exit: contextlib.AsyncExitStack | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None

    @classmethod
    def from_url(cls, url: str, config: Any = None) -> S3BlobStore:
        """``s3://bucket/optional/root`` -> a store there, with the
        ``[plugins.s3]`` settings of ``config``. Credentials are refused in
        the URL: they come from the AWS chain."""
        parts = urlsplit(url)
        if parts.scheme != "s3" or not parts.hostname:
            raise ValueError(f"not an s3://<bucket>/<root> URL: {url!r}")
        if parts.username or parts.password or parts.port is not None:
            raise ValueError(
                "an s3:// URL names a bucket only: credentials come from the AWS chain "
                "(AWS_ACCESS_KEY_ID, the shared credentials file, a role), the endpoint "
                "from [plugins.s3] endpoint_url"
            )
        if parts.query or parts.fragment:
            raise ValueError(f"an s3:// URL takes no query or fragment: {url!r}")
        root = unquote(parts.path).strip("/")
        if root:
            check_key(root)
        raw = getattr(config, "plugins", {}).get("s3", {}) if config is not None else {}
        return cls(parts.hostname, root, S3Settings.from_mapping(raw))

    def _object(self, key: str) -> str:
        return f"{self.root}/{key}" if self.root else key

    def _key(self, name: str) -> str:
        return name[len(self.root) + 1 :] if self.root else name

    def _ref(self, key: str, size: int, modified: datetime | None) -> BlobRef:
        return BlobRef(
            key=key,
            size=size,
            sha256=key.rsplit("/", 1)[-1],
            modified_at=None if modified is None else _millis(modified),
        )

    async def client(self) -> Any:
        """The S3 client, opened on first use in the running event loop."""
        with _answering():
            return await self._open_client()

    async def _open_client(self) -> Any:
        loop = asyncio.get_running_loop()
        if self._client is not None and self._loop is loop:
            return self._client
        if self._lock is None or self._loop is not loop:
            self._lock, self._loop, self._client = asyncio.Lock(), loop, None
        async with self._lock:
            if self._client is None:
                # Imported here: aiobotocore takes most of a second to import,
                # paid otherwise by every process that loads the plugin.
                from aiobotocore.config import AioConfig
                from aiobotocore.session import get_session

                settings = self.settings
                config = AioConfig(
                    s3={"addressing_style": settings.addressing_style},
                    retries={"total_max_attempts": settings.max_attempts, "mode": "standard"},
                    connect_timeout=10,
                    read_timeout=60,
                )
                exit_stack = contextlib.AsyncExitStack()
                self._client = await exit_stack.enter_async_context(
                    get_session().create_client(
                        "s3",
                        endpoint_url=settings.endpoint_url or None,
                        region_name=settings.region or None,
                        config=config,
                    )
                )
                self._exit = exit_stack
        return self._client

    async def aclose(self) -> None:
        """Close the client (the next call opens a new one)."""
        exit_stack, self._exit, self._client = self._exit, None, None
        if exit_stack is not None:
            await exit_stack.aclose()

    async def put(
        self,
        prefix: str,
        stream: AsyncIterator[bytes],
        *,
        max_bytes: int | None = None,
        expected_sha256: str | None = None,
    ) -> BlobRef:
        """Stream into ``<prefix>/sha256/<digest>``; see the module's docstring."""
        check_key(prefix)
        client = await self.client()
        part_size = self.settings.part_size
        digest = hashlib.sha256()
        size = 0
        spool = _Spool(self.settings.spool_dir or None)
        upload: _Multipart | None = None
        try:
            async for chunk in stream:
                size += len(chunk)
                if max_bytes is not None and size > max_bytes:
                    raise BlobTooLarge(max_bytes)
                digest.update(chunk)
                await spool.add(chunk)
                if spool.size < part_size:
                    continue
                with _answering():
                    if upload is None:
                        upload = await _Multipart.start(
                            client,
                            self.bucket,
                            self._object(f"{prefix}/sha256/{expected_sha256}")
                            if expected_sha256 is not None
                            else self._object_tmp(secrets.token_hex(16)),
                            temporary=expected_sha256 is None,
                        )
                    await upload.send(await spool.body())
                await spool.close()
                spool = _Spool(self.settings.spool_dir or None)
            actual = digest.hexdigest()
            if expected_sha256 is not None and actual != expected_sha256:
                raise BlobDigestMismatch(expected_sha256, actual)
            key = f"{prefix}/sha256/{actual}"
            with _answering():
                if upload is None:
                    await client.put_object(
                        Bucket=self.bucket,
                        Key=self._object(key),
                        Body=await spool.body(),
                        ChecksumSHA256=base64.b64encode(digest.digest()).decode(),
                    )
                else:
                    if spool.size:
                        await upload.send(await spool.body())
                    await upload.complete()
                    if upload.temporary:
                        await client.copy_object(
                            Bucket=self.bucket,
                            Key=self._object(key),
                            CopySource={"Bucket": self.bucket, "Key": upload.name},
                        )
                        await upload.discard()
        except BaseException:
            if upload is not None:
                await uncancellable(upload.discard())
            raise
        finally:
            await uncancellable(spool.close())
        return BlobRef(key=key, size=size, sha256=actual)

    def _object_tmp(self, name: str) -> str:
        return self._object(f"{BLOB_TMP_DIR}/{name}")

    async def open(
        self, key: str, byte_range: tuple[int, int] | None = None
    ) -> AsyncIterator[bytes]:
        """Stream the blob (optionally bytes ``start..end`` inclusive)."""
        check_key(key)
        extra: dict[str, str] = {}
        if byte_range is not None:
            start, end = byte_range
            if start < 0 or end < start:
                raise ValueError(f"invalid byte range {byte_range}")
            extra["Range"] = f"bytes={start}-{end}"
        client = await self.client()
        try:
            with _answering():
                response = await client.get_object(
                    Bucket=self.bucket, Key=self._object(key), **extra
                )
        except ClientError as exc:
            if _missing(exc):
                raise BlobNotFound(key) from None
            raise
        body = response["Body"]
        try:
            while True:
                with _answering():
                    chunk = await body.read(CHUNK)
                if not chunk:
                    break
                yield chunk
        finally:
            body.close()

    async def head(self, key: str) -> BlobRef | None:
        """The blob's size, digest and write time, or ``None``."""
        check_key(key)
        client = await self.client()
        try:
            with _answering():
                found = await client.head_object(Bucket=self.bucket, Key=self._object(key))
        except ClientError as exc:
            if _missing(exc):
                return None
            raise
        return self._ref(key, found["ContentLength"], found.get("LastModified"))

    async def delete(self, key: str) -> bool:
        """Remove the blob; ``True`` if it existed."""
        if await self.head(key) is None:
            return False
        client = await self.client()
        with _answering():
            await client.delete_object(Bucket=self.bucket, Key=self._object(key))
        return True

    async def list(self, prefix: str) -> AsyncIterator[BlobRef]:
        """Every blob under ``prefix``, in key order."""
        check_key(prefix.rstrip("/"))
        client = await self.client()
        pages = (
            client.get_paginator("list_objects_v2")
            .paginate(Bucket=self.bucket, Prefix=self._object(prefix))
            .__aiter__()
        )
        while True:
            with _answering():
                page = await anext(pages, None)
            if page is None:
                break
            for item in page.get("Contents", []):
                yield self._ref(self._key(item["Key"]), item["Size"], item["LastModified"])

    async def sweep_temporary(self, older_than: int) -> int:
        """Remove what puts cut off by a dead server left (temporary objects
        and unfinished multipart uploads started before ``older_than``, UTC
        epoch milliseconds); how many."""
        with _answering():
            return await self._sweep(await self.client(), older_than)

    async def _sweep(self, client: Any, older_than: int) -> int:
        removed = 0
        tmp = self._object_tmp("")
        async for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=tmp
        ):
            for item in page.get("Contents", []):
                if _millis(item["LastModified"]) < older_than:
                    await client.delete_object(Bucket=self.bucket, Key=item["Key"])
                    removed += 1
        prefix = f"{self.root}/" if self.root else ""
        async for page in client.get_paginator("list_multipart_uploads").paginate(
            Bucket=self.bucket, Prefix=prefix
        ):
            for item in page.get("Uploads", []):
                if _millis(item["Initiated"]) < older_than:
                    await client.abort_multipart_upload(
                        Bucket=self.bucket, Key=item["Key"], UploadId=item["UploadId"]
                    )
                    removed += 1
        return removed


class _Spool:
    """A part of an upload on its way to S3: up to :data:`SPOOL_PIECE` bytes
    in memory, the rest in a local temporary file (removed when closed), so
    an upload in flight holds about one piece in memory whatever the part
    size. A part that never outgrows memory is sent from memory."""

    def __init__(self, directory: str | None) -> None:
        self.directory = directory
        self.size = 0
        self._memory: list[bytes] = []
        self._in_memory = 0
        self._file: BinaryIO | None = None
        # The worker thread writing and close() agree under it on whether
        # the file exists and is still wanted.
        self._lock = threading.Lock()
        self._closed = False

    async def add(self, chunk: bytes) -> None:
        """Append ``chunk``; a full piece goes to the file, in a thread."""
        self._memory.append(chunk)
        self._in_memory += len(chunk)
        self.size += len(chunk)
        if self._in_memory >= SPOOL_PIECE:
            await self._flush()

    async def _flush(self) -> None:
        pieces, self._memory, self._in_memory = self._memory, [], 0
        if pieces:
            try:
                await asyncio.to_thread(self._write, pieces)
            except OSError as exc:  # the local disk, not S3, yet the store cannot take bytes
                raise BlobStoreUnavailable(
                    f"could not spool an upload to local disk: {exc}"
                ) from exc

    def _write(self, pieces: list[bytes]) -> None:
        with self._lock:
            if self._closed:
                return  # the upload ended while this piece was on its way
            if self._file is None:
                self._file = tempfile.TemporaryFile(dir=self.directory)  # noqa: SIM115 - see close
            self._file.writelines(pieces)

    async def body(self) -> bytes | BinaryIO:
        """What to send: the bytes, or the file rewound to its start."""
        if self._file is None:
            return b"".join(self._memory)
        await self._flush()
        await asyncio.to_thread(self._file.seek, 0)
        return self._file

    async def close(self) -> None:
        """Drop the bytes and remove the file (after a write in progress)."""
        self._memory, self._in_memory = [], 0
        await asyncio.to_thread(self._close)

    def _close(self) -> None:
        with self._lock:
            self._closed = True
            if self._file is not None:
                self._file.close()
                self._file = None


class _Multipart:
    """One multipart upload to the object ``name`` (a temporary one, or the
    blob's final key when its digest was known in advance)."""

    def __init__(
        self, client: Any, bucket: str, name: str, upload_id: str, temporary: bool
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.name = name
        self.upload_id = upload_id
        self.temporary = temporary
        self.parts: list[dict[str, Any]] = []
        self.completed = False

    @classmethod
    async def start(cls, client: Any, bucket: str, name: str, *, temporary: bool) -> _Multipart:
        created = await client.create_multipart_upload(Bucket=bucket, Key=name)
        return cls(client, bucket, name, created["UploadId"], temporary)

    async def send(self, data: bytes | BinaryIO) -> None:
        """Upload the next part."""
        number = len(self.parts) + 1
        sent = await self.client.upload_part(
            Bucket=self.bucket,
            Key=self.name,
            UploadId=self.upload_id,
            PartNumber=number,
            Body=data,
        )
        self.parts.append({"PartNumber": number, "ETag": sent["ETag"]})

    async def complete(self) -> None:
        """Make the object appear, whole."""
        await self.client.complete_multipart_upload(
            Bucket=self.bucket,
            Key=self.name,
            UploadId=self.upload_id,
            MultipartUpload={"Parts": self.parts},
        )
        self.completed = True

    async def discard(self) -> None:
        """Abort the upload, or delete the temporary object it made (never a
        final key: identical bytes there may belong to another artifact).
        Best effort: what a failure here leaves, ``sweep_temporary`` removes."""
        try:
            if not self.completed:
                await self.client.abort_multipart_upload(
                    Bucket=self.bucket, Key=self.name, UploadId=self.upload_id
                )
            elif self.temporary:
                await self.client.delete_object(Bucket=self.bucket, Key=self.name)
        except Exception:
            log.warning("could not clean up the upload to %s", self.name, exc_info=True)
