"""J06: dependencies. A chain becomes ready one link at a time; edges that
would close a cycle, self edges and edges to another space are refused and
change nothing; a duplicate edge is a no-op; the cycle check walks a
5,000-task chain inside the write transaction."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_hookspecs import hookimpl
from buildmax_tasks.tables import dependencies, projects, task_revisions, tasks

from buildmax.app import create_app
from buildmax.ids import new_id


class Rendezvous:
    """Holds each hand-in inside its transaction (bounded) until another
    arrives, so two concurrent completions overlap before either commits."""

    def __init__(self) -> None:
        self.barrier: asyncio.Barrier | None = None

    @hookimpl
    async def buildmax_attempt_submitted(self, tx: Any, task: Any, attempt: Any, submission: Any):
        if self.barrier is not None:
            with contextlib.suppress(TimeoutError, asyncio.BrokenBarrierError):
                await asyncio.wait_for(self.barrier.wait(), 0.5)
        return None


@pytest.fixture
def rendezvous() -> Rendezvous:
    return Rendezvous()


@pytest.fixture
async def app(buildmax_settings, clock, rendezvous):
    application = create_app(
        buildmax_settings,
        clock=clock,
        extra_plugins=[("graphtest", rendezvous)],
        auto_migrate=True,
    )
    async with application.test_app():
        yield application


async def hand_in(work: Any, claim: dict[str, Any]) -> Any:
    attempt = claim["attempt"]
    return await work.call(
        "POST",
        f"/attempts/{attempt['id']}/submit",
        claim["token"],
        json={"generation": attempt["generation"], "summary": "done"},
        expect=201,
    )


async def states(work: Any, *ids: str) -> list[str]:
    found = {r["public_id"]: r["state"] for r in await work.rows(tasks, tasks.c.public_id.in_(ids))}
    return [found[i] for i in ids]


async def edges(work: Any) -> set[tuple[int, int]]:
    return {(r["task_id"], r["prerequisite_id"]) for r in await work.rows(dependencies)}


async def test_a_chain_becomes_ready_one_link_at_a_time(work, audit_log):
    """C depends on B depends on A: only A is ready; each completion readies
    the next link, in the transaction that completes it."""
    a = await work.task("A")
    b = await work.task("B", prerequisites=[a["id"]])
    c = await work.task("C", prerequisites=[b["id"]])
    assert (a["state"], b["state"], c["state"]) == ("ready", "open", "open")
    assert await work.ready_ids() == [a["id"]]
    created = {e.target_id: e.details["prerequisites"] for e in audit_log.of("task.created")}
    assert created == {a["id"]: [], b["id"]: [a["id"]], c["id"]: [b["id"]]}
    links = await work.call("GET", f"/tasks/{b['id']}/dependencies", work.viewer, expect=200)
    assert [p["id"] for p in links["prerequisites"]] == [a["id"]]
    assert [d["id"] for d in links["dependents"]] == [c["id"]]

    # An open task is not claimable.
    refused = await work.call(
        "POST", f"/tasks/{b['id']}/claim", json={}, expect=409, problem="task-not-claimable"
    )
    assert refused["state"] == "open"

    await hand_in(work, await work.claim(a["id"]))
    assert await states(work, a["id"], b["id"], c["id"]) == ["done", "ready", "open"]
    assert await work.ready_ids() == [b["id"]]

    await hand_in(work, await work.claim(b["id"], work.agent2))
    assert await states(work, a["id"], b["id"], c["id"]) == ["done", "done", "ready"]
    assert await work.ready_ids() == [c["id"]]

    last = await work.claim(c["id"])
    assert last["attempt"]["generation"] == 1
    await hand_in(work, last)
    assert await states(work, a["id"], b["id"], c["id"]) == ["done", "done", "done"]
    assert [e.target_id for e in audit_log.of("task.done")] == [a["id"], b["id"], c["id"]]
    # Forbidden: nothing was ever claimed before it was ready.
    assert [e.target_id for e in audit_log.of("task.claimed")] == [a["id"], b["id"], c["id"]]


async def test_cycles_self_edges_and_other_spaces_are_refused_and_duplicates_are_no_ops(
    work, make_principal, make_space, audit_log
):
    """Closing A -> C on C -> B -> A is 409 dependency-cycle, as is A -> A; a
    prerequisite of another space is refused; adding an existing edge changes
    nothing. The graph, the task states and the audit trail stay as they were."""
    a = await work.task("A")
    b = await work.task("B", prerequisites=[a["id"]])
    c = await work.task("C", prerequisites=[b["id"]])
    before = await edges(work)
    assert len(before) == 2
    audited_before = len(audit_log.events)

    cycle = await work.call(
        "POST",
        f"/tasks/{a['id']}/dependencies",
        json={"prerequisite": c["id"]},
        expect=409,
        problem="dependency-cycle",
    )
    assert (cycle["task_id"], cycle["prerequisite_id"]) == (a["id"], c["id"])
    selfish = await work.call(
        "POST",
        f"/tasks/{a['id']}/dependencies",
        json={"prerequisite": a["id"]},
        expect=409,
        problem="dependency-cycle",
    )
    assert selfish["prerequisite_id"] == a["id"]

    again = await work.call(
        "POST", f"/tasks/{b['id']}/dependencies", json={"prerequisite": a["id"]}, expect=200
    )
    assert [p["id"] for p in again["prerequisites"]] == [a["id"]]

    stranger = await make_principal("human")
    elsewhere = await make_space(stranger)
    await work.call(
        "POST", f"/v1/spaces/{elsewhere.id}/projects", stranger, json={"name": "x"}, expect=201
    )
    foreign = await work.call(
        "POST",
        f"/v1/spaces/{elsewhere.id}/tasks",
        stranger,
        json={"project": "x", "title": "theirs"},
        expect=201,
    )
    audited_before += 2
    crossing = await work.call(
        "POST",
        f"/tasks/{c['id']}/dependencies",
        json={"prerequisite": foreign["id"]},
        expect=422,
        problem="validation-error",
    )
    assert "prerequisite" in crossing["errors"]
    created_across = await work.call(
        "POST",
        "/tasks",
        json={"project": "main", "title": "D", "prerequisites": [foreign["id"]]},
        expect=422,
        problem="validation-error",
    )
    assert "prerequisites" in created_across["errors"]

    assert await edges(work) == before
    assert await states(work, a["id"], b["id"], c["id"]) == ["ready", "open", "open"]
    assert len(await work.rows(tasks, tasks.c.space_id == work.space.pk)) == 3
    assert audit_log.events[audited_before:] == []
    # The refused prerequisite of the other space is untouched.
    (theirs,) = await work.rows(tasks, tasks.c.public_id == foreign["id"])
    assert theirs["state"] == "ready" and theirs["updated_at"] == theirs["created_at"]


async def test_the_cycle_check_on_a_5000_task_chain(work, audit_log):
    """The chain t1 -> t0, t2 -> t1, ... t4999 -> t4998 is written with bulk
    SQL; closing it (t0 -> t4999) is refused after a walk of the whole
    chain. The time is printed, not asserted."""
    size = 5000
    now = work.app.clock.now_ms()
    public_ids = [new_id("ta") for _ in range(size)]
    async with work.app.db.write() as tx:
        project_pk = await tx.fetch_val(
            sa.select(projects.c.id).where(
                projects.c.space_id == work.space.pk, projects.c.name == "main"
            )
        )
        for start in range(0, size, 1000):
            await tx.execute(
                tasks.insert().values(
                    [
                        {
                            "public_id": public_ids[i],
                            "space_id": work.space.pk,
                            "project_id": project_pk,
                            "kind": "code",
                            "title": f"link {i}",
                            "state": "ready" if i == 0 else "open",
                            "ready_at": now,
                            "created_at": now,
                            "updated_at": now,
                        }
                        for i in range(start, min(start + 1000, size))
                    ]
                )
            )
        rows = await tx.fetch_all(
            sa.select(tasks.c.id, tasks.c.public_id).where(tasks.c.space_id == work.space.pk)
        )
        pk = {r["public_id"]: r["id"] for r in rows}
        chain = [pk[p] for p in public_ids]
        for start in range(0, size, 2000):
            await tx.execute(
                task_revisions.insert().values(
                    [
                        {
                            "task_id": chain[i],
                            "number": 1,
                            "title": f"link {i}",
                            "body": "",
                            "criteria": "",
                            "created_at": now,
                        }
                        for i in range(start, min(start + 2000, size))
                    ]
                )
            )
        for start in range(1, size, 5000):
            await tx.execute(
                dependencies.insert().values(
                    [
                        {"task_id": chain[i], "prerequisite_id": chain[i - 1], "created_at": now}
                        for i in range(start, min(start + 5000, size))
                    ]
                )
            )
    assert len(await edges(work)) == size - 1

    started = time.perf_counter()
    refused = await work.call(
        "POST",
        f"/tasks/{public_ids[0]}/dependencies",
        json={"prerequisite": public_ids[-1]},
        expect=409,
        problem="dependency-cycle",
    )
    elapsed = time.perf_counter() - started
    print(
        f"\ncycle check over a {size}-task chain ({work.app.db.dialect}): "
        f"{elapsed * 1000:.1f} ms for the whole refused request"
    )
    assert refused["prerequisite_id"] == public_ids[-1]
    assert len(await edges(work)) == size - 1
    (first,) = await work.rows(tasks, tasks.c.public_id == public_ids[0])
    assert first["state"] == "ready"
    assert audit_log.of("task.dependency.added") == []

    # An edge that closes no cycle is still accepted on the big graph.
    extra = await work.task("outside the chain")
    added = await work.call(
        "POST",
        f"/tasks/{extra['id']}/dependencies",
        json={"prerequisite": public_ids[-1]},
        expect=201,
    )
    assert [p["id"] for p in added["prerequisites"]] == [public_ids[-1]]
    assert len(await edges(work)) == size
    (event,) = audit_log.of("task.dependency.added")
    assert (event.target_id, event.details) == (extra["id"], {"prerequisite_id": public_ids[-1]})


async def test_two_prerequisites_completing_together_ready_their_dependent(
    work, rendezvous, audit_log
):
    """D depends on P1 and P2, handed in at the same moment by two agents:
    whichever commits second sees the other done, so D becomes ready.

    Mutation caught (PostgreSQL): without the lock ``release_dependents``
    takes on the open dependents (``.with_for_update()``), each transaction
    sees the other prerequisite still undone and D stays open for good. The
    kernel's event publication also serialises one space's writes (it
    updates the space row first), so the mutation goes red only with that
    serialisation taken out as well."""
    p1 = await work.task("P1")
    p2 = await work.task("P2")
    d = await work.task("D", prerequisites=[p1["id"], p2["id"]])
    assert d["state"] == "open"
    first = await work.claim(p1["id"], work.agent)
    second = await work.claim(p2["id"], work.agent2)
    barrier = asyncio.Barrier(2)
    rendezvous.barrier = asyncio.Barrier(2)

    async def finish(claim: dict[str, Any]) -> Any:
        await barrier.wait()
        return await hand_in(work, claim)

    done = await asyncio.gather(finish(first), finish(second))
    assert [r["task"]["state"] for r in done] == ["done", "done"]
    assert await states(work, p1["id"], p2["id"], d["id"]) == ["done", "done", "ready"]
    assert await work.ready_ids() == [d["id"]]
    assert sorted(e.target_id for e in audit_log.of("task.done")) == sorted([p1["id"], p2["id"]])
    claimed = await work.claim(d["id"])
    assert claimed["attempt"]["generation"] == 1


async def test_two_edges_racing_to_close_a_cycle_never_both_land(work):
    """A -> B and B -> A added at the same moment, twelve times over: each
    pair leaves exactly one edge, the other request is 409 dependency-cycle.
    Catches: the space's graph lock (``lock_graph``) dropped from the add
    route: on PostgreSQL both cycle checks then run before either edge
    commits, and both edges land."""
    pairs = [(await work.task(f"a{i}"), await work.task(f"b{i}")) for i in range(12)]

    async def add(task: dict[str, Any], prerequisite: dict[str, Any]) -> int:
        response = await work.client.post(
            f"{work.base}/tasks/{task['id']}/dependencies",
            headers=work.agent.headers,
            json={"prerequisite": prerequisite["id"]},
        )
        return response.status_code

    statuses = await asyncio.gather(*(add(x, y) for a, b in pairs for x, y in ((a, b), (b, a))))
    assert sorted(statuses) == [201] * 12 + [409] * 12, statuses
    edges = {frozenset((r["task_id"], r["prerequisite_id"])) for r in await work.rows(dependencies)}
    for a, b in pairs:
        pair = frozenset(
            [(await work.task_row(a["id"]))["id"], (await work.task_row(b["id"]))["id"]]
        )
        assert pair in edges
    assert len(await work.rows(dependencies)) == 12
