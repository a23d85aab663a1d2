"""Space activations: which release of each plugin a space's runs may load.

An activation pins one exact release (version and digest). It is created by
a space owner or admin (origin ``curated``) or, in an ``open`` space, when
an agent revision first names the plugin (origin ``automatic``, pinned to
the latest unyanked release the activation policy allows). A pin moves only
when somebody moves it; yanking or archiving never changes it. Every
activation and pin move passes ``buildmax_activation_policy``.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Actor, ReleaseRef, Transaction, Verdict
from packaging.version import Version

from buildmax.app import BuildMax
from buildmax.conflicts import insert_ignoring_conflict
from buildmax.problems import NotFound
from buildmax.tables import principals

from .catalog import release, releases_of
from .problems import ActivationRefused
from .tables import activations, curation, plugins, releases


def release_ref(row: dict[str, Any]) -> ReleaseRef:
    """The contract's view of a release row from ``RELEASE_SELECT``."""
    return ReleaseRef(
        name=row["name"],
        version=row["version"],
        sha256=row["sha256"],
        executable=bool(row["executable"]),
        eligible=row["eligible_at"] is not None,
        yanked=row["yanked_at"] is not None,
    )


def eligibility_verdict(release: ReleaseRef) -> Verdict | None:
    """The marketplace's own policy: a release that starts processes needs
    a system admin's eligibility for unattended use."""
    if release.executable and not release.eligible:
        return Verdict(
            "deny",
            f"{release.name} {release.version} contributes hooks or MCP servers and no system "
            "admin has marked it eligible for unattended use",
        )
    return None


async def refusal(
    app: BuildMax, tx: Transaction, space_id: str, row: dict[str, Any], actor: Actor
) -> str | None:
    """Why the activation policy refuses ``row`` in the space, or ``None``."""
    for verdict in await app.hooks.activation_policy(
        tx,
        space_id=space_id,
        release=release_ref(row),
        actor=actor,
    ):
        if isinstance(verdict, Verdict) and verdict.outcome == "deny":
            return verdict.reason or "an activation policy refused this release"
    return None


async def curation_mode(conn: Transaction, space_pk: int, *, lock: bool = False) -> str:
    """``open`` (the default) or ``curated``; ``lock`` holds its row."""
    query = sa.select(curation.c.mode).where(curation.c.space_id == space_pk)
    mode = await conn.fetch_val(query.with_for_update() if lock else query)
    return str(mode or "open")


_activated_by = principals.alias("activated_by_principal")
_updated_by = principals.alias("updated_by_principal")
ACTIVATION_SELECT = sa.select(
    activations,
    plugins.c.name,
    plugins.c.archived_at,
    plugins.c.archive_reason,
    releases.c.version,
    releases.c.sha256,
    releases.c.size,
    releases.c.blob_key,
    releases.c.yanked_at,
    releases.c.yank_reason,
    releases.c.executable,
    releases.c.eligible_at,
    _activated_by.c.public_id.label("activated_by_id"),
    _updated_by.c.public_id.label("updated_by_id"),
).select_from(
    activations.join(plugins, plugins.c.id == activations.c.plugin_id)
    .join(releases, releases.c.id == activations.c.release_id)
    .join(_activated_by, _activated_by.c.id == activations.c.activated_by)
    .join(_updated_by, _updated_by.c.id == activations.c.updated_by)
)


async def activation(
    conn: Transaction, space_pk: int, name: str, *, lock: bool = False
) -> dict[str, Any] | None:
    """The space's activation of plugin ``name``, or ``None``; ``lock``
    holds its row until the transaction ends (concurrent changes wait)."""
    query = ACTIVATION_SELECT.where(activations.c.space_id == space_pk, plugins.c.name == name)
    if lock:
        query = query.with_for_update(of=activations)
    row = await conn.fetch_one(query)
    return dict(row) if row is not None else None


async def activations_of(conn: Transaction, space_pk: int) -> list[dict[str, Any]]:
    """Every activation of the space, by plugin name."""
    rows = await conn.fetch_all(
        ACTIVATION_SELECT.where(activations.c.space_id == space_pk).order_by(plugins.c.name)
    )
    return [dict(r) for r in rows]


async def _principal_pk(tx: Transaction, actor: Actor) -> int:
    pk = await tx.fetch_val(
        sa.select(principals.c.id).where(principals.c.public_id == actor.principal_id)
    )
    assert pk is not None, "an activation is made by a principal"
    return int(pk)


async def pin(
    app: BuildMax,
    tx: Transaction,
    *,
    space_pk: int,
    space_id: str,
    name: str,
    version: str | None,
    actor: Actor,
    origin: str,
    admin_override: bool = False,
) -> tuple[dict[str, Any], bool]:
    """Activate ``name`` in the space, or move its pin, to ``version`` (the
    latest release the policy allows when ``None``); audited. The activation
    and whether it was created. 404 for an unknown plugin or release, 422
    ``activation-refused`` with the policy's reason."""
    if version is not None:
        target = await release(tx, name, version)
        if target is None:
            raise NotFound(f"no release {version} of {name} in the catalog")
        reason = await refusal(app, tx, space_id, target, actor)
        if reason is not None:
            raise ActivationRefused(reason, plugin=name, version=target["version"])
    else:
        target = await latest_allowed(app, tx, space_id, name, actor)
    if target["archived_at"] is not None:
        raise ActivationRefused(f"{name} is archived: {target['archive_reason']}", plugin=name)
    now = app.clock.now_ms()
    by = await _principal_pk(tx, actor)
    details = {
        "plugin": name,
        "version": target["version"],
        "sha256_prefix": target["sha256"][:12],
    }
    current = await activation(tx, space_pk, name, lock=True)
    created = None
    if current is None:
        # A concurrent first activation wins the unique key; this one then
        # reads it (and, being explicit, moves its pin; automatic never does).
        created = await tx.fetch_val(
            insert_ignoring_conflict(tx.dialect, activations)
            .values(
                space_id=space_pk,
                plugin_id=target["plugin_id"],
                release_id=target["id"],
                enabled=1,
                origin=origin,
                activated_by=by,
                activated_at=now,
                updated_by=by,
                updated_at=now,
            )
            .returning(activations.c.id)
        )
        if created is None:
            current = await activation(tx, space_pk, name, lock=True)
            assert current is not None
            if origin == "automatic":
                return current, False
    if created is not None:
        action, details = "activation.created", {**details, "origin": origin}
    elif current is not None and current["release_id"] != target["id"]:
        await tx.execute(
            sa.update(activations)
            .where(activations.c.id == current["id"])
            .values(release_id=target["id"], updated_by=by, updated_at=now)
        )
        action, details = "activation.pin_moved", {**details, "from_version": current["version"]}
    else:
        assert current is not None
        return current, False
    await app.audit.record(
        tx,
        actor,
        action,
        space_id=space_id,
        target_type="catalog_plugin",
        target_id=name,
        details=details,
        admin_override=admin_override,
    )
    found = await activation(tx, space_pk, name)
    assert found is not None
    return found, created is not None


async def latest_allowed(
    app: BuildMax, tx: Transaction, space_id: str, name: str, actor: Actor
) -> dict[str, Any]:
    """The newest unyanked final release (pre-releases are pinned only on
    purpose) of ``name`` the activation policy allows in the space; 404 for a
    plugin not in the catalog, 422 when none is allowed."""
    found = await releases_of(tx, name)
    if not found:
        raise NotFound(f"{name} is not in the catalog")
    reasons = []
    for row in found:
        if row["yanked_at"] is not None or Version(row["version"]).is_prerelease:
            continue
        reason = await refusal(app, tx, space_id, row, actor)
        if reason is None:
            return row
        reasons.append(reason)
    raise ActivationRefused(
        f"no release of {name} may be activated: "
        + ("; ".join(reasons[:3]) if reasons else "every release is yanked"),
        plugin=name,
    )


async def set_enabled(
    app: BuildMax,
    tx: Transaction,
    *,
    space_pk: int,
    space_id: str,
    name: str,
    enabled: bool,
    actor: Actor,
    admin_override: bool = False,
) -> dict[str, Any]:
    """Suspend or resume an activation (its pin stays); audited when it changes."""
    current = await activation(tx, space_pk, name, lock=True)
    if current is None:
        raise NotFound(f"{name} is not activated in this space")
    if bool(current["enabled"]) == enabled:
        return current
    await tx.execute(
        sa.update(activations)
        .where(activations.c.id == current["id"])
        .values(
            enabled=int(enabled),
            updated_by=await _principal_pk(tx, actor),
            updated_at=app.clock.now_ms(),
        )
    )
    await app.audit.record(
        tx,
        actor,
        "activation.resumed" if enabled else "activation.suspended",
        space_id=space_id,
        target_type="catalog_plugin",
        target_id=name,
        details={
            "plugin": name,
            "version": current["version"],
            "sha256_prefix": current["sha256"][:12],
        },
        admin_override=admin_override,
    )
    found = await activation(tx, space_pk, name)
    assert found is not None
    return found


def newer(current_version: str, releases_newest_first: list[dict[str, Any]]) -> str | None:
    """The newest unyanked final version above ``current_version``, if any."""
    for row in releases_newest_first:
        candidate = Version(row["version"])
        if (
            row["yanked_at"] is None
            and not candidate.is_prerelease
            and candidate > Version(current_version)
        ):
            return str(row["version"])
        if Version(row["version"]) <= Version(current_version):
            return None
    return None
