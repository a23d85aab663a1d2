"""Artifacts through a backup and a restore, on the file store and on S3:
the bytes go into the backup and come back into the store they were lost
from; a blob the store had lost before the backup is tombstoned as lost."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from buildmax.app import create_app
from buildmax.backups.create import create_backup
from buildmax.backups.restore import restore_backup
from buildmax.config import Config
from buildmax.testing import call


@pytest.fixture
def restore_target(buildmax_restore_target: Config, buildmax_settings: Config) -> Config:
    """An empty target of the test's engine, on the test's blob store."""
    return buildmax_restore_target.replace(
        plugins=buildmax_settings.plugins,
        blob_store_url=buildmax_settings.effective_blob_store_url,
    )


async def test_the_bytes_come_back_into_the_store_they_were_lost_from(
    shelf: Any, restore_target: Config, tmp_path: Path
) -> None:
    """The store loses everything after the backup: the restore puts the
    kept artifact's bytes back (file store and S3); the artifact whose bytes
    the store had lost before the backup is tombstoned. Catches: a restore
    that trusts the store, or references a blob that is not there."""
    kept = await shelf.upload(b"kept through the disaster")
    gone = await shelf.upload(b"lost before the backup")
    gone_key = next(k for k in shelf.blob_files() if k.endswith(gone["sha256"]))
    shelf.backend.remove(gone_key)
    shelf.app.clock.advance(ms=1)
    created = await create_backup(shelf.app, tmp_path / "backups")
    for key in shelf.blob_files():  # the disaster
        shelf.backend.remove(key)

    report = await restore_backup(restore_target, created.path)
    assert report.blobs_restored == 1
    assert report.lost_blobs == [gone_key]
    assert report.admin_token is not None
    token = report.admin_token.secret
    restored = create_app(restore_target)
    async with restored.test_app():
        client = restored.test_client()
        content = await call(client, "GET", f"{shelf.base}/{kept['id']}/content", token, expect=200)
        assert content == b"kept through the disaster"
        await call(client, "GET", f"{shelf.base}/{gone['id']}", token, expect=404)
