"""``buildmax backup create|verify|restore``: run on the server's machine."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from .server import (
    config_option,
    data_dir_option,
    database_option,
    load_settings,
    with_app,
)


class TerminalProgress:
    """A progress bar per stage on a terminal (standard error); nothing
    elsewhere, so a timer's log stays clean."""

    def __init__(self) -> None:
        self.enabled = sys.stderr.isatty()
        self._stage: str | None = None
        self._bar: Any = None
        self._shown = 0

    def __call__(self, stage: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if stage != self._stage:
            self.close()
            self._stage = stage
            if total > 0:
                self._bar = click.progressbar(length=total, label=stage, file=sys.stderr)
                self._bar.__enter__()
                self._shown = 0
            else:
                click.echo(f"{stage}...", err=True)
        if self._bar is not None and done > self._shown:
            self._bar.update(min(done, total) - self._shown)
            self._shown = min(done, total)

    def close(self) -> None:
        """End the bar of the current stage."""
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None


def _backup_folder(path: str) -> Path:
    """``path`` itself when it is a backup, else the newest backup in it."""
    from ..backups.layout import MANIFEST, backups_in

    folder = Path(path).absolute()
    if (folder / MANIFEST).is_file() or not folder.is_dir():
        return folder
    found = backups_in(folder)
    if not found:
        raise click.ClickException(
            f"{folder} holds no backup (no manifest.json in it, no buildmax-* backup folder)"
        )
    return found[-1]


@contextlib.contextmanager
def _one_line() -> Iterator[None]:
    """A refusal, a disk or a database error as one line and exit 1."""
    from ..backups.layout import BackupError

    try:
        yield
    except BackupError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        raise click.ClickException(f"{where}{exc.strerror or exc}") from None
    except sqlite3.Error as exc:
        raise click.ClickException(f"SQLite: {exc}") from None


@click.group()
def backup() -> None:
    """Back up and restore the database and its blobs, as one pair.

    A backup is a folder under the backup target (--output, or backup_dir:
    ./buildmax-backups by default) holding the manifest, the database and
    the list of blobs; the blobs themselves are shared by every backup of
    the target (blobs/), so a later backup copies only new ones. Backups
    hold password hashes, token verifiers and every artifact: they are
    written readable by their owner only.
    """


@backup.command("create")
@config_option
@data_dir_option
@database_option
@click.option(
    "--output",
    type=click.Path(file_okay=False),
    help="Backup target folder (default: backup_dir, ./buildmax-backups).",
)
@click.option(
    "--keep",
    type=click.IntRange(min=1),
    help="Then keep only the newest N backups of the target (and the blobs they use).",
)
def create_command(
    config_path: str | None,
    data_dir: str | None,
    database_url: str | None,
    output: str | None,
    keep: int | None,
) -> None:
    """Take a backup while the server runs (writes pause for at most a moment).

    Exit status 0 and one line naming the backup when it is complete and
    verified; 1 with the reason otherwise (nothing that looks like a backup
    is left behind)."""
    from ..backups.create import create_backup, manifest_summary

    settings = load_settings(config_path, data_dir=data_dir, database_url=database_url)
    target = Path(output or settings.backup_dir).absolute()
    progress = TerminalProgress()

    async def work(app: Any) -> Any:
        try:
            return await create_backup(app, target, keep=keep, progress=progress)
        finally:
            progress.close()

    with _one_line():
        created = with_app(settings, work)
    click.echo(manifest_summary(created))
    for removed in created.removed:
        click.echo(f"removed the older backup {removed}")


@backup.command("verify")
@config_option
@database_option
@click.option(
    "--files-only",
    is_flag=True,
    help="Check the digests of the files and blobs only, not the database's contents.",
)
@click.argument("path", type=click.Path(exists=True, file_okay=False))
def verify_command(
    config_path: str | None, database_url: str | None, files_only: bool, path: str
) -> None:
    """Check a backup (PATH, or the newest backup in the target PATH).

    Every sha256 of the manifest, every blob, and (unless --files-only) the
    database itself: it opens, its migrations are known here, its row counts
    and audit chain heads are the manifest's, and every blob a row names is
    in the backup. A PostgreSQL backup is opened in a scratch database on
    the server of --database-url, dropped after. Exit 1 naming the first
    problem."""
    from ..backups.verify import check_database, manifest_digest, verify_files

    settings = load_settings(config_path, database_url=database_url)
    folder = _backup_folder(path)
    progress = TerminalProgress()
    try:
        with _one_line():
            manifest = verify_files(folder, progress=progress)
            progress.close()
            if not files_only:
                asyncio.run(check_database(settings, folder, manifest))
    finally:
        progress.close()
    what = "files" if files_only else "files and database"
    click.echo(
        f"backup {folder} verifies ({what}): {manifest.blob_count} blob(s), "
        f"{sum(manifest.row_counts.values())} rows, manifest sha256 {manifest_digest(folder)}"
    )


@backup.command("restore")
@config_option
@data_dir_option
@database_option
@click.option(
    "--replace",
    is_flag=True,
    help="Restore over an existing database (stop every server first); SQLite files "
    "are moved aside, not deleted.",
)
@click.option(
    "--keep-tokens",
    is_flag=True,
    help="Keep API tokens issued before the restore working (sessions and attempt "
    "tokens still end). A token revoked after the backup works again.",
)
@click.option(
    "--audit-export",
    type=click.Path(exists=True, dir_okay=False),
    help="An audit export taken after the backup (buildmax audit export): every token "
    "revoked, principal disabled, role lowered, member removed, password changed, release "
    "yanked or eligibility withdrawn after the backup is re-applied, and listed.",
)
@click.argument("path", type=click.Path(exists=True, file_okay=False))
def restore_command(
    config_path: str | None,
    data_dir: str | None,
    database_url: str | None,
    replace: bool,
    keep_tokens: bool,
    audit_export: str | None,
    path: str,
) -> None:
    """Restore a backup (PATH, or the newest backup in the target PATH) into
    an empty data directory or database, under a new authority epoch.

    Every credential issued before the restore stops working (unless
    --keep-tokens); active attempts end and their tasks can be claimed
    again, with generations past any handed out before; artifacts and
    releases whose blob is missing are tombstoned and listed. A fresh admin
    token is printed once."""
    from ..backups.restore import restore_backup

    settings = load_settings(config_path, data_dir=data_dir, database_url=database_url)
    folder = _backup_folder(path)
    progress = TerminalProgress()
    try:
        with _one_line():
            report = asyncio.run(
                restore_backup(
                    settings,
                    folder,
                    replace=replace,
                    keep_tokens=keep_tokens,
                    audit_export=audit_export,
                    progress=progress,
                )
            )
    finally:
        progress.close()
    for line in report.set_aside:
        click.echo(line)
    if report.migrated:
        click.echo("applied migrations: " + ", ".join(report.migrated))
    click.echo(
        f"restored {folder} (manifest sha256 {report.manifest_sha256}): "
        f"{report.blobs_restored} blob(s) put back, {report.blobs_present} already in the store"
    )
    click.echo(f"revoked {report.revoked_tokens} token(s) issued before the restore")
    if keep_tokens:
        click.echo("API tokens issued before the backup were KEPT (--keep-tokens)")
    if report.lost_blobs:
        click.echo(f"{len(report.lost_blobs)} blob(s) could not be put back (tombstoned):")
        for key in report.lost_blobs:
            click.echo(f"  {key}")
    for line in report.lines:
        click.echo(line)
    assert report.admin_token is not None
    click.echo(
        f"\n  A new admin token for {report.admin_name} (shown once, keep it safe):\n\n"
        f"      {report.admin_token.secret}\n"
    )


@backup.command("list")
@config_option
@data_dir_option
@database_option
@click.option(
    "--output",
    type=click.Path(file_okay=False),
    help="Backup target folder (default: backup_dir, ./buildmax-backups).",
)
def list_command(
    config_path: str | None, data_dir: str | None, database_url: str | None, output: str | None
) -> None:
    """The backups in the target, oldest first, and what the database
    recorded of the last runs (when, where, and why the last failure failed)."""
    from ..backups.layout import BackupError, backups_in
    from ..backups.manifest import read_manifest
    from ..clock import to_rfc3339
    from ..diagnostics import last_runs

    settings = load_settings(config_path, data_dir=data_dir, database_url=database_url)
    target = Path(output or settings.backup_dir).absolute()
    for folder in backups_in(target):
        try:
            manifest, _ = read_manifest(folder)
        except BackupError as exc:
            click.echo(f"{folder.name}  unreadable: {exc}")
            continue
        click.echo(
            f"{folder.name}  {manifest.engine}  {sum(manifest.row_counts.values())} rows  "
            f"{manifest.blob_count} blob(s), {manifest.blob_bytes} bytes"
        )
    if not backups_in(target):
        click.echo(f"no backup in {target}")

    async def work(app: Any) -> Any:
        async with app.db.read() as conn:
            return await last_runs(conn)

    runs = with_app(settings, work, schema_of=["kernel"])
    for label, run in (("last run", runs["last"]), ("last success", runs["last_succeeded"])):
        if run is None:
            click.echo(f"{label}: none recorded")
            continue
        line = f"{label}: {run['state']}, started {to_rfc3339(run['started_at'])}, {run['path']}"
        if run["error"]:
            line += f": {run['error']}"
        click.echo(line)


def register(cli: click.Group) -> None:
    """Add the backup group to the root group."""
    cli.add_command(backup)
