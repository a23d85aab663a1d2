"""Agent definitions: append-only revisions, validated by plugins before saving."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import AgentRevisionRef, Verdict

from buildmax.ids import new_id

from .change import Change
from .problems import AgentRevisionRefused
from .tables import agent_plugins, agent_revisions, agents


async def save_revision(
    ch: Change,
    agent: dict[str, Any],
    *,
    instructions: str,
    plugins: list[str],
    created_by: int | None,
) -> dict[str, Any]:
    """Append a revision to ``agent`` and make it current; 422 when a plugin
    refuses it through ``buildmax_agent_revision`` (nothing is saved)."""
    number = (
        int(
            await ch.tx.fetch_val(
                sa.select(sa.func.coalesce(sa.func.max(agent_revisions.c.number), 0)).where(
                    agent_revisions.c.agent_id == agent["id"]
                )
            )
        )
        + 1
    )
    names = sorted(set(plugins))
    public_id = new_id("ar")
    ref = AgentRevisionRef(
        id=public_id,
        agent_id=agent["public_id"],
        space_id=ch.space_id,
        agent_name=agent["name"],
        number=number,
        instructions=instructions,
        plugins=tuple(names),
    )
    for verdict in await ch.app.hooks.agent_revision(
        ch.tx, space_id=ch.space_id, revision=ref, actor=ch.actor
    ):
        if isinstance(verdict, Verdict) and verdict.outcome == "deny":
            raise AgentRevisionRefused(verdict.reason or "a plugin refused this agent revision")
    pk = await ch.tx.fetch_val(
        agent_revisions.insert()
        .values(
            public_id=public_id,
            agent_id=agent["id"],
            number=number,
            instructions=instructions,
            plugins=json.dumps(names),
            created_at=ch.now,
            created_by=created_by,
        )
        .returning(agent_revisions.c.id)
    )
    for name in names:
        await ch.tx.execute(agent_plugins.insert().values(revision_id=pk, plugin=name))
    await ch.tx.execute(
        sa.update(agents).where(agents.c.id == agent["id"]).values(current_revision_id=pk)
    )
    await ch.audit("agent.revised", "agent", agent["public_id"], revision=number, plugins=names)
    await ch.event("agent.revised", agent_id=agent["public_id"], revision=number)
    return {
        "id": public_id,
        "number": number,
        "instructions": instructions,
        "plugins": names,
        "created_at": ch.now,
    }
