"""``buildmax artifacts``: upload, list, download, pin and delete artifacts
through the HTTP API, and ``gc`` on the server's machine."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import click
import sqlalchemy as sa
from buildmax_hookspecs import App

from buildmax.commands.identity import CommandError, Remote, connected, space_option
from buildmax.commands.server import (
    config_option,
    data_dir_option,
    database_option,
    load_settings,
    with_app,
)

from .client import ArtifactsClient, CorruptDownload
from .tables import artifacts

ARTIFACT_COLUMNS = ("id", "name", "media_type", "size", "sha256", "pinned", "created_at")
DETAIL_COLUMNS = (*ARTIFACT_COLUMNS, "task_id", "attempt_id", "created_by")


@click.group("artifacts")
def artifacts_group() -> None:
    """Artifacts: upload, list, download, pin and delete them; collect garbage."""


def _artifacts(remote: Remote) -> ArtifactsClient:
    return ArtifactsClient(remote.client)


@contextlib.contextmanager
def _local_failures() -> Iterator[None]:
    """A file that cannot be read or written, or bytes that are not the
    artifact's, as one ``error:`` line."""
    try:
        yield
    except CorruptDownload as exc:
        raise CommandError(str(exc)) from None
    except OSError as exc:
        raise CommandError(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": ")) from None


@artifacts_group.command("upload")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", help="The artifact's name [default: the file's name].")
@click.option("--media-type", help="Its media type [default: guessed from the name].")
@click.option("--task", metavar="TASK", help="The task it belongs to.")
@click.option(
    "--attempt",
    metavar="ATTEMPT",
    help="The attempt it belongs to (yours, at --generation).",
)
@click.option(
    "--generation",
    type=click.IntRange(min=1),
    help="The attempt's generation (required with --attempt).",
)
@click.option(
    "--override-reason",
    metavar="TEXT",
    help="Attach to someone else's attempt as a space admin, with this reason (audited).",
)
@space_option
@connected
def upload_command(
    remote: Remote,
    space: str,
    file: Path,
    name: str | None,
    media_type: str | None,
    task: str | None,
    attempt: str | None,
    generation: int | None,
    override_reason: str | None,
) -> None:
    """Upload FILE (streamed, with its sha256: bytes changed on the way are refused).

    \b
    Examples:
      buildmax artifacts upload --space web build/report.xml --task tk_3F...
      buildmax artifacts upload --space web run.log --attempt at_9x... --generation 2
      BUILDMAX_TOKEN=$ATTEMPT_TOKEN buildmax artifacts upload --space web run.log
    """
    if attempt is not None and generation is None:
        raise click.UsageError("--attempt needs --generation (the attempt's generation)")
    with _local_failures():
        made = _artifacts(remote).upload(
            space,
            file,
            name=name,
            media_type=media_type,
            task=task,
            attempt=attempt,
            generation=generation,
            override_reason=override_reason,
        )
    remote.show(made, ARTIFACT_COLUMNS)


@artifacts_group.command("list")
@click.option("--task", metavar="TASK", help="Only this task's artifacts.")
@click.option("--attempt", metavar="ATTEMPT", help="Only this attempt's artifacts.")
@click.option("--media-type", help="Only artifacts of this media type.")
@space_option
@connected
def list_command(
    remote: Remote, space: str, task: str | None, attempt: str | None, media_type: str | None
) -> None:
    """List the space's artifacts, newest first."""
    found = _artifacts(remote).list(space, task=task, attempt=attempt, media_type=media_type)
    remote.show_all(found, ARTIFACT_COLUMNS)


@artifacts_group.command("show")
@click.argument("artifact")
@space_option
@connected
def show_command(remote: Remote, space: str, artifact: str) -> None:
    """Show ARTIFACT's metadata."""
    remote.show(
        _artifacts(remote).get(space, artifact), (*ARTIFACT_COLUMNS, "task_id", "attempt_id")
    )


@artifacts_group.command("download")
@click.argument("artifact")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Where to write it [default: its name, in the current directory].",
)
@space_option
@connected
def download_command(remote: Remote, space: str, artifact: str, output: Path | None) -> None:
    """Download ARTIFACT; written only once its sha256 is checked."""
    client = _artifacts(remote)
    dest = output if output is not None else Path(client.get(space, artifact)["name"])
    if output is None and dest.exists():
        raise click.UsageError(f"{dest} exists: pass --output to choose where to write")
    with _local_failures():
        got = client.download(space, artifact, dest)
    remote.done(f"wrote {got['size']} bytes to {dest} (sha256 {got['sha256']})")


@artifacts_group.command("delete")
@click.argument("artifact")
@space_option
@connected
def delete_command(remote: Remote, space: str, artifact: str) -> None:
    """Delete ARTIFACT (a tombstone; its bytes go with the collector)."""
    _artifacts(remote).delete(space, artifact)
    remote.done(f"deleted {artifact}")


@artifacts_group.command("pin")
@click.argument("artifact")
@click.option("--off", is_flag=True, help="Remove the pin instead.")
@space_option
@connected
def pin_command(remote: Remote, space: str, artifact: str, off: bool) -> None:
    """Pin ARTIFACT: retention keeps it (--off: let it expire again)."""
    client = _artifacts(remote)
    changed = client.unpin(space, artifact) if off else client.pin(space, artifact)
    remote.show(changed, ARTIFACT_COLUMNS)


def _missing_blob_root(url: str) -> Path | None:
    """The local blob directory ``url`` names, when it does not exist."""
    parts = urlsplit(url)
    root = Path(unquote(parts.path))
    return root if parts.scheme == "file" and not root.is_dir() else None


async def _refuse_a_missing_blob_root(app: App, root: Path) -> None:
    """A collector pointed at a local blob directory that does not exist
    (run from the wrong directory) would find no blob and tombstone every
    live artifact as lost: with live artifacts, refuse, naming the
    directory and how to name the right one."""
    async with app.db.read() as conn:
        live = await conn.fetch_val(
            sa.select(sa.func.count())
            .select_from(artifacts)
            .where(artifacts.c.deleted_at.is_(None))
        )
    if live:
        raise click.ClickException(
            f"no blob store at {root}, and the database holds {live} live artifact(s): name "
            "the server's data directory with --data-dir (or blob_store_url in the "
            "configuration file)"
        )


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

    missing_root = _missing_blob_root(settings.effective_blob_store_url)

    async def work(app: App) -> Any:
        if missing_root is not None:
            await _refuse_a_missing_blob_root(app, missing_root)
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
        + ("" if dry_run else f"; removed {report.temporary_removed} temporary upload(s)")
    )
    for key in report.orphans:
        click.echo(f"orphan  {key}")
    for artifact in report.lost:
        click.echo(f"lost    {artifact}")
