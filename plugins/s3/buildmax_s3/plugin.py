"""The S3 plugin's hook implementations (entry point ``s3``)."""

from __future__ import annotations

from typing import Any

from buildmax_hookspecs import hookimpl

from .store import S3BlobStore


@hookimpl
def buildmax_blob_stores() -> dict[str, Any]:
    return {"s3": S3BlobStore.from_url}
