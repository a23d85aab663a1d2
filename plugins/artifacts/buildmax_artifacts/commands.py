"""``buildmax artifacts``: maintenance on the server's machine."""

from __future__ import annotations

import sys
from typing import Any

import click

from buildmax.commands.server import (
    config_option,
    data_dir_option,
    database_option,
    load_settings,
    with_app,
)


@click.group("artifacts")
def artifacts_group() -> None:
    """Artifacts: reconcile the blob store with the database."""


@artifacts_group.command("gc")
@config_option
@data_dir_option
@database_option
@click.option("--dry-run", is_flag=True, help="Report what would be done; change nothing.")
@click.option(
    "--grace-seconds",
    type=click.IntRange(min=0),
    help="Leave orphans younger than this (default: [plugins.artifacts] gc_grace_seconds).",
)
def gc_command(
    config_path: str | None,
    data_dir: str | None,
    database_url: str | None,
    dry_run: bool,
    grace_seconds: int | None,
) -> None:
    """Remove blobs no live artifact references (older than the grace
    period), tombstone artifacts whose blobs are gone, release reservations
    of uploads that never finished. Only this plugin's own keys are touched."""
    from .gc import collect
    from .settings import artifact_settings

    settings = load_settings(config_path, data_dir=data_dir, database_url=database_url)

    async def work(app: Any) -> Any:
        grace = artifact_settings(app).gc_grace_seconds if grace_seconds is None else grace_seconds
        with click.progressbar(length=0, label="collecting", file=sys.stderr) as bar:
            return await collect(app, grace_ms=grace * 1000, dry_run=dry_run, progress=bar.update)

    report = with_app(settings, work)
    verb = "would remove" if dry_run else "removed"
    click.echo(
        f"{report.blobs_seen} blob(s) seen; {verb} {len(report.orphans)} orphan(s); "
        f"{report.young_orphans} young orphan(s) left; "
        f"{'would tombstone' if dry_run else 'tombstoned'} {len(report.lost)} lost artifact(s); "
        f"{'would release' if dry_run else 'released'} {report.stale_uploads} stale reservation(s)"
    )
    for key in report.orphans:
        click.echo(f"orphan  {key}")
    for artifact in report.lost:
        click.echo(f"lost    {artifact}")
