"""``buildmax status``: the server's facts and what needs a person now."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from .identity import Remote, connected, render_table


def _when(ms: int | None, now: int) -> str:
    if ms is None:
        return "-"
    ago = max(0, now - ms) // 1000
    stamp = time.strftime("%Y-%m-%d %H:%M", time.gmtime(ms / 1000))
    if ago < 3600:
        return f"{stamp} ({ago // 60} min ago)"
    return f"{stamp} ({ago / 3600:.1f} h ago)"


def _attention_rows(items: list[dict[str, Any]], now: int) -> list[dict[str, Any]]:
    return [
        {
            "severity": item["severity"],
            "kind": item["kind"],
            "space": item["space"] or "(server)",
            "since": _when(item["since"], now),
            "summary": item["summary"],
        }
        for item in items
    ]


def _fact_rows(facts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for fact in facts:
        labels = ",".join(f"{k}={v}" for k, v in sorted(fact["labels"].items()))
        value = fact["value"]
        rows.append(
            {
                "fact": fact["name"].removeprefix("buildmax_"),
                "labels": labels,
                "value": int(value) if float(value).is_integer() else value,
            }
        )
    return rows


ATTENTION_COLUMNS = ("severity", "kind", "space", "since", "summary")


@click.command()
@click.option(
    "--space",
    metavar="SPACE",
    help="Show only this space's attention list, as far as your role in it sees "
    "(any member). Without it: the whole server's facts and list (system admins "
    "and operators).",
)
@connected
def status(remote: Remote, space: str | None) -> None:
    """What the server looks like now and what needs a person.

    Lists free disk against the reserve, the last backup, leases, queues
    and the other facts of every plugin, then the attention list: lapsed
    leases awaiting recovery, pending decisions, reviews waiting too long,
    a stale backup, low disk."""
    if space is not None:
        body = remote.client.space_attention(space)
        if remote.as_json:
            click.echo(json.dumps(body, indent=2))
            return
        _print_attention(body["items"], body["generated_at"])
        return
    body = remote.client.diagnostics()
    if remote.as_json:
        click.echo(json.dumps(body, indent=2))
        return
    server = body["server"]
    click.echo(
        f"BuildMax {server['version']} on {server['engine']}, {server['workers']} worker(s)"
        + (", DRAINING" if server["draining"] else "")
    )
    click.echo()
    click.echo(render_table(_fact_rows(body["facts"]), ("fact", "labels", "value")))
    click.echo()
    _print_attention(body["attention"], body["generated_at"])


def _print_attention(items: list[dict[str, Any]], now: int) -> None:
    if not items:
        click.echo("Nothing needs attention.")
        return
    click.echo(f"Needs attention ({len(items)}):")
    click.echo(render_table(_attention_rows(items, now), ATTENTION_COLUMNS))


def register(cli: click.Group) -> None:
    """Add ``status`` to the root group."""
    cli.add_command(status)
