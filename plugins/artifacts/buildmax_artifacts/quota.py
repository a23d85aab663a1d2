"""Quota accounting: reserve before an upload streams, then settle or release.

Each reservation is one short write transaction: a conditional ``UPDATE``
per scope adds the declared bytes only if stored + reserved + declared stays
within the scope's limit (the row lock makes concurrent uploads queue, so
they can never overshoot together), and an ``artifact_uploads`` row names
the reservation. No transaction is open while the bytes stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Actor, App, Transaction
from sqlalchemy.dialects import postgresql, sqlite

from buildmax.ids import new_id

from .problems import QuotaExceeded
from .settings import ArtifactSettings, artifact_settings
from .tables import quotas, uploads

DEPLOYMENT = "deployment"


@dataclass(frozen=True)
class Reservation:
    """Bytes set aside for one upload in flight."""

    public_id: str
    space_pk: int
    space_id: str
    bytes: int

    @property
    def scopes(self) -> tuple[str, str]:
        """The quota scopes it counts against."""
        return DEPLOYMENT, f"space:{self.space_id}"


_ENSURE = {
    name: insert(quotas)
    .values(scope=sa.bindparam("scope"), used=0, reserved=0)
    .on_conflict_do_nothing(index_elements=["scope"])
    for name, insert in (("sqlite", sqlite.insert), ("postgresql", postgresql.insert))
}


def _grow_within_limit(column: str) -> sa.Update:
    """``UPDATE`` adding ``:bytes`` to ``column`` of ``:scope`` only if used +
    reserved + bytes stays within ``:limit``; returns the scope, or nothing."""
    added = sa.bindparam("bytes", type_=sa.BigInteger)
    return (
        sa.update(quotas)
        .where(
            quotas.c.scope == sa.bindparam("scope"),
            quotas.c.used + quotas.c.reserved + added <= sa.bindparam("limit", type_=sa.BigInteger),
        )
        .values({column: quotas.c[column] + added})
        .returning(quotas.c.scope)
    )


#: Set bytes aside for an upload about to stream.
_RESERVE = _grow_within_limit("reserved")
#: Count stored bytes whose reservation is gone.
_TAKE = _grow_within_limit("used")
_MOVE = (
    sa.update(quotas)
    .where(quotas.c.scope == sa.bindparam("scope"))
    .values(
        reserved=quotas.c.reserved - sa.bindparam("reserved", type_=sa.BigInteger),
        used=quotas.c.used + sa.bindparam("stored", type_=sa.BigInteger),
    )
)


async def reserve(
    app: App, settings: ArtifactSettings, space_pk: int, space_id: str, size: int, principal_pk: int
) -> Reservation:
    """Set ``size`` bytes aside in the deployment's and the space's quota;
    :class:`QuotaExceeded` (and nothing changed) when either is full."""
    reservation = Reservation(new_id("up"), space_pk, space_id, size)
    async with app.db.write() as tx:
        for scope, limit in zip(reservation.scopes, limits(settings), strict=True):
            await tx.execute(_ENSURE[tx.dialect], {"scope": scope})
            ok = await tx.fetch_val(_RESERVE, {"scope": scope, "bytes": size, "limit": limit})
            if ok is None:
                which = "the deployment's" if scope == DEPLOYMENT else "the space's"
                raise QuotaExceeded(f"{size} more bytes would exceed {which} quota of {limit}")
        await tx.execute(
            uploads.insert().values(
                public_id=reservation.public_id,
                space_id=space_pk,
                bytes=size,
                created_at=app.clock.now_ms(),
                created_by=principal_pk,
            )
        )
    return reservation


def limits(settings: ArtifactSettings) -> tuple[int, int]:
    """The deployment's and a space's limit, in :attr:`Reservation.scopes` order."""
    return settings.quota_bytes, settings.space_quota_bytes or settings.quota_bytes


async def settle(
    tx: Transaction,
    reservation: Reservation,
    stored: int,
    settings: ArtifactSettings,
) -> None:
    """In ``tx``: end the reservation, counting ``stored`` bytes as used
    (0 when the upload failed).

    A reservation the collector already released (its upload outlived the
    grace period) is not released twice; its stored bytes are then taken only
    if they still fit the quotas of ``settings``, else :class:`QuotaExceeded`
    (roll ``tx`` back: the artifact is refused and its blob is an orphan)."""
    reserved = await tx.fetch_val(
        uploads.delete()
        .where(uploads.c.public_id == reservation.public_id)
        .returning(uploads.c.bytes)
    )
    if reserved is None and stored > 0:
        for scope, limit in zip(reservation.scopes, limits(settings), strict=True):
            if await tx.fetch_val(_TAKE, {"scope": scope, "bytes": stored, "limit": limit}) is None:
                raise QuotaExceeded(
                    f"the upload outlived its reservation and {stored} bytes no longer fit"
                )
        return
    for scope in reservation.scopes:
        await tx.execute(_MOVE, {"scope": scope, "reserved": int(reserved or 0), "stored": stored})


async def tombstoned(
    app: App,
    tx: Transaction,
    actor: Actor,
    action: str,
    space_id: str,
    artifact_id: str,
    size: int,
    *,
    details: dict[str, Any] | None = None,
    admin_override: bool = False,
) -> None:
    """In ``tx``, for an artifact just tombstoned (deleted, expired, lost):
    give its quota back and record ``action`` on it."""
    await free(tx, space_id, size)
    await app.audit.record(
        tx,
        actor,
        action,
        space_id=space_id,
        target_type="artifact",
        target_id=artifact_id,
        details=details,
        admin_override=admin_override,
    )


async def free(tx: Transaction, space_id: str, size: int) -> None:
    """In ``tx``: give back the quota of an artifact that was deleted or lost."""
    for scope in (DEPLOYMENT, f"space:{space_id}"):
        await tx.execute(_MOVE, {"scope": scope, "reserved": 0, "stored": -size})


async def release(app: App, reservation: Reservation) -> None:
    """End a reservation whose upload failed, in its own transaction."""
    async with app.db.write() as tx:
        await settle(tx, reservation, 0, artifact_settings(app))
