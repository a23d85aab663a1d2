"""Review findings: what a review asks of its subject, resolved once."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Actor, App, TaskQueue, Transaction

from buildmax.problems import Forbidden, NotFound

from .tables import findings, reviews

#: A finding with its review's public id.
FINDING_SELECT = sa.select(findings, reviews.c.public_id.label("review_public_id")).select_from(
    findings.join(reviews, reviews.c.id == findings.c.review_id)
)


async def resolve(
    app: App,
    tx: Transaction,
    actor: Actor,
    space_pk: int,
    space_id: str,
    finding_id: str,
    resolution: str,
    *,
    admin_override: bool,
) -> dict[str, Any]:
    """Mark the finding resolved with ``resolution``, audited; resolving
    twice keeps the first resolution. 404 when the space has no such
    finding; 403 when an attempt's token resolves another task's finding.
    The finding's row, as it stands."""
    lookup = FINDING_SELECT.where(
        findings.c.space_id == space_pk, findings.c.public_id == finding_id
    )
    row = await tx.fetch_one(lookup)
    if row is None:
        raise NotFound("no such finding in this space")
    if actor.scope_type == "attempt":
        attempt = await app.services.get(TaskQueue).attempt(tx, str(actor.scope_id))
        if attempt is None or attempt.task_id != row["subject_task_id"]:
            raise Forbidden("an attempt's token resolves the findings of its own task only")
    if row["resolved_at"] is not None:
        return dict(row)
    await tx.execute(
        sa.update(findings)
        .where(findings.c.id == row["id"], findings.c.resolved_at.is_(None))
        .values(
            resolved_at=app.clock.now_ms(), resolved_by=actor.principal_id, resolution=resolution
        )
    )
    await app.audit.record(
        tx,
        actor,
        "finding.resolved",
        space_id=space_id,
        target_type="finding",
        target_id=finding_id,
        details={"subject_id": row["subject_task_id"], "review_id": row["review_public_id"]},
        admin_override=admin_override,
    )
    fresh = await tx.fetch_one(lookup)
    assert fresh is not None
    return dict(fresh)
