"""The imports plugin's part of a backup: the file of every import, which
a restored server re-plans to show an import and to apply its chunks."""

from __future__ import annotations

from collections.abc import AsyncIterator

import sqlalchemy as sa
from buildmax_hookspecs import BlobRef, Transaction

from .tables import imports

#: Imports read at once.
BATCH = 500


async def kept_files(conn: Transaction) -> AsyncIterator[BlobRef]:
    """The blob of every import's file, in key order (each key once)."""
    after = ""
    while True:
        rows = await conn.fetch_all(
            sa.select(
                imports.c.blob_key,
                sa.func.max(imports.c.file_size).label("size"),
                sa.func.max(imports.c.file_sha256).label("sha256"),
            )
            .where(imports.c.blob_key > after)
            .group_by(imports.c.blob_key)
            .order_by(imports.c.blob_key)
            .limit(BATCH)
        )
        for row in rows:
            yield BlobRef(row["blob_key"], int(row["size"]), row["sha256"])
        if len(rows) < BATCH:
            return
        after = rows[-1]["blob_key"]
