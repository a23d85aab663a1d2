"""The catalog through a backup and a restore: a release whose package was
lost is yanked as lost, and what was taken away after the backup (a yank, a
withdrawn eligibility, an archived plugin) is applied again from an audit
export, so a restore never makes a release pinnable again."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_audit.export import export_lines, plan
from buildmax_marketplace.backup import LOST_REASON
from buildmax_marketplace.tables import plugins, releases

from buildmax.app import blob_store, create_app
from buildmax.backups.create import create_backup
from buildmax.backups.restore import restore_backup
from buildmax.config import Config

from .archives import FILES, tar_gz

NAME = "lint-helpers"


@pytest.fixture
def restore_target(buildmax_restore_target: Config) -> Config:
    """An empty target of the test's engine."""
    return buildmax_restore_target


async def _rows(settings: Config, table: sa.Table) -> list[dict[str, Any]]:
    app = create_app(settings)
    await app.db.connect()
    try:
        async with app.db.read() as conn:
            return [dict(r) for r in await conn.fetch_all(sa.select(table).order_by(table.c.id))]
    finally:
        await app.db.close()


async def test_the_catalog_keeps_what_was_taken_away_and_yanks_what_was_lost(
    market: Any, restore_target: Config, tmp_path: Path
) -> None:
    """Catches: a restore that hands back a yanked or ineligible release,
    unarchives a plugin, or leaves a release pinnable whose package is gone."""
    app = market.app
    kept = await market.publish(tar_gz(tmp_path / "1.tar.gz"), NAME)
    path = f"/v1/catalog/{NAME}/releases/1.2.0/eligibility"
    await market.call(
        "POST", path, market.admin, json={"eligible": True, "sha256": kept["sha256"]}, expect=200
    )
    files = {**FILES, "buildmax-plugin.toml": FILES["buildmax-plugin.toml"].replace("1.2.0", "1.3")}
    lost = await market.publish(tar_gz(tmp_path / "2.tar.gz", files), NAME)
    [lost_row] = [r for r in await market.rows(releases) if r["version"] == "1.3"]
    await blob_store(app).delete(lost_row["blob_key"])  # the store lost it before the backup
    app.clock.advance(ms=1)
    created = await create_backup(app, tmp_path / "backups")
    assert created.manifest.missing_blobs == [lost_row["blob_key"]]

    await market.call(
        "POST",
        f"/v1/catalog/{NAME}/releases/1.2.0/yank",
        market.operator,
        json={"reason": "breaks on windows"},
        expect=200,
    )
    await market.call(
        "POST", path, market.admin, json={"eligible": False, "sha256": kept["sha256"]}, expect=200
    )
    await market.call(
        "POST", f"/v1/catalog/{NAME}/archive", market.admin, json={"reason": "old"}, expect=200
    )
    trail = tmp_path / "trail.jsonl"
    lines = [line async for line in export_lines(app, await plan(app))]
    await asyncio.to_thread(trail.write_text, "".join(lines))

    report = await restore_backup(restore_target, created.path, audit_export=str(trail))
    assert report.lost_blobs == [lost_row["blob_key"]]
    by_version = {r["version"]: r for r in await _rows(restore_target, releases)}
    assert by_version["1.2.0"]["yanked_at"] is not None
    assert by_version["1.2.0"]["yank_reason"] == "breaks on windows"
    assert by_version["1.2.0"]["eligible_at"] is None
    assert by_version["1.3"]["yanked_at"] is not None
    assert by_version["1.3"]["yank_reason"] == LOST_REASON
    [plugin] = await _rows(restore_target, plugins)
    assert plugin["archived_at"] is not None and plugin["archive_reason"] == "old"
    assert lost["version"] == "1.3"
    assert any("yanked, their package lost: lint-helpers 1.3" in line for line in report.lines)
