"""``buildmax qualify``: run the critical journeys and write the evidence."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Collection, Coroutine, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from .journey import ENGINES, NOT_BUILT, Journey, Needs, Requirement, discover, needs

if TYPE_CHECKING:
    from .outcome import Outcome

DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
PG_URL_ENV = "BUILDMAX_QUALIFY_PG_URL"


def installed_graders() -> dict[str, Any]:
    """Every grader the installed plugins offer, by name; two plugins
    offering one name is an error."""
    from buildmax.plugins import create_plugins

    plugins = create_plugins(strict=os.environ.get("BUILDMAX_STRICT_PLUGINS") == "1")
    graders: dict[str, Any] = {}
    for offered in plugins.hooks.graders():
        for name, factory in (offered or {}).items():
            if name in graders and graders[name] is not factory:
                raise click.ClickException(f"two plugins offer a grader named {name!r}")
            graders[name] = factory
    return graders


def distribution_installed(name: str) -> bool:
    """Whether a distribution named ``name`` is installed here."""
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def unmet_needs(
    journeys: Sequence[tuple[str, Needs]],
    graders: Collection[str],
    installed: Callable[[str], bool] = distribution_installed,
) -> str | None:
    """One line naming what the journeys (their needs by id) need and this
    environment lacks, or ``None``: the required distributions that are not
    installed, with what installs each, then the graders no installed plugin
    offers that no missing distribution accounts for."""
    missing: dict[str, Requirement] = {}
    unknown: dict[str, list[str]] = {}
    for journey_id, need in journeys:
        absent = [r for r in need.requires if not installed(r.distribution)]
        for requirement in absent:
            missing.setdefault(requirement.distribution, requirement)
        if absent:
            continue  # its graders may be theirs
        for grader in need.graders:
            if grader not in graders:
                unknown.setdefault(grader, []).append(journey_id)
    parts = []
    if missing:
        parts.append(
            "qualification needs plugins that are not installed: "
            + ", ".join(f"{r.distribution} (pip install {r.install})" for r in missing.values())
        )
        if any(r.install.startswith(".") for r in missing.values()):
            parts.append("run from the repository root")
    if unknown:
        parts.append(
            "qualification needs graders no installed plugin offers: "
            + ", ".join(f"{g!r} ({', '.join(ids)})" for g, ids in unknown.items())
            + " (a journey names the distribution offering a grader under [[requires]])"
        )
    return "; ".join(parts) or None


def _until_terminated(run: Coroutine[Any, Any, list[Outcome]]) -> list[Outcome] | None:
    """Run the qualification; SIGTERM (a cancelled CI job) cancels it like
    Ctrl-C does, so its servers are stopped and its databases dropped.
    ``None`` when it was interrupted."""

    async def main() -> list[Outcome]:
        task = asyncio.ensure_future(run)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await task

    try:
        return asyncio.run(main())
    except (asyncio.CancelledError, KeyboardInterrupt):
        return None


def _summary_table(outcomes: Sequence[Outcome]) -> str:
    from .outcome import FAILED, PASSED

    rows = [("journey", "engine", "result", "seconds", "detail")]
    for o in outcomes:
        if o.status == PASSED:
            detail = f"{o.checks} checks passed"
        elif o.status == FAILED:
            detail = f"[{o.classification}] {o.reason}"
        else:
            detail = o.reason
        result = o.status.upper() if o.status == FAILED else o.status
        rows.append((o.journey, o.engine, result, f"{o.seconds:.1f}", detail))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = []
    for row in rows:
        cells = [row[i].ljust(widths[i]) for i in range(4)]
        lines.append("  ".join(cells) + "  " + row[4])
    return "\n".join(lines)


@click.command()
@click.option(
    "--engine",
    "engines",
    type=click.Choice(ENGINES),
    multiple=True,
    help="Engine to qualify on; repeat for both (default: sqlite).",
)
@click.option(
    "--journey",
    "selected",
    multiple=True,
    metavar="ID",
    help="Run only this journey (J03); repeat for several.",
)
@click.option(
    "--journeys",
    "journeys_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("qualification/journeys"),
    show_default=True,
    help="Directory of journey files (steps/ beside it holds their Python steps).",
)
@click.option(
    "--output",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".artifacts/verification"),
    show_default=True,
    help="Where bundles go: <output>/<commit>/<engine>/<journey>/.",
)
@click.option(
    "--pg-url",
    envvar=PG_URL_ENV,
    default=DEFAULT_PG_URL,
    show_default=True,
    help=f"PostgreSQL server to create journey databases on (or ${PG_URL_ENV}).",
)
@click.option("--keep", is_flag=True, help="Keep each journey's scratch directory and data.")
@click.option("--list", "list_only", is_flag=True, help="List the journeys and exit.")
def qualify(
    engines: tuple[str, ...],
    selected: tuple[str, ...],
    journeys_dir: Path,
    output: Path,
    pg_url: str,
    keep: bool,
    list_only: bool,
) -> None:
    """Qualify this installation: run the critical journeys against real
    `buildmax serve` processes, grade them and write an evidence bundle per
    journey (manifest.json, result.json, junit.xml, server.log, audit.jsonl,
    db-state.json).

    Each journey gets a fresh database and its own server. Exits 1 when any
    journey fails or cannot run; journeys not applicable to an engine or not
    built yet are listed as such and neither pass nor fail. Exits 2 before
    any journey runs when a plugin or grader the journeys to run need is not
    installed, in one line naming what to install.
    """
    from .evidence import Source
    from .outcome import FAILED
    from .qualify import Qualification, load_journeys
    from .steps import steps_directory

    if not journeys_dir.is_dir():
        raise click.BadParameter(f"{journeys_dir} is not a directory", param_hint="--journeys")
    paths = discover(journeys_dir)
    if not paths:
        raise click.BadParameter(
            f"no journey files (*.toml) in {journeys_dir}", param_hint="--journeys"
        )
    graders = installed_graders()
    journeys = load_journeys(paths, graders)
    ids = [j.id if not isinstance(j, tuple) else j[0].stem for j in journeys]
    unknown = sorted(set(selected) - set(ids))
    if unknown:
        raise click.BadParameter(
            f"no journey {', '.join(unknown)} (known: {', '.join(ids)})", param_hint="--journey"
        )
    if selected:
        journeys = [j for j, i in zip(journeys, ids, strict=True) if i in selected]
    if list_only:
        for journey in journeys:
            if isinstance(journey, tuple):
                click.echo(f"{journey[0].stem:<5} UNREADABLE  {journey[1]}")
            else:
                engines_text = ",".join(journey.engines)
                click.echo(
                    f"{journey.id:<5} {journey.status:<10} {engines_text:<16} {journey.title}"
                )
        return

    # Everything the journeys to run need, checked before the first one runs.
    engines = engines or ("sqlite",)
    to_run = [
        (j.id, needs(j.path)) if isinstance(j, Journey) else (j[0].stem, needs(j[0]))
        for j in journeys
        if not isinstance(j, Journey)
        or (j.status != NOT_BUILT and any(j.applies_to(e) for e in engines))
    ]
    unmet = unmet_needs(to_run, graders)
    if unmet:
        click.echo(unmet, err=True)
        sys.exit(2)

    # The runner opens journey databases like the CLI does, and the MCP
    # SDK's HTTP client logs every request; their chatter would break the
    # progress bar.
    logging.getLogger("databases").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    qualification = Qualification(
        journeys,
        engines=engines,
        output=output,
        source=Source.of(Path.cwd()),
        pg_server_url=pg_url,
        steps_dir=steps_directory(journeys_dir),
        keep=keep,
    )
    total = len(journeys) * len(qualification.engines)
    if sys.stderr.isatty():
        with click.progressbar(
            length=total,
            label="Qualifying",
            show_pos=True,
            item_show_func=lambda item: item,
            file=sys.stderr,
        ) as bar:
            outcomes = _until_terminated(
                qualification.run(
                    lambda name: bar.update(0, f"{name} running"),
                    lambda outcome: bar.update(1),
                )
            )
    else:  # a log, not a terminal: one line per journey
        done = iter(range(1, total + 1))

        def finished(o: Outcome) -> None:
            click.echo(
                f"[{next(done)}/{total}] {o.engine} {o.journey}: {o.status} ({o.seconds:.1f} s)",
                err=True,
            )

        outcomes = _until_terminated(qualification.run(lambda name: None, finished))

    interrupted = outcomes is None
    outcomes = qualification.outcomes
    summary = {
        "commit": qualification.source.commit,
        "dirty": qualification.source.dirty,
        "interrupted": interrupted,
        "outcomes": [o.summary() for o in outcomes],
    }
    qualification.root.mkdir(parents=True, exist_ok=True)
    (qualification.root / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    click.echo(_summary_table(outcomes))
    counts = {s: sum(1 for o in outcomes if o.status == s) for s in {o.status for o in outcomes}}
    click.echo(
        "\n"
        + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        + f"; bundles in {qualification.root}"
    )
    if interrupted:
        raise click.ClickException(
            f"interrupted after {len(outcomes)} of {total} journey runs; the servers were "
            "stopped and their databases dropped"
        )
    if any(o.status == FAILED for o in outcomes):
        sys.exit(1)
