"""What an operator watches of artifacts: bytes stored against the quotas.

Read from ``artifact_quotas``, which keeps one row per space that ever
stored an artifact and one for the deployment: no artifact row is read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa
from buildmax_hookspecs import Gauge, Transaction

from buildmax.tables import spaces

from .quota import DEPLOYMENT, limits
from .settings import artifact_settings
from .tables import quotas

if TYPE_CHECKING:
    from buildmax.app import BuildMax

#: Spaces named in a per-space gauge; the rest are summed under
#: :data:`OTHER_SPACES`, so the number of series stays bounded.
MAX_SPACES = 50
#: The label of the spaces beyond :data:`MAX_SPACES`.
OTHER_SPACES = "(other)"
_SPACE_SCOPE = "space:"

#: Counts a sweep (retention and collection) that failed, by why.
SWEEP_FAILURES = (
    "buildmax_artifact_sweep_failures",
    "Artifact sweeps (retention and garbage collection) that failed: blob_store when the "
    "blob store did not answer, error otherwise",
    ("reason",),
)

_USED = sa.select(quotas.c.scope, quotas.c.used)


async def gauges(app: BuildMax, conn: Transaction) -> list[Gauge]:
    """Bytes stored per space (the :data:`MAX_SPACES` spaces storing the
    most, by slug, the rest summed under ``(other)``) with each named
    space's quota, and the deployment's bytes and quota."""
    deployment_limit, space_limit = limits(artifact_settings(app))
    used = {row["scope"]: int(row["used"]) for row in await conn.fetch_all(_USED)}
    by_space = {
        scope.removeprefix(_SPACE_SCOPE): n
        for scope, n in used.items()
        if scope.startswith(_SPACE_SCOPE)
    }
    ranked = sorted(by_space.items(), key=lambda item: (-item[1], item[0]))
    slugs = await _slugs(conn, [public_id for public_id, _ in ranked[:MAX_SPACES]])
    shown = [(public_id, n) for public_id, n in ranked[:MAX_SPACES] if public_id in slugs]
    other = sum(by_space.values()) - sum(n for _, n in shown)
    stored = "Bytes of live artifacts stored, per space"
    limit = "The quota of a space's artifacts, in bytes"
    found = [Gauge("buildmax_artifact_bytes", stored, n, (("space", slugs[p]),)) for p, n in shown]
    found.append(Gauge("buildmax_artifact_bytes", stored, other, (("space", OTHER_SPACES),)))
    found += [
        Gauge("buildmax_artifact_quota_bytes", limit, space_limit, (("space", slugs[p]),))
        for p, _ in shown
    ]
    found.append(
        Gauge(
            "buildmax_artifact_deployment_bytes",
            "Bytes of live artifacts stored, all spaces together",
            used.get(DEPLOYMENT, 0),
        )
    )
    found.append(
        Gauge(
            "buildmax_artifact_deployment_quota_bytes",
            "The quota of all spaces' artifacts together, in bytes",
            deployment_limit,
        )
    )
    return found


async def _slugs(conn: Transaction, public_ids: list[str]) -> dict[str, str]:
    """The slugs of the spaces ``public_ids``."""
    if not public_ids:
        return {}
    rows = await conn.fetch_all(
        sa.select(spaces.c.public_id, spaces.c.slug).where(spaces.c.public_id.in_(public_ids))
    )
    return {r["public_id"]: r["slug"] for r in rows}
