"""A principal who may no longer run work in a space leaves no run there
(issue 14, item 6).

The kernel announces membership changes through ``buildmax_member_changed``;
when a member is removed, leaves, or is demoted to ``viewer``, the tasks
plugin releases every active attempt it holds in that space in the same
transaction: uncharged, the task ready again, the run tokens revoked and the
reservations ended, each audited. Nothing else changes.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from buildmax_hookspecs import hookimpl
from buildmax_tasks.tables import attempts

from buildmax.tables import tokens
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


class ClaimWatcher:
    """A plugin that signals when a claim route has let its caller in (the
    kernel asks ``buildmax_permission`` as it checks the membership)."""

    def __init__(self) -> None:
        self.admitted = asyncio.Event()

    @hookimpl
    def buildmax_permission(self, actor: Any, action: str, resource: Any) -> None:
        if action == "tasks.claim":
            self.admitted.set()


@pytest.fixture
def claim_watcher(app: Any) -> Any:
    plugin = ClaimWatcher()
    app.plugins.pm.register(plugin, name="claim-watcher")
    yield plugin
    app.plugins.pm.unregister(plugin)


@pytest.mark.parametrize("change", [None, "viewer"], ids=["removed", "demoted"])
@pytest.mark.parametrize("route", ["named", "next"])
async def test_a_claim_whose_body_arrives_after_the_removal_gets_nothing(
    work, claim_watcher, change, route
):
    """A claim route lets its caller in, then reads the body: a member
    removed (or demoted) meanwhile, by a slow body, was given the task, an
    attempt the removal never saw, a live run token and the task's
    contents. Mutation: drop the membership check in the claim's
    transaction (``recheck_space``) and this claim answers 201."""
    task = await work.task("late", body="the task's contents")
    path = f"{work.base}/tasks/{task['id']}/claim" if route == "named" else f"{work.base}/claims"
    headers = {**work.agent.headers, "Content-Type": "application/json"}
    async with work.client.request(path, method="POST", headers=headers) as late:
        await claim_watcher.admitted.wait()
        await change_member(work, work.agent, work.owner, change)
        await late.send(json.dumps({}).encode())
        await late.send_complete()
    answer = await late.as_response()
    assert answer.status_code in (403, 404), await answer.get_data()
    assert b"the task's contents" not in await answer.get_data()
    assert await work.attempts_of(task["id"]) == []
    assert (await work.task_row(task["id"]))["state"] == "ready"
    scoped = await work.rows(tokens, tokens.c.scope_type == "attempt")
    assert scoped == []


class RemovalDuringClaim:
    """A claim check that, inside the claim's transaction, starts the
    claimant's removal and gives it a second to finish."""

    def __init__(self, work: Any) -> None:
        self.work = work
        self.removal: asyncio.Task[None] | None = None

    @hookimpl
    async def buildmax_claim_check(self, tx: Any, task: Any, principal: Any) -> None:
        if self.removal is None:
            self.removal = asyncio.create_task(
                change_member(self.work, self.work.agent, self.work.owner, None)
            )
            await asyncio.wait({self.removal}, timeout=1.0)


async def test_a_removal_while_a_claim_commits_still_releases_what_it_made(work, app):
    """A removal that runs beside a claim's transaction (after the claim's
    recheck) must wait for it and then release its attempt: on PostgreSQL,
    without the share lock of ``recheck_space`` the removal commits first,
    sees no attempt, and the claim then commits one for a non-member
    (mutation: drop ``with_for_update(read=True)``). SQLite serialises the
    two writes."""
    task = await work.task("raced")
    racer = RemovalDuringClaim(work)
    app.plugins.pm.register(racer, name="removal-during-claim")
    try:
        claim = await work.claim(task["id"])
        assert racer.removal is not None
        await racer.removal
    finally:
        app.plugins.pm.unregister(racer)
    row = await attempt_row(work, claim)
    assert (row["state"], row["end_reason"]) == ("released", GONE)
    assert await token_revoked(work, claim)
