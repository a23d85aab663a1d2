"""``buildmax catalog`` (publish and browse plugin releases) and ``buildmax
run materialize`` (place a run's pinned packages under its home)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click

from buildmax.client import BuildMaxError, Unreachable, space_path
from buildmax.commands.identity import CommandError, Remote, connected

from .materialize import MaterializationFailed, materialize, read_listing
from .package import CHUNK

RELEASE_FIELDS = (
    "name",
    "version",
    "sha256",
    "size",
    "executable",
    "eligible",
    "yanked",
    "yank_reason",
    "published_by",
    "published_at",
)
PLUGIN_COLUMNS = ("name", "latest", "archived", "description")


@click.group("catalog")
def catalog_group() -> None:
    """The catalog of plugin releases agent runs may load.

    System admins and operators publish, yank and archive; only a system
    admin marks a release eligible for unattended use, after reading its
    capability report (`buildmax catalog show NAME VERSION`).
    """


@catalog_group.command("publish")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--name", help="The plugin's name [default: the archive's manifest says].")
@connected
def publish_command(remote: Remote, path: Path, name: str | None) -> None:
    """Publish the release archive at PATH (.tar.gz or .zip).

    \b
    Example:
      buildmax catalog publish dist/lint-helpers-1.2.0.tar.gz
    """
    if name is None:
        from .package import PackageRefused, inspect

        try:
            name = inspect(path).name
        except PackageRefused as refused:
            raise CommandError(f"{path}: {refused}") from None
    with (
        open(path, "rb") as fh,
        remote.client.stream(
            "POST",
            f"/v1/catalog/{name}/releases",
            content=iter(lambda: fh.read(CHUNK), b""),
            headers={"Content-Type": "application/octet-stream"},
        ) as response,
    ):
        response.read()
        made = response.json()
    _show_release(remote, made)


def _show_release(remote: Remote, release: dict[str, Any]) -> None:
    remote.show(release, RELEASE_FIELDS)
    if not remote.as_json:
        click.echo("report:")
        click.echo(json.dumps(release["report"], indent=2))


@catalog_group.command("list")
@click.option("--archived", is_flag=True, help="Include archived plugins.")
@connected
def list_command(remote: Remote, archived: bool) -> None:
    """List the catalog's plugins and their latest release."""
    params = {"archived": "true"} if archived else None
    remote.show_all(list(remote.client.paginate("/v1/catalog", params)), PLUGIN_COLUMNS)


@catalog_group.command("show")
@click.argument("name")
@click.argument("version", required=False)
@connected
def show_command(remote: Remote, name: str, version: str | None) -> None:
    """Show plugin NAME and its releases, or one VERSION with its capability report."""
    if version is None:
        plugin = remote.client.request("GET", f"/v1/catalog/{name}")
        remote.show(plugin, ("name", "description", "publisher", "latest", "archived"))
        if not remote.as_json:
            remote.show_all(plugin["releases"], ("version", "sha256", "eligible", "yanked"))
        return
    _show_release(remote, remote.client.request("GET", f"/v1/catalog/{name}/releases/{version}"))


@catalog_group.command("yank")
@click.argument("name")
@click.argument("version")
@click.option("--reason", required=True, help="Why (shown wherever it is pinned).")
@connected
def yank_command(remote: Remote, name: str, version: str, reason: str) -> None:
    """Yank NAME VERSION: no longer offered; existing pins keep working."""
    path = f"/v1/catalog/{name}/releases/{version}/yank"
    _show_release(remote, remote.client.request("POST", path, json={"reason": reason}))


@catalog_group.command("archive")
@click.argument("name")
@click.option("--reason", required=True, help="Why.")
@connected
def archive_command(remote: Remote, name: str, reason: str) -> None:
    """Archive plugin NAME: nothing more is published; existing pins keep working."""
    plugin = remote.client.request("POST", f"/v1/catalog/{name}/archive", json={"reason": reason})
    remote.show(plugin, ("name", "archived", "archive_reason"))


@catalog_group.command("eligible")
@click.argument("name")
@click.argument("version")
@click.option("--sha256", "digest", required=True, help="The digest of the release you read.")
@click.option("--off", is_flag=True, help="Withdraw the eligibility.")
@connected
def eligible_command(remote: Remote, name: str, version: str, digest: str, off: bool) -> None:
    """Mark NAME VERSION eligible for unattended use (system admins).

    \b
    Read its capability report first:
      buildmax catalog show lint-helpers 1.2.0
      buildmax catalog eligible lint-helpers 1.2.0 --sha256 <its sha256>
    """
    path = f"/v1/catalog/{name}/releases/{version}/eligibility"
    body = {"eligible": not off, "sha256": digest}
    _show_release(remote, remote.client.request("POST", path, json=body))


@click.group("run")
def run_group() -> None:
    """Prepare a claimed attempt's run on this machine."""


@run_group.command("materialize")
@click.option("--attempt", "attempt_id", required=True, help="The claimed attempt.")
@click.option(
    "--home",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The run's home: packages go to HOME/plugins/<name>/.",
)
@connected
def materialize_command(remote: Remote, attempt_id: str, home: Path) -> None:
    """Download, verify and extract the attempt's pinned plugin packages.

    Use the attempt's token (BUILDMAX_TOKEN=<the claim's token>). A package
    that fails its digest or inspection, or an answer of the server that is
    not one to trust, fails the whole materialization, leaves no
    HOME/plugins, reports the failure's reason to the server (the space's
    admins see it) and marks the attempt failed.
    """
    try:
        placed = materialize(remote.client, attempt_id, home)
    except (MaterializationFailed, BuildMaxError, OSError) as exc:
        _report_failure(remote, attempt_id, _reason(exc))
        _fail_attempt(remote, attempt_id, str(exc))
        raise CommandError(f"materialization failed: {exc}") from None
    for name, variables in placed.unset_environment.items():
        click.echo(f"warning: {name} reads {', '.join(variables)}, not set here", err=True)
    if remote.as_json:
        click.echo(
            json.dumps(
                {
                    "pins": placed.pins,
                    "lock": str(placed.lock),
                    "unset_environment": placed.unset_environment,
                },
                indent=2,
            )
        )
    else:
        for pin in placed.pins:
            click.echo(f"{pin['name']} {pin['version']} {pin['sha256'][:12]}")
        click.echo(f"wrote {placed.lock}")


def _reason(exc: Exception) -> str:
    """The code of a failed materialization (see ``REASONS``)."""
    if isinstance(exc, MaterializationFailed):
        return exc.reason
    return "server" if isinstance(exc, BuildMaxError) else "local"


def _report_failure(remote: Remote, attempt_id: str, reason: str) -> None:
    """Tell the server why the materialization failed (best effort: the
    error is reported either way)."""
    try:
        remote.client.request(
            "POST",
            f"/v1/attempts/{quote(attempt_id, safe='')}/materialization-failures",
            json={"reason": reason},
        )
    except (BuildMaxError, Unreachable) as exc:
        click.echo(f"warning: could not report the failure to the server: {exc}", err=True)


def _fail_attempt(remote: Remote, attempt_id: str, reason: str) -> None:
    """Mark the attempt failed (best effort: the error is reported either way)."""
    try:
        listing = read_listing(remote.client, attempt_id)
        space, generation = listing.get("space_id"), listing.get("generation")
        if not isinstance(space, str) or type(generation) is not int:
            raise ValueError("the server's listing names no space and generation")
        remote.client.request(
            "POST",
            space_path(space, "attempts", attempt_id, "fail"),
            json={"generation": generation, "reason": reason[:1000]},
        )
    except (BuildMaxError, Unreachable, MaterializationFailed, ValueError) as exc:
        click.echo(f"warning: could not mark the attempt failed: {exc}", err=True)
