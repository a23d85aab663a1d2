"""Human decisions: a question on a task that parks it until answered.

Opened by a member or by a stage plugin through ``TaskQueue``; answered by
whoever ``answerable_by`` allows (``human``: human members only, so an
agent can never answer for a person).
"""

from __future__ import annotations

import json
from typing import Any

from buildmax.ids import new_id

from .change import Change
from .tables import decisions


async def open_decision(
    ch: Change,
    task: dict[str, Any],
    *,
    question: str,
    options: list[str],
    answerable_by: str,
    expires_at: int | None,
    opened_by: int | None,
) -> str:
    """Open a decision on ``task``; its public id."""
    if answerable_by not in ("human", "member"):
        raise ValueError("answerable_by is 'human' or 'member'")
    if not options or len(set(options)) != len(options):
        raise ValueError("a decision needs distinct options")
    public_id = new_id("dc")
    await ch.tx.execute(
        decisions.insert().values(
            public_id=public_id,
            space_id=ch.space_pk,
            task_id=task["id"],
            question=question,
            options=json.dumps(options),
            answerable_by=answerable_by,
            state="pending",
            opened_by=opened_by,
            created_at=ch.now,
            expires_at=expires_at,
        )
    )
    await ch.audit(
        "decision.opened",
        "decision",
        public_id,
        task_id=task["public_id"],
        answerable_by=answerable_by,
        option_count=len(options),
    )
    await ch.event("decision.opened", decision_id=public_id, task_id=task["public_id"])
    return public_id
