"""Hooks for blob storage backends."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .markers import hookspec
from .protocols import BlobStore

BlobStoreFactory = Callable[[str, Any], BlobStore]


@hookspec
def buildmax_blob_stores() -> Mapping[str, BlobStoreFactory] | None:
    """Blob store factories by URL scheme.

    Called once by the app factory. Return a mapping such as
    ``{"s3": make_s3_store}``; the kernel picks the factory whose scheme
    matches the configured ``blob_store_url`` and calls
    ``factory(url, config)`` to build the app's :class:`BlobStore` service.
    The kernel itself provides ``file``. No transaction is open.
    """
