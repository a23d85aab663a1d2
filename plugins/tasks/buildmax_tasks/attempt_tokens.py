"""The token a claim hands out, scoped to its attempt: issued with the
attempt, shown once, and replaced when a claim's answer is replayed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from buildmax_hookspecs import Transaction

from buildmax.tables import spaces
from buildmax.tokens import IssuedToken, issue_token, reissue_token

from .change import Change
from .tables import attempts

if TYPE_CHECKING:
    from buildmax.app import BuildMax
    from buildmax.auth import Caller
    from buildmax.idempotency import Reminter

#: The secret kind of a claim's answer, for its idempotency receipt.
TOKEN_KIND = "attempt_token"


async def issue_attempt_token(ch: Change, claimant_pk: int, attempt_id: str) -> IssuedToken:
    """A token of ``claimant_pk`` scoped to the new attempt ``attempt_id``."""
    return await issue_token(
        ch.tx,
        principal_pk=claimant_pk,
        now=ch.now,
        name=f"attempt {attempt_id}",
        origin="claim",
        scope_type="attempt",
        scope_id=attempt_id,
    )


def attempt_token_reminter(app: BuildMax) -> Reminter:
    """How a replayed claim's answer gets a fresh token (registered with
    ``app.idempotency`` under :data:`TOKEN_KIND`)."""

    async def remint(
        tx: Transaction, caller: Caller, body: dict[str, Any]
    ) -> dict[str, Any] | None:
        """Replace the token nobody saw, if its attempt is still active."""
        attempt = await tx.fetch_one(
            sa.select(
                attempts.c.id.label("pk"), attempts.c.state, spaces.c.public_id.label("space_id")
            )
            .join(spaces, spaces.c.id == attempts.c.space_id)
            .where(attempts.c.public_id == body["attempt"]["id"])
        )
        if attempt is None or attempt["state"] != "active":
            return None
        issued = await reissue_token(tx, body["token_id"], now=app.clock.now_ms())
        if issued is None:
            return None
        await tx.execute(
            sa.update(attempts)
            .where(attempts.c.id == attempt["pk"])
            .values(token_id=issued.public_id)
        )
        await app.audit.record(
            tx,
            caller.actor,
            "token.rotated",
            space_id=attempt["space_id"],
            target_type="token",
            target_id=issued.public_id,
            details={"principal_id": caller.actor.principal_id, "replaces": body["token_id"]},
        )
        return {**body, "token": issued.secret, "token_id": issued.public_id}

    return remint
