"""Controlled faults for qualification runs. Test-only: importing this
module outside a qualification run (``BUILDMAX_QUALIFICATION=1``) raises, so
a server that finds it installed reports it as a plugin that failed to load
and never runs with it.

The faults are switched at run time by files in ``$BUILDMAX_FAULTS_DIR``
(the qualification runner arms and clears them and records each injection
in the journey's manifest):

``blob-put-after-store``
    The ``faulty+file://`` blob store stores a put's bytes, then fails as an
    unavailable store would: the bytes exist, the caller hears a failure.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

if os.environ.get("BUILDMAX_QUALIFICATION") != "1":
    raise RuntimeError(
        "buildmax-qualification-faults is a test-only plugin and refuses to load outside "
        "a qualification run (BUILDMAX_QUALIFICATION=1); uninstall it from servers"
    )

from buildmax_hookspecs import BlobRef, BlobStoreUnavailable, hookimpl

from buildmax.blobstore import FileBlobStore

#: The URL scheme of the fault-injecting store: ``faulty+file:///path``.
SCHEME = "faulty+file"
BLOB_PUT_AFTER_STORE = "blob-put-after-store"


def armed(fault: str) -> bool:
    """Whether the runner has armed ``fault``."""
    directory = os.environ.get("BUILDMAX_FAULTS_DIR")
    return bool(directory) and (Path(directory) / fault).exists()


class FaultyBlobStore(FileBlobStore):
    """The file blob store, failing a put after its bytes are stored when
    ``blob-put-after-store`` is armed."""

    async def put(
        self,
        prefix: str,
        stream: AsyncIterator[bytes],
        *,
        max_bytes: int | None = None,
        expected_sha256: str | None = None,
    ) -> BlobRef:
        stored = await super().put(
            prefix, stream, max_bytes=max_bytes, expected_sha256=expected_sha256
        )
        if armed(BLOB_PUT_AFTER_STORE):
            raise BlobStoreUnavailable(
                f"injected fault {BLOB_PUT_AFTER_STORE}: {stored.key} stored"
            )
        return stored


def _make(url: str, config: Any = None) -> FaultyBlobStore:
    store = FileBlobStore.from_url(url.removeprefix("faulty+"), config)
    return FaultyBlobStore(store.root)


@hookimpl
def buildmax_blob_stores() -> dict[str, Any]:
    return {SCHEME: _make}
