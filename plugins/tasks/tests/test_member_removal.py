"""A principal who may no longer run work in a space leaves no run there
(issue 14, item 6).

The kernel announces membership changes through ``buildmax_member_changed``;
when a member is removed, leaves, or is demoted to ``viewer``, the tasks
plugin releases every active attempt it holds in that space in the same
transaction: uncharged, the task ready again, the run tokens revoked and the
reservations ended, each audited. Nothing else changes.
"""

from __future__ import annotations

from typing import Any

from buildmax_tasks.schema import attempts

from buildmax.schema import tokens
from buildmax.testing import PrincipalHandle

from .conftest import add_member

GONE = "its claimant is no longer a member of the space"


async def token_revoked(work: Any, claim: dict[str, Any]) -> bool:
    row = await work.one(tokens, tokens.c.public_id == claim["token_id"])
    return row["revoked_at"] is not None


async def attempt_row(work: Any, claim: dict[str, Any]) -> dict[str, Any]:
    return await work.one(attempts, attempts.c.public_id == claim["attempt"]["id"])  # type: ignore[no-any-return]


async def change_member(
    work: Any, who: PrincipalHandle, by: PrincipalHandle, role: str | None
) -> None:
    path = f"/v1/spaces/{work.space.id}/members/{who.id}"
    if role is None:
        await work.call("DELETE", path, by, expect=204)
    else:
        await work.call("PUT", path, by, json={"role": role}, expect=200)


async def test_removing_a_member_releases_its_runs_in_that_space_and_nothing_else(
    work, make_space, audit_log
):
    """Catches: the hook not called by the kernel (the runs stay active, the
    tokens live); the attempts of every space released, not the space's."""
    reserved = await work.task("reserved", resources=["repo:web@main"])
    plain = await work.task("plain")
    kept_task = await work.task("kept")
    leaving = [await work.claim(reserved["id"]), await work.claim(plain["id"])]
    kept = await work.claim(kept_task["id"], work.agent2)
    elsewhere = await make_space(work.owner)
    await add_member(work.app, elsewhere, work.agent, "member")
    other_base = f"/v1/spaces/{elsewhere.id}"
    await work.call("POST", f"{other_base}/projects", json={"name": "main"}, expect=201)
    other_task = await work.call(
        "POST", f"{other_base}/tasks", json={"project": "main", "title": "x"}, expect=201
    )
    there = await work.call(
        "POST", f"{other_base}/tasks/{other_task['id']}/claim", work.agent, json={}, expect=201
    )
    assert await work.reservations() == [("repo:web@main", leaving[0]["attempt"]["id"])]

    await change_member(work, work.agent, work.owner, None)

    for claim in leaving:
        row = await attempt_row(work, claim)
        assert (row["state"], row["end_reason"], row["charged"]) == ("released", GONE, 0)
        assert await token_revoked(work, claim)
        task = await work.task_row(claim["task"]["id"])
        assert (task["state"], task["attempts_used"]) == ("ready", 0)
        await work.call("GET", f"/attempts/{claim['attempt']['id']}", claim["token"], expect=401)
    assert await work.reservations() == []
    released = audit_log.of("attempt.released")
    assert sorted(e.target_id for e in released) == sorted(c["attempt"]["id"] for c in leaving)
    assert {(e.actor_id, e.details["reason"], e.space_id) for e in released} == {
        (work.owner.id, GONE, work.space.id)
    }
    # Forbidden side effects: the member who stays and the other space.
    for claim in (kept, there):
        assert (await attempt_row(work, claim))["state"] == "active"
        assert not await token_revoked(work, claim)
    await work.report(kept, "renew")
    # Nothing is stranded: another member claims the released work at once.
    again = await work.claim(plain["id"], work.agent2)
    assert again["attempt"]["generation"] == 2


async def test_a_demotion_to_viewer_releases_the_runs_and_other_role_changes_do_not(
    work, audit_log
):
    """Catches: every role change taken for a removal (the promotion to
    admin would release the run)."""
    claim = await work.claim((await work.task())["id"])
    await change_member(work, work.agent, work.owner, "admin")
    await change_member(work, work.agent, work.owner, "member")
    assert (await attempt_row(work, claim))["state"] == "active"
    assert not await token_revoked(work, claim)
    assert audit_log.of("attempt.released") == []

    await change_member(work, work.agent, work.owner, "viewer")
    row = await attempt_row(work, claim)
    assert (row["state"], row["charged"]) == ("released", 0)
    assert row["end_reason"] == "its claimant's role in the space is now viewer, which runs no work"
    assert await token_revoked(work, claim)
    [event] = audit_log.of("attempt.released")
    assert event.actor_id == work.owner.id


async def test_a_member_who_leaves_releases_its_own_runs(work, audit_log):
    claim = await work.claim((await work.task())["id"])
    await change_member(work, work.agent, work.agent, None)
    assert (await attempt_row(work, claim))["state"] == "released"
    assert await token_revoked(work, claim)
    [event] = audit_log.of("attempt.released")
    assert (event.actor_id, event.details["reason"]) == (work.agent.id, GONE)
    [left] = audit_log.of("space.member.removed")
    assert left.target_id == work.agent.id
