"""Agent definitions: append-only revisions, validated by plugins before saving."""

from __future__ import annotations

import json

import sqlalchemy as sa
from buildmax_hookspecs import AgentRevisionRef, Verdict

from buildmax.conflicts import insert_ignoring_conflict
from buildmax.ids import new_id
from buildmax.problems import NameTaken
from buildmax.tables import keyed

from .change import Change
from .problems import AgentRevisionRefused, RevisionConflict
from .records import find_agent
from .rows import AgentRow
from .tables import agent_plugins, agent_revisions, agents


async def create_agent(
    ch: Change, creator_pk: int, name: str, *, instructions: str, plugins: list[str]
) -> AgentRow:
    """A new agent of the space named ``name`` with its first revision;
    409 ``name-taken`` for a name the space has, 422 when a plugin refuses
    the revision (nothing is saved)."""
    row = await ch.tx.fetch_one(
        insert_ignoring_conflict(ch.tx.dialect, agents)
        .values(
            public_id=new_id("ag"),
            space_id=ch.space_pk,
            name=name,
            created_at=ch.now,
            created_by=creator_pk,
        )
        .returning(*keyed(agents))
    )
    if row is None:
        raise NameTaken(f"an agent named {name!r} already exists in this space")
    agent = AgentRow.of(row)
    await ch.audit("agent.created", "agent", agent.id, name=name)
    await save_revision(
        ch, agent, instructions=instructions, plugins=plugins, created_by=creator_pk
    )
    return agent


async def revise_agent(
    ch: Change,
    editor_pk: int,
    agent_ref: str,
    expected_revision: int | None,
    *,
    instructions: str,
    plugins: list[str],
) -> AgentRow:
    """A new revision of the agent ``agent_ref`` (its public id or name)
    becomes current; 409 when the current one is not ``expected_revision``
    (``None``: whatever it is), 422 when a plugin refuses it."""
    agent = await find_agent(ch.tx, ch.space_pk, agent_ref, for_update=True)
    current = await _latest_number(ch, agent.pk)
    if expected_revision is not None and expected_revision != current:
        raise RevisionConflict(
            f"the agent is at revision {current}, not {expected_revision}", revision=current
        )
    await save_revision(ch, agent, instructions=instructions, plugins=plugins, created_by=editor_pk)
    return agent


async def _latest_number(ch: Change, agent_pk: int) -> int:
    """The number of the agent's newest (current) revision."""
    latest = await ch.tx.fetch_val(
        sa.select(sa.func.coalesce(sa.func.max(agent_revisions.c.number), 0)).where(
            agent_revisions.c.agent_id == agent_pk
        )
    )
    return int(latest)


async def save_revision(
    ch: Change,
    agent: AgentRow,
    *,
    instructions: str,
    plugins: list[str],
    created_by: int | None,
) -> int:
    """Append a revision to ``agent`` and make it current; 422 when a plugin
    refuses it through ``buildmax_agent_revision`` (nothing is saved). Its
    number."""
    number = await _latest_number(ch, agent.pk) + 1
    names = sorted(set(plugins))
    public_id = new_id("ar")
    ref = AgentRevisionRef(
        id=public_id,
        agent_id=agent.id,
        space_id=ch.space_id,
        agent_name=agent.name,
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
            agent_id=agent.pk,
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
        sa.update(agents).where(agents.c.id == agent.pk).values(current_revision_id=pk)
    )
    await ch.audit("agent.revised", "agent", agent.id, revision=number, plugins=names)
    await ch.event("agent.revised", agent_id=agent.id, revision=number)
    return number
