"""What agents name and what runs load.

When an agent revision is saved, every plugin it names must be activated in
its space (``curated``) or is activated now (``open``). When an attempt is
claimed, the agent revision's names are resolved against the task's space's
activations into exact pins, recorded on the attempt (its run token may
download exactly those packages); a named plugin with no enabled activation
refuses the claim.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from buildmax_hookspecs import (
    Actor,
    AgentRevisionRef,
    AttemptRef,
    RunEnvironmentRefused,
    Transaction,
    Verdict,
)

from buildmax.problems import Problem
from buildmax.spaces import space_pk as find_space_pk

from .activation import activation, curation_mode, pin, refusal

if TYPE_CHECKING:
    from buildmax.app import BuildMax


async def agent_revision(
    app: BuildMax, tx: Transaction, space_id: str, revision: AgentRevisionRef, actor: Actor
) -> Verdict | None:
    """Refuse a revision naming a plugin its curated space has not
    activated; in an open space, activate what it names (``automatic``)."""
    if not revision.plugins:
        return None
    space_pk = await find_space_pk(tx, space_id)
    assert space_pk is not None
    mode = await curation_mode(tx, space_pk)
    for name in revision.plugins:
        if await activation(tx, space_pk, name) is not None:
            continue
        if mode == "curated":
            return Verdict(
                "deny",
                f"plugin {name!r} is not activated in this space, which is curated: a space "
                "owner or admin activates it first",
            )
        try:
            await pin(
                app,
                tx,
                space_pk=space_pk,
                space_id=space_id,
                name=name,
                version=None,
                actor=actor,
                origin="automatic",
            )
        except Problem as problem:
            return Verdict("deny", f"plugin {name!r} cannot be activated: {problem.detail}")
    return None


async def run_environment(
    app: BuildMax, tx: Transaction, attempt: AttemptRef, agent_revision: AgentRevisionRef | None
) -> dict[str, Any]:
    """The run's pins: every plugin its agent names, resolved against the
    task's space's enabled activations (``RunEnvironmentRefused`` naming the
    plugin otherwise); none without an agent, or with an agent of another
    space."""
    if agent_revision is None or agent_revision.space_id != attempt.space_id:
        return {"plugins": {"agent_revision_id": None, "pins": []}}
    space_pk = await find_space_pk(tx, attempt.space_id)
    assert space_pk is not None
    claimant = Actor(
        principal_id=attempt.claimant_id,
        kind=attempt.claimant_kind,  # type: ignore[arg-type]
        name=attempt.claimant_id,
    )
    resolved = []
    for name in agent_revision.plugins:
        found = await activation(tx, space_pk, name)
        if found is None:
            raise RunEnvironmentRefused(
                f"agent {agent_revision.agent_name!r} names plugin {name!r}, which this space "
                "has not activated"
            )
        if not found["enabled"]:
            raise RunEnvironmentRefused(
                f"plugin {name!r} is suspended in this space; agent "
                f"{agent_revision.agent_name!r} names it, so its runs stop until it is resumed"
            )
        # Asked again at every claim: an eligibility withdrawn after the
        # activation stops the runs that would load the release.
        reason = await refusal(app, tx, attempt.space_id, found, claimant)
        if reason is not None:
            raise RunEnvironmentRefused(f"plugin {name!r} may not run here now: {reason}")
        resolved.append(
            {
                "name": name,
                "version": found["version"],
                "sha256": found["sha256"],
                "origin": found["origin"],
                "activated_by": found["activated_by_id"],
                "activated_at": found["activated_at"],
                "updated_by": found["updated_by_id"],
                "updated_at": found["updated_at"],
            }
        )
    return {"plugins": {"agent_revision_id": agent_revision.id, "pins": resolved}}
