"""``buildmax import``: preview a backlog file, apply it chunk by chunk,
and show how far an import is, through a server's API.

Like every remote command, each takes ``--url``, ``--token``, ``--space``
(or ``$BUILDMAX_SPACE``) and ``--json``; a refusal is one ``error:`` line
on stderr and exit code 1. What the server sends is checked by the typed
client (:mod:`.client`) and printed with control characters escaped.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from buildmax.client import BuildMaxError
from buildmax.commands.identity import CommandError, Remote, connected, space_option

from .client import Import, ImportsClient, MalformedAnswer
from .plan import CHUNK_SIZE
from .schemas import MAX_CHUNK

#: How many problems, refused edges and notes a preview prints of each.
SHOWN = 20
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _safe(value: Any) -> str:
    """``value`` as text a terminal prints and never acts on."""
    return _UNSAFE.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


@click.group("import")
def import_group() -> None:
    """Imports: a team's backlog from a beads export, a CSV file or GitHub issues.

    First preview the file: the server reads it and says what each record
    becomes (created, updated, unchanged, or a conflict with a change made
    here), the problems of the file by line, the prerequisites and links
    it cannot keep and why, and the chunks it will apply. Nothing is
    changed. Then apply the preview: chunk by chunk, each one transaction.
    A stopped or killed apply is resumed by running it again; importing a
    newer export later updates the same tasks, never duplicates them.

    \b
    Examples:
      export BUILDMAX_SPACE=web
      bd export -o issues.jsonl
      buildmax import preview issues.jsonl --format beads --project shop
      buildmax import apply im_...
      buildmax import status im_...
      gh issue list --state all --limit 10000 \\
          --json number,title,body,state,labels,assignees,createdAt,closedAt,url > issues.json
      buildmax import preview issues.json --format github --project shop
    """


def _in_space(command: Callable[..., None]) -> Callable[..., None]:
    @space_option
    @connected
    @functools.wraps(command)
    def run(remote: Remote, space: str, **arguments: Any) -> None:
        try:
            command(remote, ImportsClient(remote.client), space, **arguments)
        except MalformedAnswer as exc:
            raise CommandError(str(exc)) from None

    return run


def _summary(found: Import) -> str:
    counts = found.counts
    body = found.body
    lines = [
        f"import {_safe(found.id)}: {_safe(found.state)}, "
        f"{found.chunks_applied} of {found.chunk_count} chunks applied",
        f"  file      {_safe((body.get('file') or {}).get('name'))} ({_safe(body.get('format'))})",
        f"  identity  {found.identity}",
        f"  preview   {counts.get('records', 0)} records: {counts.get('create', 0)} to create, "
        f"{counts.get('update', 0)} to update, {counts.get('unchanged', 0)} unchanged, "
        f"{counts.get('conflict', 0)} in conflict",
        f"  problems  {counts.get('problems', 0)} in the file, "
        f"{counts.get('refused', 0)} prerequisites or links left out",
    ]
    items = [item for item in body.get("items") or () if isinstance(item, dict)]
    if items:
        states = Counter(str(item.get("state")) for item in items)
        lines.append(
            "  states    " + ", ".join(f"{n} {_safe(state)}" for state, n in sorted(states.items()))
        )
        reasons = Counter(str(i.get("state_reason")) for i in items if i.get("state_reason"))
        lines += [f"            {n}: {_safe(reason)}" for reason, n in reasons.most_common(SHOWN)]
    return "\n".join(lines)


def _listed(title: str, entries: Any, shown: Callable[[dict[str, Any]], str]) -> list[str]:
    entries = [entry for entry in entries or () if isinstance(entry, dict)]
    if not entries:
        return []
    lines = [f"{title}:"]
    lines += [f"  {_safe(shown(entry))}" for entry in entries[:SHOWN]]
    if len(entries) > SHOWN:
        lines.append(f"  ... and {len(entries) - SHOWN} more (--json shows all)")
    return lines


def _notes(item: dict[str, Any]) -> str:
    """A record's item or report entry as a line: its id and its notes."""
    return f"{item.get('source_id')}: {'; '.join(map(str, item.get('notes') or ()))}"


def _details(found: Import) -> str:
    body = found.body
    noted = [
        item for item in body.get("items") or () if isinstance(item, dict) and item.get("notes")
    ]
    lines = [
        *_listed(
            "problems",
            body.get("problems"),
            lambda p: f"line {p.get('line')}: {p.get('reason')}",
        ),
        *_listed(
            "left out",
            body.get("refused"),
            lambda e: f"{e.get('source_id')} {e.get('kind')} {e.get('target')}: {e.get('reason')}",
        ),
        *_listed(
            "notes",
            noted,
            _notes,
        ),
    ]
    return "\n".join(lines)


@import_group.command("preview")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--format",
    "format_",
    required=True,
    metavar="FORMAT",
    help="The file's format: beads (a JSONL export), csv, github (gh issue list --json), "
    "or one a plugin adds.",
)
@click.option("--project", required=True, metavar="PROJECT", help="The project (id or name).")
@click.option(
    "--chunk-size",
    type=click.IntRange(1, MAX_CHUNK),
    help=f"Records per chunk, each applied in one transaction [default: {CHUNK_SIZE}].",
)
@_in_space
def preview_command(
    remote: Remote,
    imports: ImportsClient,
    space: str,
    file: Path,
    format_: str,
    project: str,
    chunk_size: int | None,
) -> None:
    """Send FILE to be previewed: what applying it would do. Changes no task."""
    found = imports.preview(space, file, format=format_, project=project, chunk_size=chunk_size)
    if remote.as_json:
        click.echo(json.dumps(found.body, indent=2))
        return
    click.echo(_summary(found))
    details = _details(found)
    if details:
        click.echo(details)
    if found.chunk_count:
        click.echo(f"apply it with: buildmax import apply {_safe(found.id)}")


@import_group.command("apply")
@click.argument("import_id", metavar="IMPORT")
@_in_space
def apply_command(remote: Remote, imports: ImportsClient, space: str, import_id: str) -> None:
    """Apply the preview IMPORT, chunk by chunk, from the first not applied.

    Each chunk is one transaction. Stopped or killed, run it again: it goes
    on from where it stopped, and a chunk whose answer was lost is not
    applied twice. Refused when what the preview assumed moved (preview the
    file again)."""
    found = imports.show(space, import_id, items=False)
    reports = []
    with click.progressbar(
        length=found.chunk_count,
        label=f"applying {_safe(found.id)}",
        show_pos=True,
        file=sys.stderr,
    ) as bar:
        bar.update(found.chunks_applied)
        for number in range(found.chunks_applied + 1, found.chunk_count + 1):
            try:
                reports.append(imports.apply_chunk(space, found.id, number, found.identity))
            except BuildMaxError as exc:
                done = f"chunks 1 to {number - 1} are" if number > 1 else "none is"
                raise CommandError(
                    f"chunk {number} of {found.chunk_count} was not applied: {exc}; {done}"
                ) from None
            bar.update(1)
    if remote.as_json:
        click.echo(json.dumps([report.body for report in reports], indent=2))
        return
    before = [report.number for report in reports if report.replayed]
    reports = [report for report in reports if not report.replayed]
    totals: dict[str, int] = {}
    for report in reports:
        for action, count in report.counts.items():
            totals[action] = totals.get(action, 0) + count
    if before:
        click.echo(f"chunks {', '.join(map(str, before))} had been applied already (not again)")
    if not reports:
        click.echo(f"import {_safe(found.id)}: every chunk was applied already")
        return
    click.echo(
        f"import {_safe(found.id)}: applied chunks {reports[0].number} to {reports[-1].number} "
        f"of {found.chunk_count}: {totals.get('create', 0)} created, "
        f"{totals.get('update', 0)} updated, {totals.get('unchanged', 0)} unchanged, "
        f"{totals.get('conflict', 0)} left in conflict"
    )
    notes = [
        item
        for report in reports
        for item in report.body["items"]
        if isinstance(item, dict) and item.get("notes")
    ]
    for line in _listed(
        "not applied",
        notes,
        _notes,
    ):
        click.echo(line)


@import_group.command("status")
@click.argument("import_id", metavar="IMPORT")
@_in_space
def status_command(remote: Remote, imports: ImportsClient, space: str, import_id: str) -> None:
    """How far IMPORT is applied, and what its preview found."""
    found = imports.show(space, import_id)
    if remote.as_json:
        click.echo(json.dumps(found.body, indent=2))
        return
    click.echo(_summary(found))
    details = _details(found)
    if details:
        click.echo(details)
