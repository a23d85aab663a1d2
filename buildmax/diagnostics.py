"""What an operator watches: the server's facts and its attention list.

One reading serves ``/metrics`` (the facts as Prometheus gauges), ``GET
/v1/diagnostics`` and ``buildmax status`` (facts and the attention list),
and each space's ``GET /v1/spaces/{space}/attention``. The kernel reports
its own facts (free disk against the reserve, the SQLite write-ahead log,
the last backup, plugins that failed to load, draining); every plugin adds
its own through ``buildmax_gauges`` and ``buildmax_attention``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from buildmax_hookspecs import ATTENTION_ROLES, Attention, Gauge, Transaction

from .roles import SPACE_ROLES
from .tables import backup_runs, spaces

if TYPE_CHECKING:
    from .app import BuildMax

#: A volume with less than this many times the reserve free is a warning;
#: below the reserve, uploads are refused (critical).
DISK_WARNING_FACTOR = 2
#: A blob store failure this recent is an attention item (of the process
#: that saw it).
BLOB_STORE_RECENT_MS = 15 * 60_000
#: Spaces named in a per-space gauge (:func:`per_space_gauges`); the rest are
#: summed under :data:`OTHER_SPACES`, so the number of series stays bounded.
MAX_SPACES = 50
#: The label of the spaces beyond :data:`MAX_SPACES`.
OTHER_SPACES = "(other)"


@dataclass(frozen=True)
class Reading:
    """The facts and the attention list, read at ``now``."""

    now: int
    gauges: list[Gauge]
    attention: list[Attention]
    #: Space slugs by key, for the attention items' spaces.
    slugs: dict[int, str]


async def read(app: BuildMax, *, space_pk: int | None = None, gauges: bool = True) -> Reading:
    """Read the facts (unless ``gauges`` is false) and the attention list,
    of every space or of ``space_pk`` only (then without the server-wide
    items)."""
    now = app.clock.now_ms()
    found: list[Gauge] = []
    async with app.db.read() as conn:
        runs = await last_runs(conn)
        if gauges:
            found = [
                *_kernel_gauges(app, runs),
                *(g for _, g in await app.hooks.gauges(conn)),
            ]
        items = await app.hooks.attention(conn, now, space_pk)
        if space_pk is None:
            items = [*_kernel_attention(app, runs, now), *items]
        else:
            items = [item for item in items if item.space_pk == space_pk]
        slugs = await _slugs(conn, {item.space_pk for item in items if item.space_pk is not None})
    items.sort(key=lambda item: (item.severity != "critical", item.since or now))
    return Reading(now, found, items, slugs)


def visible(items: Iterable[Attention], role: str | None, *, sees_all: bool) -> list[Attention]:
    """The items a caller with space ``role`` sees (``sees_all``: a system
    admin or operator, who sees everything)."""
    if sees_all:
        return list(items)
    if role is None:
        return []
    rank = SPACE_ROLES.index(role)
    return [
        item
        for item in items
        if item.space_pk is not None and SPACE_ROLES.index(_role(item)) <= rank
    ]


def _role(item: Attention) -> str:
    return item.role if item.role in ATTENTION_ROLES else "admin"


def render_attention(item: Attention, slugs: dict[int, str]) -> dict[str, Any]:
    """One attention item as the API shows it."""
    return {
        "kind": item.kind,
        "severity": item.severity,
        "summary": item.summary,
        "since": item.since,
        "space": None if item.space_pk is None else slugs.get(item.space_pk),
        "role": item.role,
        "target": None if item.target is None else {"type": item.target[0], "id": item.target[1]},
    }


def render_gauge(gauge: Gauge) -> dict[str, Any]:
    """One fact as the API shows it."""
    return {
        "name": gauge.name,
        "help": gauge.help,
        "value": gauge.value,
        "labels": dict(gauge.labels),
    }


async def per_space_gauges(
    conn: Transaction, name: str, help: str, values: Mapping[int, float]
) -> list[Gauge]:
    """One gauge per space of the :data:`MAX_SPACES` largest ``values`` (by
    space key), labelled with the space's slug, and their remainder summed
    under :data:`OTHER_SPACES` (reported even when 0, so the series always
    exists): what a plugin reports per space."""
    ranked = sorted(values.items(), key=lambda item: (-item[1], item[0]))
    shown, rest = ranked[:MAX_SPACES], ranked[MAX_SPACES:]
    slugs = await _slugs(conn, {pk for pk, _ in shown})
    found = [
        Gauge(name, help, value, (("space", slugs[pk]),)) for pk, value in shown if pk in slugs
    ]
    found.append(Gauge(name, help, sum(value for _, value in rest), (("space", OTHER_SPACES),)))
    return found


async def _slugs(conn: Transaction, keys: set[int]) -> dict[int, str]:
    if not keys:
        return {}
    rows = await conn.fetch_all(sa.select(spaces.c.id, spaces.c.slug).where(spaces.c.id.in_(keys)))
    return {int(row["id"]): row["slug"] for row in rows}


async def last_runs(conn: Transaction) -> dict[str, Any]:
    """The newest backup run and the newest that succeeded (``None`` when
    there is none), as rows: what diagnostics show of backup freshness."""
    newest = await conn.fetch_one(
        sa.select(backup_runs).order_by(backup_runs.c.started_at.desc()).limit(1)
    )
    succeeded = await conn.fetch_one(
        sa.select(backup_runs)
        .where(backup_runs.c.state == "succeeded")
        .order_by(backup_runs.c.started_at.desc())
        .limit(1)
    )
    return {
        "last": None if newest is None else dict(newest),
        "last_succeeded": None if succeeded is None else dict(succeeded),
    }


def _backup_times(runs: dict[str, Any]) -> tuple[int | None, int | None, bool | None]:
    """(last success's end, last run's start, whether the last run succeeded)."""
    last, good = runs["last"], runs["last_succeeded"]
    succeeded_at = None if good is None else good["finished_at"]
    if last is None:
        return succeeded_at, None, None
    return succeeded_at, last["started_at"], last["state"] == "succeeded"


def _kernel_gauges(app: BuildMax, runs: dict[str, Any]) -> list[Gauge]:
    found = [
        Gauge(
            "buildmax_disk_free_bytes",
            "Free bytes where the server writes",
            v.free,
            (("volume", v.name),),
        )
        for v in app.disk.volumes()
    ]
    found.append(
        Gauge(
            "buildmax_disk_reserve_bytes",
            "Free bytes kept in reserve (min_free_bytes): uploads that would cross it get 507",
            app.disk.min_free,
        )
    )
    wal_bytes = getattr(app.db, "wal_bytes", None)
    if wal_bytes is not None:
        found.append(
            Gauge("buildmax_sqlite_wal_bytes", "Size of the SQLite write-ahead log", wal_bytes())
        )
    succeeded_at, started_at, ok = _backup_times(runs)
    if succeeded_at is not None:
        found.append(
            Gauge(
                "buildmax_backup_last_success_timestamp_seconds",
                "When the newest successful backup finished (Unix time)",
                succeeded_at / 1000,
            )
        )
    if started_at is not None:
        found.append(
            Gauge(
                "buildmax_backup_last_run_timestamp_seconds",
                "When the newest backup run started (Unix time)",
                started_at / 1000,
            )
        )
        found.append(
            Gauge(
                "buildmax_backup_last_run_success",
                "1 if the newest backup run succeeded, 0 if it failed or still runs",
                1 if ok else 0,
            )
        )
    failed = [info for info in app.plugins.infos() if not info.loaded]
    found.append(
        Gauge("buildmax_plugin_load_errors", "Installed plugins that failed to load", len(failed))
    )
    found.append(
        Gauge(
            "buildmax_draining",
            "1 while this server process drains before it stops",
            1 if app.drain.draining else 0,
        )
    )
    return found


def _kernel_attention(app: BuildMax, runs: dict[str, Any], now: int) -> list[Attention]:
    items = []
    succeeded_at, started_at, ok = _backup_times(runs)
    stale_ms = app.settings.backup_stale_seconds * 1000
    if succeeded_at is None:
        items.append(
            Attention(
                "backup.stale", "no backup has succeeded yet (buildmax backup create)", None, None
            )
        )
    elif now - succeeded_at > stale_ms:
        hours = (now - succeeded_at) / 3_600_000
        items.append(
            Attention(
                "backup.stale",
                f"the newest successful backup is {hours:.1f} hours old "
                f"(stale after {app.settings.backup_stale_seconds // 3600} hours)",
                succeeded_at,
                None,
            )
        )
    if ok is False and started_at is not None:
        items.append(Attention("backup.failed", "the newest backup run failed", started_at, None))
    for volume in app.disk.volumes():
        reserve = app.disk.min_free
        if volume.free < reserve:
            items.append(
                Attention(
                    "disk.reserve",
                    f"{volume.name} ({volume.path}) has {volume.free} bytes free, below the "
                    f"{reserve}-byte reserve: uploads and publishes are refused",
                    None,
                    None,
                    severity="critical",
                )
            )
        elif volume.free < reserve * DISK_WARNING_FACTOR:
            items.append(
                Attention(
                    "disk.low",
                    f"{volume.name} ({volume.path}) has {volume.free} bytes free, near the "
                    f"{reserve}-byte reserve",
                    None,
                    None,
                )
            )
    failed_at = app.metrics.blob_store_failed_at
    if failed_at is not None and now - failed_at < BLOB_STORE_RECENT_MS:
        items.append(
            Attention(
                "blob_store.errors",
                "the blob store failed to answer within the last 15 minutes "
                "(buildmax_blob_store_errors_total counts the failures; see the server log)",
                failed_at,
                None,
            )
        )
    for info in app.plugins.infos():
        if not info.loaded:
            items.append(
                Attention(
                    "plugin.failed", f"plugin {info.name} failed to load: {info.error}", None, None
                )
            )
    return items
