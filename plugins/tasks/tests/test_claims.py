"""J03: many claimers, one owner. Claim-next under concurrency.

Every race here is real: barrier-synchronised requests through the app
against a real SQLite file or PostgreSQL database, and on PostgreSQL also
OS processes against two ``buildmax serve`` processes on one database.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import textwrap
from collections import Counter

import pytest
import sqlalchemy as sa
from buildmax_tasks.tables import attempts, reservations, tasks

from buildmax.config import Config
from buildmax.spaces import put_member
from buildmax.tables import events, tokens
from buildmax.testing import start_server

PROBLEM = "urn:buildmax:problem:"
CLAIMERS = 100
REFUSED_CLAIM = {PROBLEM + "task-claimed", PROBLEM + "task-not-claimable"}


@pytest.fixture
def buildmax_settings(buildmax_settings):
    """The reaper stays out of the way: only the tests expire leases."""
    return dataclasses.replace(
        buildmax_settings, plugins={"tasks": {"reap_interval_seconds": 3600}}
    )


async def agent_members(app, work, make_principal, count):
    """``count`` agent principals who are members of the work space."""
    made = [work.agent, work.agent2]
    while len(made) < count:
        who = await make_principal("agent")
        async with app.db.write() as tx:
            await put_member(tx, work.space.pk, who.pk, "member", app.clock.now_ms())
        made.append(who)
    return made


async def event_types(app, space_pk):
    async with app.db.read() as conn:
        rows = await conn.fetch_all(
            sa.select(events.c.type, events.c.data)
            .where(events.c.space_id == space_pk)
            .order_by(events.c.seq)
        )
    return [(r["type"], json.loads(r["data"])) for r in rows]


async def test_j03_one_hundred_racing_claimers_make_exactly_one_owner(
    app, work, make_principal, audit_log
):
    """100 claimers from 10 member agents, released at once by a barrier,
    race for one ready task: one 201, 99 refusals with 409, one attempt row.

    Mutation checks (each run by hand, seen red, then restored):

    - ``_claim``'s conditional update without ``state = 'ready'`` *and*
      ``claim_named`` reading the task without ``FOR UPDATE``
      (read-then-write): red on PostgreSQL, 4 to 6 losers get a 500 from
      ``task_attempts_one_active`` instead of a 409; with that index gone
      too, 8 claimers own the task.
    - The state checks before the update removed (a live attempt no longer
      refused as ``task-claimed``) *and* the ``state = 'ready'`` condition
      removed: red on both engines (99 500s on SQLite). With the condition
      kept, green: the conditional update alone refuses every loser.
    - One of the condition or the row lock removed alone: green, the other
      holds (on SQLite the single writer serialises claims anyway).
    """
    claimers = await agent_members(app, work, make_principal, 10)
    task = await work.task("contested")
    before_tokens = {t["id"] for t in await work.rows(tokens)}
    barrier = asyncio.Barrier(CLAIMERS)
    url = f"{work.base}/tasks/{task['id']}/claim"

    async def claim(i: int):
        who = claimers[i % len(claimers)]
        await barrier.wait()
        response = await work.client.post(url, headers=who.headers, json={})
        return who, response.status_code, await response.get_json()

    results = await asyncio.gather(*(claim(i) for i in range(CLAIMERS)))

    statuses = Counter(status for _, status, _ in results)
    assert statuses == {201: 1, 409: CLAIMERS - 1}, statuses
    winner, _, won = next(r for r in results if r[1] == 201)
    refusals = [body for _, status, body in results if status == 409]
    assert {body["type"] for body in refusals} <= REFUSED_CLAIM
    assert won["attempt"]["generation"] == 1
    assert won["attempt"]["claimant_id"] == winner.id
    assert won["task"]["state"] == "claimed"
    assert won["task"]["current_attempt_id"] == won["attempt"]["id"]

    # Durable: one attempt, one owner, generation 1; the task points at it.
    rows = await work.rows(attempts)
    assert len(rows) == 1
    assert (rows[0]["claimant_id"], rows[0]["generation"], rows[0]["state"]) == (
        winner.pk,
        1,
        "active",
    )
    [row] = await work.rows(tasks, tasks.c.public_id == task["id"])
    assert (row["state"], row["generation"], row["current_attempt_id"]) == (
        "claimed",
        1,
        rows[0]["id"],
    )
    # Forbidden side effects: one scoped token issued (not 100), one event.
    issued = [t for t in await work.rows(tokens) if t["id"] not in before_tokens]
    assert [(t["scope_type"], t["scope_id"]) for t in issued] == [("attempt", won["attempt"]["id"])]
    claimed_events = [d for t, d in await event_types(app, work.space.pk) if t == "task.claimed"]
    assert claimed_events == [
        {
            "task_id": task["id"],
            "attempt_id": won["attempt"]["id"],
            "generation": 1,
            "claimant_id": winner.id,
        }
    ]
    # Audit: exactly one task.claimed, by the winner.
    claimed = [e for e in audit_log.events if e.action == "task.claimed"]
    assert [(e.actor_id, e.target_id, e.details["attempt_id"]) for e in claimed] == [
        (winner.id, task["id"], won["attempt"]["id"])
    ]


async def test_the_database_refuses_a_second_active_attempt_for_a_task(app, work):
    """The partial unique index ``task_attempts_one_active`` holds whatever
    the code above it does: a second active attempt row is refused by the
    database, an ended one beside an active one is accepted.

    Mutation check: the index removed from ``tables.py``: red (the second
    active row is stored)."""
    task = await work.task("guarded")
    claim = await work.claim(task["id"])
    [first] = await work.rows(attempts)
    second = {
        k: v for k, v in first.items() if k not in ("id", "public_id", "generation", "token_id")
    }
    with pytest.raises(Exception) as refused:
        async with app.db.write() as tx:
            await tx.execute(
                attempts.insert().values(**second, public_id="at_intruder", generation=2)
            )
    assert "unique" in str(refused.value).lower()
    assert [r["public_id"] for r in await work.rows(attempts)] == [claim["attempt"]["id"]]
    # An ended attempt of the same task is no conflict.
    async with app.db.write() as tx:
        await tx.execute(
            attempts.insert().values(
                **{**second, "state": "released"}, public_id="at_history", generation=2
            )
        )
    states = sorted((r["public_id"], r["state"]) for r in await work.rows(attempts))
    assert states == sorted([(claim["attempt"]["id"], "active"), ("at_history", "released")])


async def test_concurrent_claim_next_claims_every_task_exactly_once(
    app, work, make_principal, audit_log
):
    """N agents each ask for the next task at the same moment, against N
    ready tasks: every agent gets a different task, every task is claimed
    exactly once, nobody sees a 5xx, and nobody is told nothing is ready.

    Mutation checks (PostgreSQL; SQLite's single writer serialises claims,
    so this test cannot go red there):

    - ``claim_next``'s candidate query without ``FOR UPDATE SKIP LOCKED``:
      red (claimers pick the same candidate; the losers count it as
      ``skipped``).
    - candidates locked 20 at a time (the code this test was written
      against): red, 27 of 30 claimers were told nothing was ready.
    - ``skip_locked=False`` (plain ``FOR UPDATE``): green but 6x slower,
      claimers queue on the first candidate; timing is a benchmark's job.
    """
    count = 30
    agents = await agent_members(app, work, make_principal, count)
    made = [
        await work.task(f"job {i}", priority=i % 3, resources=[f"path:repo/job{i}/"])
        for i in range(count)
    ]
    barrier = asyncio.Barrier(count)

    async def claim_next(who):
        await barrier.wait()
        response = await work.client.post(f"{work.base}/claims", headers=who.headers, json={})
        return who, response.status_code, await response.get_json()

    results = await asyncio.gather(*(claim_next(who) for who in agents))

    assert Counter(status for _, status, _ in results) == {201: count}, [
        (status, body) for _, status, body in results if status != 201
    ]
    assert [body["skipped"] for _, _, body in results] == [0] * count
    claimed = Counter(body["task"]["id"] for _, _, body in results)
    assert set(claimed) == {t["id"] for t in made}
    assert set(claimed.values()) == {1}
    for who, _, body in results:
        assert body["attempt"]["claimant_id"] == who.id
        assert body["attempt"]["generation"] == 1

    # Durable: one active attempt per task, each by the agent that was told so.
    rows = await work.rows(attempts)
    assert len(rows) == count
    assert Counter(r["task_id"] for r in rows) == Counter({r["task_id"]: 1 for r in rows}), (
        "a task has two attempts"
    )
    by_id = {r["public_id"]: r for r in rows}
    for who, _, body in results:
        assert by_id[body["attempt"]["id"]]["claimant_id"] == who.pk
    task_rows = await work.rows(tasks)
    assert {(r["state"], r["generation"]) for r in task_rows} == {("claimed", 1)}
    # Each task's resource is reserved once, by the attempt that holds the task.
    held = {(r["resource"], r["attempt_public_id"]) for r in await work.rows(reservations)}
    assert held == {(body["task"]["resources"][0], body["attempt"]["id"]) for _, _, body in results}
    # Audit: one task.claimed per task.
    audited = Counter(e.target_id for e in audit_log.events if e.action == "task.claimed")
    assert audited == Counter({t["id"]: 1 for t in made})


async def test_claim_next_with_nothing_ready_answers_200_and_changes_nothing(work, audit_log):
    task = await work.task("taken")
    await work.claim(task["id"])
    before = (await work.rows(tasks), await work.rows(attempts))
    body = await work.call("POST", "/claims", work.agent2, json={}, expect=200)
    assert body == {"task": None, "attempt": None, "token": None, "token_id": None, "skipped": 0}
    assert (await work.rows(tasks), await work.rows(attempts)) == before
    assert [e.action for e in audit_log.events].count("task.claimed") == 1


async def test_a_viewer_cannot_claim_and_nothing_changes(work, audit_log):
    task = await work.task("not for viewers")
    before = await work.rows(tasks)
    await work.call("POST", f"/tasks/{task['id']}/claim", work.viewer, json={}, expect=403)
    await work.call("POST", "/claims", work.viewer, json={}, expect=403)
    assert await work.rows(attempts) == []
    assert await work.rows(tasks) == before
    assert "task.claimed" not in audit_log.actions()


# -- PostgreSQL: OS processes against two server processes -------------------------------

CLAIMER_SCRIPT = textwrap.dedent(
    """
    import asyncio, json, sys
    import httpx

    async def main():
        job = json.loads(sys.argv[1])
        headers = {"Authorization": "Bearer " + job["token"]}
        n = len(job["paths"])
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=n)) as c:
            # Warm connections to both servers before the barrier.
            await asyncio.gather(*(c.get(url + "/readyz") for url in job["urls"] * n))
            print("ready", flush=True)
            if sys.stdin.readline().strip() != "go":
                return
            async def one(i):
                url = job["urls"][i % len(job["urls"])] + job["paths"][i]
                r = await c.post(url, headers=headers, json={})
                return {"status": r.status_code, "body": r.json(), "server": i % len(job["urls"])}
            results = await asyncio.gather(*(one(i) for i in range(n)))
        print(json.dumps(results), flush=True)

    asyncio.run(main())
    """
)


@pytest.fixture
def two_servers(app, buildmax_database_url, tmp_path):
    """Two ``buildmax serve`` processes on the test's PostgreSQL database
    (the one the ``app`` fixture migrated and the tests arrange data in)."""
    settings = Config(data_dir=str(tmp_path / "srv"), database_url=buildmax_database_url)
    # Small pools: the PostgreSQL server is shared with the rest of the run.
    pool = {"BUILDMAX_PG_POOL_MAX": "5"}
    first = start_server(settings, tmp_path / "a.log", extra_env=pool)
    second = None
    try:
        second = start_server(settings, tmp_path / "b.log", extra_env=pool)
        yield first, second
    finally:
        first.stop()
        if second is not None:
            second.stop()


def race_from_processes(jobs: list[dict]) -> list[list[dict]]:
    """Start one OS process per job, wait until each is connected, release
    them together (the barrier), and collect what each saw."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLAIMER_SCRIPT, json.dumps(job)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for job in jobs
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = []
        for proc in procs:
            out, _ = proc.communicate(timeout=90)
            assert proc.returncode == 0, out
            outputs.append(json.loads(out.strip().splitlines()[-1]))
        return outputs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.postgres_only
async def test_j03_four_processes_against_two_servers_make_exactly_one_owner(
    app, work, make_principal, two_servers, audit_log
):
    """4 OS processes, each with its own agent's token and 10 concurrent
    claims spread over two server processes on one PostgreSQL database, are
    released together: one attempt, one owner, generation 1, 39 refusals.

    Mutation checks: the conditional update without ``state = 'ready'`` and
    ``claim_named`` without the row lock: red (8 to 14 of 40 get a 500 from the
    unique index instead of a 409); with ``task_attempts_one_active`` gone
    too: red, 6 owners."""
    a, b = two_servers
    claimers = (await agent_members(app, work, make_principal, 4))[:4]
    task = await work.task("contested across processes")
    path = f"{work.base}/tasks/{task['id']}/claim"
    jobs = [{"urls": [a.url, b.url], "token": who.token, "paths": [path] * 10} for who in claimers]
    outputs = await asyncio.to_thread(race_from_processes, jobs)

    flat = [(claimers[p], r) for p, results in enumerate(outputs) for r in results]
    statuses = Counter(r["status"] for _, r in flat)
    assert statuses == {201: 1, 409: 39}, (statuses, a.log()[-2000:], b.log()[-2000:])
    assert {r["server"] for _, r in flat} == {0, 1}
    assert {r["body"]["type"] for _, r in flat if r["status"] == 409} <= REFUSED_CLAIM
    winner, won = next((who, r["body"]) for who, r in flat if r["status"] == 201)
    assert won["attempt"]["generation"] == 1
    assert won["attempt"]["claimant_id"] == winner.id

    rows = await work.rows(attempts)
    assert [(r["public_id"], r["claimant_id"], r["generation"], r["state"]) for r in rows] == [
        (won["attempt"]["id"], winner.pk, 1, "active")
    ]
    [row] = await work.rows(tasks, tasks.c.public_id == task["id"])
    assert (row["state"], row["generation"]) == ("claimed", 1)
    scoped = await work.rows(tokens, tokens.c.scope_type == "attempt")
    assert [t["scope_id"] for t in scoped] == [won["attempt"]["id"]]
    claimed_events = [d for t, d in await event_types(app, work.space.pk) if t == "task.claimed"]
    assert [d["attempt_id"] for d in claimed_events] == [won["attempt"]["id"]]
    # The servers audited in their own processes; this process saw no claim.
    assert "task.claimed" not in audit_log.actions()
