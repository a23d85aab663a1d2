"""``buildmax audit``: export, verify and apply retention on the server's
machine (it reads the database directly, like ``buildmax db``)."""

from __future__ import annotations

import os
import sys
import tempfile

import click
from buildmax_hookspecs import App

from buildmax.clock import from_rfc3339, to_rfc3339
from buildmax.commands.server import (
    config_option,
    data_dir_option,
    database_option,
    load_settings,
    with_app,
)

from .verify import ChainReport, ExportError

#: The schemas these commands read: they work while other plugins wait for
#: a migration (export the trail before migrating).
_TABLES_READ = ("kernel", "audit")


def _time(name: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        moment = from_rfc3339(value)
        to_rfc3339(moment)  # it must be writable in the export's header too
        return moment
    except (ValueError, OverflowError):
        raise click.BadParameter(
            f"{value!r} is not an RFC 3339 time (like 2026-01-31T12:00:00Z)", param_hint=name
        ) from None


async def _chain(app: App, space: str | None) -> str | None:
    from .chain import chain_named

    if space is None:
        return None
    chain = await chain_named(app, space)
    if chain is None:
        raise click.ClickException(f"no space is named {space!r}")
    return chain


@click.group("audit")
def audit_group() -> None:
    """The audit trail: export it, verify it, apply retention."""


@audit_group.command("export")
@config_option
@data_dir_option
@database_option
@click.option("--since", metavar="TIME", help="Events at or after this RFC 3339 time.")
@click.option("--until", metavar="TIME", help="Events before this RFC 3339 time.")
@click.option("--space", metavar="SPACE", help="One space's chain (slug or id), or 'system'.")
@click.option(
    "--output",
    "-o",
    required=True,
    type=click.Path(dir_okay=False),
    help="The JSON Lines file to write ('-' for standard output).",
)
def export_command(
    config_path: str | None,
    data_dir: str | None,
    database_url: str | None,
    since: str | None,
    until: str | None,
    space: str | None,
    output: str,
) -> None:
    """Export the trail as JSON Lines that `buildmax audit verify FILE`
    checks offline: each chain's anchor, its events in order, an end line.

    Each chain contributes the unbroken run of events from the first at or
    after --since to the last before --until. The file appears only once
    it is complete.
    """
    from .export import TrailChanged, export_lines, plan

    settings = load_settings(config_path, data_dir=data_dir, database_url=database_url)
    start, end = _time("--since", since), _time("--until", until)
    directory = os.path.dirname(os.path.abspath(output))

    async def work(app: App) -> tuple[int, int]:
        slices = await plan(app, since=start, until=end, chain=await _chain(app, space))
        total = sum(piece.size for piece in slices)
        if output == "-":
            async for line in export_lines(app, slices, since=start, until=end):
                sys.stdout.write(line)
            return total, len(slices)
        try:
            handle, temporary = tempfile.mkstemp(prefix=".audit-export-", dir=directory)
        except OSError as exc:
            raise click.ClickException(f"cannot write {output}: {exc.strerror}") from None
        try:
            with (
                os.fdopen(handle, "w", encoding="utf-8") as out,
                click.progressbar(length=total, label="exporting", file=sys.stderr) as bar,
            ):
                async for line in export_lines(app, slices, since=start, until=end):
                    out.write(line)
                    if line.startswith('{"kind":"event"'):
                        bar.update(1)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temporary, output)
        except BaseException:
            os.unlink(temporary)
            raise
        return total, len(slices)

    try:
        events, chains = with_app(settings, work, schema_of=_TABLES_READ)
    except TrailChanged as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"exported {events} event(s) of {chains} chain(s) to {output}", err=True)


def _show(reports: list[ChainReport]) -> None:
    for report in reports:
        if report.ok:
            last = "-" if report.last_seq is None else report.last_seq
            click.echo(f"ok      {report.chain}: {report.events} event(s), through {last}")
        else:
            click.echo(
                f"BROKEN  {report.chain}: first bad sequence {report.broken_seq}: {report.cause}"
            )


@audit_group.command("verify")
@click.argument("file", required=False, type=click.Path(exists=True, dir_okay=False))
@config_option
@data_dir_option
@database_option
@click.option("--space", metavar="SPACE", help="Only this space's chain (slug or id), or 'system'.")
def verify_command(
    file: str | None,
    config_path: str | None,
    data_dir: str | None,
    database_url: str | None,
    space: str | None,
) -> None:
    """Recompute the hash chains of the database, or of an export FILE
    (offline), and report each chain's first bad sequence number and why.

    Exits 1 when a chain does not verify."""
    from .verify import verify_database, verify_export

    if file is not None:
        if space is not None:
            raise click.UsageError("--space applies to the database, not to an export FILE")
        try:
            with open(file, encoding="utf-8") as stream:
                reports = verify_export(stream)
        except (ExportError, UnicodeDecodeError) as exc:
            raise click.ClickException(f"{file}: {exc}") from None
    else:
        settings = load_settings(config_path, data_dir=data_dir, database_url=database_url)

        async def work(app: App) -> list[ChainReport]:
            return await verify_database(app, await _chain(app, space))

        reports = with_app(settings, work, schema_of=_TABLES_READ)
    if all(report.ok and not report.events for report in reports):
        where = file if file is not None else "the database"
        raise click.ClickException(f"{where} holds no audit event: nothing was verified")
    _show(reports)
    broken = [report for report in reports if not report.ok]
    if broken:
        raise click.ClickException(f"{len(broken)} of {len(reports)} chain(s) do not verify")
    click.echo(f"{len(reports)} chain(s) verify", err=True)


@audit_group.command("sweep")
@config_option
@data_dir_option
@database_option
@click.option(
    "--retention-days",
    type=click.IntRange(min=1),
    help="Remove events older than this many days (default: the configured retention).",
)
def sweep_command(
    config_path: str | None,
    data_dir: str | None,
    database_url: str | None,
    retention_days: int | None,
) -> None:
    """Apply retention now: remove events older than the limit, keeping
    each chain verifiable from its new anchor (the sweep is audited)."""
    from .retention import sweep

    settings = load_settings(config_path, data_dir=data_dir, database_url=database_url)
    swept = with_app(settings, lambda app: sweep(app, retention_days), schema_of=_TABLES_READ)
    if not swept:
        click.echo("Nothing to remove.")
    for item in swept:
        click.echo(f"{item.chain}: removed {item.removed} event(s) through {item.through_seq}")
