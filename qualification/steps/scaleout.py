"""Steps for J18: two server processes on one PostgreSQL database.

``create_tasks`` makes a batch of tasks as the admin. ``race_per_task``
races every agent for each task in turn, half of them through server 0
and half through server 1, released together by one barrier once every
connection is open. ``claim_next_until_empty`` lets every agent pull from
one queue through both processes at once until nothing is left. ``owners``
compares the winners the clients heard with the attempt rows.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

import httpx
import sqlalchemy as sa
from buildmax_graders.run import JourneyRun, StepFailed

#: ``type`` of a problem answer is this prefix and the slug.
PROBLEM = "urn:buildmax:problem:"

#: claim-next answers an agent may ask for before the queue must be empty.
MAX_PULLS = 200


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}", "Idempotency-Key": str(uuid.uuid4())}


def _slug(answer: httpx.Response) -> str | None:
    try:
        body = answer.json()
    except ValueError:
        return None
    kind = body.get("type") if isinstance(body, dict) else None
    return kind[len(PROBLEM) :] if isinstance(kind, str) and kind.startswith(PROBLEM) else kind


def _client(run: JourneyRun, agents: int) -> httpx.AsyncClient:
    servers = len(run.deployment.servers)
    limits = httpx.Limits(
        max_connections=agents * servers, max_keepalive_connections=agents * servers
    )
    return httpx.AsyncClient(timeout=60.0, limits=limits)


async def create_tasks(
    run: JourneyRun, space: str, project: str, count: int, title: str = "task"
) -> list[str]:
    """``count`` tasks in ``project``, created as the admin through server
    0; their public ids, in order."""
    made = []
    for index in range(count):
        answer = await run.http.post(
            run.url(0) + f"/v1/spaces/{space}/tasks",
            json={"project": project, "title": f"{title} {index}"},
            headers=_headers(run.token("admin")),
        )
        if answer.status_code != 201:
            raise StepFailed(
                f"create task {index}: status {answer.status_code}: {answer.text[:200]}"
            )
        made.append(answer.json()["id"])
    return made


async def race_per_task(
    run: JourneyRun, space: str, tasks: Sequence[str], agents: int = 20, agent_prefix: str = "agent"
) -> dict[str, Any]:
    """For each task in turn, every agent (``<agent_prefix><i>``) claims it
    at once: agent ``i`` through server ``i % 2``. Saves the count of each
    status, overall and per server; how many answers each server gave; how
    many tasks had exactly one 201; every winner (task, attempt, agent,
    server); and the losers whose 409 does not say ``task-claimed``."""
    names = [f"{agent_prefix}{i}" for i in range(agents)]
    tokens = {name: run.token(name) for name in names}
    statuses: Counter[str] = Counter()
    by_server: dict[str, Counter[str]] = {"0": Counter(), "1": Counter()}
    winners: list[dict[str, Any]] = []
    one_winner = 0
    odd_losers: list[dict[str, Any]] = []
    async with _client(run, agents) as http:
        # Open every connection first, so the race is between requests, not handshakes.
        await asyncio.gather(*(http.get(run.url(i % 2) + "/livez") for i in range(agents)))
        for task in tasks:
            go = asyncio.Event()

            async def one(
                i: int, task: str = task, go: asyncio.Event = go
            ) -> tuple[int, httpx.Response]:
                server = i % 2
                await go.wait()
                answer = await http.post(
                    run.url(server) + f"/v1/spaces/{space}/tasks/{task}/claim",
                    json={},
                    headers=_headers(tokens[names[i]]),
                )
                return server, answer

            racers = [asyncio.create_task(one(i)) for i in range(agents)]
            await asyncio.sleep(0)
            go.set()
            answers = await asyncio.gather(*racers)
            wins = 0
            for i, (server, answer) in enumerate(answers):
                code = str(answer.status_code)
                statuses[code] += 1
                by_server[str(server)][code] += 1
                if answer.status_code == 201:
                    wins += 1
                    body = answer.json()
                    run.secret(body["token"])  # the attempt's token: looked for in the logs
                    winners.append(
                        {
                            "task": task,
                            "attempt": body["attempt"]["id"],
                            "generation": body["attempt"]["generation"],
                            "agent": names[i],
                            "server": server,
                        }
                    )
                elif answer.status_code != 409 or _slug(answer) != "task-claimed":
                    odd_losers.append(
                        {
                            "task": task,
                            "agent": names[i],
                            "status": answer.status_code,
                            "problem": _slug(answer),
                        }
                    )
            one_winner += wins == 1
    return {
        "tasks": len(tasks),
        "tasks_with_one_winner": one_winner,
        "statuses": dict(statuses),
        "by_server": {server: dict(counts) for server, counts in by_server.items()},
        "answers_by_server": {server: sum(counts.values()) for server, counts in by_server.items()},
        "wins_by_server": dict(Counter(str(w["server"]) for w in winners)),
        "winners": winners,
        "odd_losers": odd_losers,
    }


async def claim_next_until_empty(
    run: JourneyRun, space: str, project: str, agents: int = 20, agent_prefix: str = "agent"
) -> dict[str, Any]:
    """Every agent pulls from ``project``'s queue with claim-next, agent
    ``i`` through server ``i % 2``, all at once, until its answer says
    nothing is claimable. Saves every claim won (task, attempt, agent,
    server), the count of each status, and the tasks claimed twice."""
    names = [f"{agent_prefix}{i}" for i in range(agents)]
    claims: list[dict[str, Any]] = []
    statuses: Counter[str] = Counter()
    others: list[dict[str, Any]] = []
    async with _client(run, agents) as http:
        await asyncio.gather(*(http.get(run.url(i % 2) + "/livez") for i in range(agents)))
        go = asyncio.Event()

        async def pull(i: int) -> None:
            server = i % 2
            token = run.token(names[i])
            await go.wait()
            for _ in range(MAX_PULLS):
                answer = await http.post(
                    run.url(server) + f"/v1/spaces/{space}/claims",
                    json={"project": project},
                    headers=_headers(token),
                )
                statuses[str(answer.status_code)] += 1
                if answer.status_code == 201:
                    body = answer.json()
                    run.secret(body["token"])
                    claims.append(
                        {
                            "task": body["task"]["id"],
                            "attempt": body["attempt"]["id"],
                            "generation": body["attempt"]["generation"],
                            "agent": names[i],
                            "server": server,
                        }
                    )
                elif answer.status_code == 200 and answer.json().get("task") is None:
                    return
                else:
                    others.append(
                        {"agent": names[i], "status": answer.status_code, "problem": _slug(answer)}
                    )
            raise StepFailed(
                f"{names[i]}: the queue was not empty after {MAX_PULLS} claim-next calls"
            )

        pullers = [asyncio.create_task(pull(i)) for i in range(agents)]
        await asyncio.sleep(0)
        go.set()
        await asyncio.gather(*pullers)
    per_task = Counter(c["task"] for c in claims)
    return {
        "claims": len(claims),
        "distinct_tasks": len(per_task),
        "claimed_twice": sorted(task for task, n in per_task.items() if n > 1),
        "statuses": dict(statuses),
        "claims_by_server": dict(Counter(str(c["server"]) for c in claims)),
        "claimed": claims,
        "other_answers": others,
    }


async def owners(
    run: JourneyRun, claims: Sequence[dict[str, Any]], more: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """Each claim a client won (``task``, ``attempt``, ``agent``; from
    ``claims`` and ``more``) is, in the
    database, its task's only attempt, active, generation 1, owned by that
    agent, and the task's current attempt. Saves how many are not."""
    database = await run.database()
    async with database.read() as conn:
        rows = await conn.fetch_all(
            sa.text(
                "select a.public_id as attempt, t.public_id as task, p.name as agent, "
                "a.state, a.generation, (t.current_attempt_id = a.id) as current "
                "from task_attempts a join task_tasks t on t.id = a.task_id "
                "join principals p on p.id = a.claimant_id"
            ),
            {},
        )
    found = {row["attempt"]: dict(row) for row in rows}
    attempts_per_task = Counter(row["task"] for row in rows)
    wrong = []
    for claim in [*claims, *more]:
        row = found.get(claim["attempt"])
        if (
            row is None
            or row["task"] != claim["task"]
            or row["agent"] != claim["agent"]
            or row["state"] != "active"
            or row["generation"] != 1
            or not row["current"]
            or attempts_per_task[claim["task"]] != 1
        ):
            wrong.append(
                {"claim": claim, "row": row, "attempts_of_task": attempts_per_task[claim["task"]]}
            )
    return {"checked": len(claims) + len(more), "wrong": len(wrong), "examples": wrong[:5]}
