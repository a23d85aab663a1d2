"""What the queue tells an operator: its gauges, its attention items and its
counters (``buildmax_gauges``, ``buildmax_attention``, ``app.metrics``).

Leases lapse only when the injected clock says so; the reaper is called
directly."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from buildmax_tasks import diagnostics
from buildmax_tasks.reaper import reap

from buildmax import diagnostics as kernel_diagnostics
from buildmax.clock import from_rfc3339

from .conftest import add_member

LEASE = 60


@pytest.fixture
def buildmax_settings(buildmax_settings):
    """The reaper's own loop stays out of the way: the tests call ``reap``."""
    return dataclasses.replace(
        buildmax_settings, plugins={"tasks": {"reap_interval_seconds": 3600}}
    )


async def gauges(app: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The tasks plugin's gauges now, by (name, labels)."""
    async with app.db.read() as conn:
        found = await app.hooks.gauges(conn)
    return {(g.name, g.labels): g.value for plugin, g in found if plugin == "tasks"}


async def attention(app: Any, space_pk: int | None = None) -> list[Any]:
    """Every plugin's attention items now (of one space, or of all)."""
    async with app.db.read() as conn:
        return await app.hooks.attention(conn, app.clock.now_ms(), space_pk)


def of_kind(items: list[Any], kind: str) -> list[Any]:
    return [item for item in items if item.kind == kind]


def counted(app: Any, name: str) -> float:
    """A counter's value in this process (0 before its first event)."""
    return app.metrics.registry.get_sample_value(f"{name}_total") or 0.0


def leases(found: dict) -> tuple[float, float]:
    """(active, lapsed) of ``buildmax_leases``."""
    return (
        found[("buildmax_leases", (("state", "active"),))],
        found[("buildmax_leases", (("state", "lapsed"),))],
    )


def ready(found: dict) -> dict[str, float]:
    """``buildmax_ready_tasks`` by space label."""
    return {
        labels[0][1]: value
        for (name, labels), value in found.items()
        if name == "buildmax_ready_tasks"
    }


async def test_a_lapsed_lease_is_counted_and_shown_to_members_until_the_reaper_recovers_it(
    app, work, clock
):
    task = await work.task("lapse me")
    claim = await work.claim(task["id"], lease_seconds=LEASE)
    attempt = claim["attempt"]
    assert leases(await gauges(app)) == (1, 0)
    assert of_kind(await attention(app), "lease.lapsed") == []

    clock.advance(seconds=LEASE + 1)
    assert leases(await gauges(app)) == (0, 1)
    [item] = of_kind(await attention(app), "lease.lapsed")
    assert item.target == ("attempt", attempt["id"])
    assert (item.space_pk, item.role) == (work.space.pk, "member")
    assert item.since == (await work.attempts_of(task["id"]))[0]["lease_expires_at"]
    assert attempt["id"] in item.summary and task["id"] in item.summary
    assert "lapse me" not in item.summary  # ids, never the task's text
    # Asked for one space, the items of another are left out.
    assert of_kind(await attention(app, work.space.pk), "lease.lapsed") == [item]
    assert of_kind(await attention(app, work.space.pk + 1000), "lease.lapsed") == []

    before = counted(app, "buildmax_leases_recovered")
    assert await reap(app) == 1
    assert counted(app, "buildmax_leases_recovered") == before + 1
    assert leases(await gauges(app)) == (0, 0)
    assert of_kind(await attention(app), "lease.lapsed") == []


async def test_a_claim_that_recovers_a_lapsed_attempt_counts_the_recovery_once(app, work, clock):
    task = await work.task("recover me")
    await work.claim(task["id"], lease_seconds=LEASE)
    clock.advance(seconds=LEASE + 1)
    before = counted(app, "buildmax_leases_recovered")
    again = await work.claim(task["id"], work.agent2)
    assert again["attempt"]["generation"] == 2
    assert counted(app, "buildmax_leases_recovered") == before + 1
    assert await reap(app) == 0
    assert counted(app, "buildmax_leases_recovered") == before + 1
    assert leases(await gauges(app)) == (1, 0)


async def test_claims_are_counted_once_each_and_a_refused_or_replayed_claim_adds_nothing(app, work):
    first, second = await work.task("one"), await work.task("two")
    before = counted(app, "buildmax_claims")
    await work.call(
        "POST", f"/tasks/{first['id']}/claim", work.agent, json={}, key="claim-1", expect=201
    )
    assert counted(app, "buildmax_claims") == before + 1
    # The same request again is answered from its receipt: no new claim.
    await work.call(
        "POST", f"/tasks/{first['id']}/claim", work.agent, json={}, key="claim-1", expect=201
    )
    # Another principal is refused: the task is held.
    await work.call("POST", f"/tasks/{first['id']}/claim", work.agent2, json={}, expect=409)
    assert counted(app, "buildmax_claims") == before + 1
    made = await work.call("POST", "/claims", work.agent2, json={}, expect=201)
    assert made["task"]["id"] == second["id"]
    assert counted(app, "buildmax_claims") == before + 2
    # Nothing left to claim: 200 and no claim.
    await work.call("POST", "/claims", work.agent2, json={}, expect=200)
    assert counted(app, "buildmax_claims") == before + 2


async def test_the_ready_gauge_counts_what_the_ready_route_lists(app, work):
    first = await work.task("first")
    held = await work.task("held")
    parked = await work.task("parked")
    await work.task("blocked", prerequisites=[first["id"]])  # open, not ready
    claimed = await work.task("claimed")
    await work.claim(claimed["id"])
    await work.call(
        "POST",
        "/holds",
        json={"scope": "task", "target": held["id"], "strength": "suspended", "reason": "wait"},
        expect=201,
    )
    await work.call(
        "POST",
        f"/tasks/{parked['id']}/decisions",
        json={"question": "ship it?", "options": ["yes", "no"]},
        expect=201,
    )
    listed = await work.ready_ids()
    assert listed == [first["id"]]
    assert ready(await gauges(app)) == {work.space.slug: 1, diagnostics.OTHER_SPACES: 0}

    # A hold on the whole space empties its queue, here and in the route.
    await work.call(
        "POST",
        "/holds",
        json={"scope": "space", "target": None, "strength": "suspended", "reason": "freeze"},
        expect=201,
    )
    assert await work.ready_ids() == []
    assert ready(await gauges(app)) == {diagnostics.OTHER_SPACES: 0}


async def test_the_ready_gauge_names_the_deepest_queues_and_sums_the_rest(
    app, work, make_space, monkeypatch
):
    """The bound is :data:`MAX_SPACES` (50); two here, so four spaces show it."""
    monkeypatch.setattr(kernel_diagnostics, "MAX_SPACES", 2)
    queues = [(work, 3)]
    for depth in (1, 2, 4):
        space = await make_space(work.owner)
        await add_member(app, space, work.agent, "member")
        other = dataclasses.replace(work, space=space)
        await other.call("POST", "/projects", json={"name": "main"}, expect=201)
        queues.append((other, depth))
    for where, depth in queues:
        for n in range(depth):
            await where.task(f"task {n}")
    deepest = sorted(queues, key=lambda queue: -queue[1])
    assert ready(await gauges(app)) == {
        deepest[0][0].space.slug: 4,
        deepest[1][0].space.slug: 3,
        diagnostics.OTHER_SPACES: 2 + 1,
    }


async def test_pending_decisions_are_counted_and_shown_to_members_oldest_first(
    app, work, clock, monkeypatch
):
    task = await work.task("ask about me")
    asked = []
    for question, answerer in (("first?", "human"), ("second?", "member"), ("third?", "human")):
        asked.append(
            await work.call(
                "POST",
                f"/tasks/{task['id']}/decisions",
                json={"question": question, "options": ["yes"], "answerable_by": answerer},
                expect=201,
            )
        )
        clock.advance(seconds=1)
    expiring = await work.call(
        "POST",
        f"/tasks/{task['id']}/decisions",
        json={"question": "soon?", "options": ["yes"], "expires_in_seconds": 5},
        expect=201,
    )
    assert (await gauges(app))[("buildmax_decisions_pending", ())] == 4
    clock.advance(seconds=10)  # the last one expired: nobody can answer it any more
    assert (await gauges(app))[("buildmax_decisions_pending", ())] == 3

    items = of_kind(await attention(app), "decision.pending")
    assert [i.target for i in items] == [("decision", d["id"]) for d in asked]
    assert [i.since for i in items] == [d_created(d) for d in asked]
    assert {(i.role, i.space_pk) for i in items} == {("member", work.space.pk)}
    assert "a human member" in items[0].summary and "from a member" in items[1].summary
    assert all("?" not in i.summary for i in items)  # never the question
    assert expiring["id"] not in {i.target[1] for i in items}

    monkeypatch.setattr(diagnostics, "MAX_ITEMS", 2)
    bounded = of_kind(await attention(app), "decision.pending")
    assert [i.target for i in bounded] == [("decision", d["id"]) for d in asked[:2]]

    await work.call(
        "POST", f"/decisions/{asked[0]['id']}/answer", json={"answer": "yes"}, expect=200
    )
    assert (await gauges(app))[("buildmax_decisions_pending", ())] == 2
    left = of_kind(await attention(app), "decision.pending")
    assert asked[0]["id"] not in {i.target[1] for i in left}


def d_created(decision: dict[str, Any]) -> int:
    """A decision's ``created_at`` in epoch milliseconds."""
    return from_rfc3339(decision["created_at"])


async def test_a_viewer_sees_neither_kind_and_a_member_sees_both(app, work, clock):
    task = await work.task("watched")
    await work.claim(task["id"], lease_seconds=LEASE)
    other = await work.task("asked")
    await work.call(
        "POST",
        f"/tasks/{other['id']}/decisions",
        json={"question": "go?", "options": ["go"]},
        expect=201,
    )
    clock.advance(seconds=LEASE + 1)
    kinds = {"lease.lapsed", "decision.pending"}
    seen = await work.call("GET", "/attention", work.agent2, expect=200)
    assert kinds <= {item["kind"] for item in seen["items"]}
    hidden = await work.call("GET", "/attention", work.viewer, expect=200)
    assert kinds.isdisjoint({item["kind"] for item in hidden["items"]})
