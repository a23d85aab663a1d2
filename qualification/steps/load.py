"""Steps for J16: agents work the queue while the server is SIGKILLed.

``run`` drives concurrent agent loops (claim-next, checkpoint, then submit
or release) and a task creator against server 0, and SIGKILLs the server
the moment a chosen number of claims have been acknowledged. It keeps a
ledger of every mutation whose 2xx answer arrived: those were committed
before the server answered, so they must all survive the kill.
``verify`` compares that ledger with the database after the restart;
``audit_agrees`` compares the audit trail with the rows it describes.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Sequence
from typing import Any

import httpx
import sqlalchemy as sa
from buildmax_graders.run import JourneyRun, StepFailed

#: How long the load may run before the kill point is reached.
DEADLINE_SECONDS = 30.0

#: Examples of missing records kept in the step's saved value.
EXAMPLES = 5


class Ledger:
    """What the clients were told was committed, and what surprised them."""

    def __init__(self) -> None:
        self.tasks: list[str] = []
        self.claims: list[dict[str, Any]] = []
        self.checkpoints: list[dict[str, Any]] = []
        self.submissions: list[dict[str, Any]] = []
        self.releases: list[str] = []
        self.unexpected: list[dict[str, Any]] = []
        self.in_flight = 0

    def surprise(self, what: str, status: int | str, body: Any) -> None:
        slug = body.get("type") if isinstance(body, dict) else None
        self.unexpected.append({"request": what, "status": status, "problem": slug})

    def saved(self) -> dict[str, Any]:
        return {
            "tasks": self.tasks,
            "claims": self.claims,
            "checkpoints": self.checkpoints,
            "submissions": self.submissions,
            "releases": self.releases,
            "unexpected": self.unexpected,
            "acknowledged": {
                "tasks": len(self.tasks),
                "claims": len(self.claims),
                "checkpoints": len(self.checkpoints),
                "submissions": len(self.submissions),
                "releases": len(self.releases),
            },
        }


async def run(
    run: JourneyRun,
    space: str,
    project: str,
    agents: int = 8,
    agent_prefix: str = "agent",
    tasks: int = 30,
    more_tasks: int = 10,
    kill_after_claims: int = 15,
    seed: int = 16,
) -> dict[str, Any]:
    """Create ``tasks`` tasks, then let ``agents`` agents (``<agent_prefix><i>``) work the queue of
    ``project`` while ``more_tasks`` more are created, and SIGKILL server 0
    right after the ``kill_after_claims``-th acknowledged claim. Returns the
    ledger of acknowledged mutations (no tokens) and the surprises: any
    answer other than the expected 2xx before the kill."""
    base = run.url(0) + f"/v1/spaces/{space}"
    admin = run.token("admin")
    ledger = Ledger()
    killed = asyncio.Event()
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=agents + 4, max_keepalive_connections=agents + 4)

    async with httpx.AsyncClient(timeout=30.0, limits=limits) as http:

        async def post(what: str, path: str, token: str | None, body: Any) -> httpx.Response | None:
            """A mutation; ``None`` when the server is gone (after the kill)."""
            headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": str(uuid.uuid4())}
            ledger.in_flight += 1
            try:
                answer = await http.post(base + path, json=body, headers=headers)
            except httpx.TransportError as exc:
                if not killed.is_set():
                    ledger.surprise(what, f"transport error: {type(exc).__name__}", None)
                return None
            finally:
                ledger.in_flight -= 1
            if answer.status_code >= 300 and not killed.is_set():
                ledger.surprise(what, answer.status_code, _json(answer))
            return answer

        async def create(index: int) -> bool:
            answer = await post(
                "create task", "/tasks", admin, {"project": project, "title": f"load {index}"}
            )
            if answer is None:
                return False
            if answer.status_code == 201:
                ledger.tasks.append(answer.json()["id"])
            return True

        for index in range(tasks):
            if not await create(index):
                raise StepFailed(f"the server went away while creating task {index}")

        def kill() -> None:
            killed.set()
            in_flight = ledger.in_flight
            run.deployment.kill(0)
            run.inject(
                "server-killed",
                f"SIGKILL to server 0 mid-load, right after the answer to claim "
                f"{len(ledger.claims)} (claim-next) arrived: {len(ledger.tasks)} tasks created, "
                f"{len(ledger.submissions)} submissions and {len(ledger.releases)} releases "
                f"acknowledged, {in_flight} other requests in flight",
            )

        async def creator() -> None:
            for index in range(tasks, tasks + more_tasks):
                if killed.is_set() or not await create(index):
                    return
                await asyncio.sleep(0.05)

        async def agent(i: int) -> None:
            name = f"{agent_prefix}{i}"
            token = run.token(name)
            pace = random.Random(rng.random())
            while not killed.is_set():
                answer = await post("claim-next", "/claims", token, {"project": project})
                if answer is None:
                    return
                if answer.status_code == 200:
                    await asyncio.sleep(0.02)  # nothing claimable right now
                    continue
                if answer.status_code != 201:
                    continue
                claim = answer.json()
                attempt = claim["attempt"]
                attempt_token = run.secret(claim["token"])
                ledger.claims.append(
                    {
                        "attempt": attempt["id"],
                        "task": claim["task"]["id"],
                        "generation": attempt["generation"],
                        "agent": name,
                    }
                )
                if len(ledger.claims) == kill_after_claims and not killed.is_set():
                    kill()
                    return
                generation = attempt["generation"]
                await asyncio.sleep(pace.uniform(0.02, 0.08))
                answer = await post(
                    "checkpoint",
                    f"/attempts/{attempt['id']}/checkpoint",
                    attempt_token,
                    {"generation": generation, "data": {"agent": name}},
                )
                if answer is None:
                    return
                if answer.status_code == 201:
                    ledger.checkpoints.append(
                        {"attempt": attempt["id"], "number": answer.json()["number"]}
                    )
                await asyncio.sleep(pace.uniform(0.02, 0.08))
                if pace.random() < 0.7:
                    answer = await post(
                        "submit",
                        f"/attempts/{attempt['id']}/submit",
                        attempt_token,
                        {
                            "generation": generation,
                            "summary": f"done by {name}",
                            "candidate": {"commit": "c0ffee"},
                        },
                    )
                    if answer is None:
                        return
                    if answer.status_code == 201:
                        ledger.submissions.append(
                            {
                                "submission": answer.json()["submission"]["id"],
                                "attempt": attempt["id"],
                            }
                        )
                else:
                    answer = await post(
                        "release",
                        f"/attempts/{attempt['id']}/release",
                        attempt_token,
                        {"generation": generation, "reason": "handing it back"},
                    )
                    if answer is None:
                        return
                    if answer.status_code == 200:
                        ledger.releases.append(attempt["id"])

        started = time.monotonic()
        workers = [asyncio.create_task(agent(i)) for i in range(agents)]
        workers.append(asyncio.create_task(creator()))
        try:
            await asyncio.wait_for(asyncio.gather(*workers), DEADLINE_SECONDS)
        except TimeoutError:
            raise StepFailed(
                f"{len(ledger.claims)} claims acknowledged in {DEADLINE_SECONDS:g} s, "
                f"the kill waits for {kill_after_claims}"
            ) from None
    if not killed.is_set():
        raise StepFailed(
            f"the load ended with {len(ledger.claims)} claims acknowledged, "
            f"before the kill point ({kill_after_claims})"
        )
    saved = ledger.saved()
    saved["seconds"] = round(time.monotonic() - started, 2)
    return saved


def _json(answer: httpx.Response) -> Any:
    try:
        return answer.json()
    except ValueError:
        return None


async def _column(run: JourneyRun, sql: str, params: dict[str, Any]) -> list[Any]:
    database = await run.database()
    async with database.read() as conn:
        return [next(iter(row.values())) for row in await conn.fetch_all(sa.text(sql), params)]


async def _rows(run: JourneyRun, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    database = await run.database()
    async with database.read() as conn:
        return [dict(row) for row in await conn.fetch_all(sa.text(sql), params)]


async def verify(
    run: JourneyRun, ledger: dict[str, Any], claims: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """Every mutation in ``ledger`` (what ``run`` saved), and every extra
    acknowledged claim answer in ``claims``, is in the database: tasks,
    attempts (at their generation), checkpoints (as many as were
    acknowledged), submissions (their attempt submitted) and releases (the
    attempt released). Saves the counts missing, by kind, and their total."""
    task_ids = set(await _column(run, "select public_id from task_tasks", {}))
    attempts = {
        row["public_id"]: row
        for row in await _rows(run, "select public_id, generation, state from task_attempts", {})
    }
    checkpoint_counts = {
        row["public_id"]: int(row["n"])
        for row in await _rows(
            run,
            "select a.public_id, count(*) as n from task_checkpoints c "
            "join task_attempts a on a.id = c.attempt_id group by a.public_id",
            {},
        )
    }
    submissions = {
        row["public_id"]: row["attempt"]
        for row in await _rows(
            run,
            "select s.public_id, a.public_id as attempt from task_submissions s "
            "join task_attempts a on a.id = s.attempt_id",
            {},
        )
    }

    all_claims = [
        *ledger["claims"],
        *(
            {
                "attempt": c["attempt"]["id"],
                "task": c["task"]["id"],
                "generation": c["attempt"]["generation"],
            }
            for c in claims
        ),
    ]
    missing: dict[str, list[str]] = {
        "tasks": [t for t in ledger["tasks"] if t not in task_ids],
        "claimed_tasks": [c["task"] for c in all_claims if c["task"] not in task_ids],
        "attempts": [
            c["attempt"]
            for c in all_claims
            if attempts.get(c["attempt"], {}).get("generation") != c["generation"]
        ],
        "checkpoints": [],
        "submissions": [
            s["submission"]
            for s in ledger["submissions"]
            if submissions.get(s["submission"]) != s["attempt"]
            or attempts.get(s["attempt"], {}).get("state") != "submitted"
        ],
        "releases": [
            a for a in ledger["releases"] if attempts.get(a, {}).get("state") != "released"
        ],
    }
    acknowledged_checkpoints: dict[str, int] = {}
    for made in ledger["checkpoints"]:
        acknowledged_checkpoints[made["attempt"]] = max(
            acknowledged_checkpoints.get(made["attempt"], 0), int(made["number"])
        )
    missing["checkpoints"] = [
        a for a, n in acknowledged_checkpoints.items() if checkpoint_counts.get(a, 0) < n
    ]
    return {
        "acknowledged": {
            "tasks": len(ledger["tasks"]),
            "claims": len(all_claims),
            "checkpoints": len(ledger["checkpoints"]),
            "submissions": len(ledger["submissions"]),
            "releases": len(ledger["releases"]),
        },
        "missing": {kind: len(ids) for kind, ids in missing.items()},
        "missing_total": sum(len(ids) for ids in missing.values()),
        "examples": {kind: ids[:EXAMPLES] for kind, ids in missing.items() if ids},
    }


async def audit_agrees(run: JourneyRun, space: str, since: dict[str, int]) -> dict[str, Any]:
    """The audit trail after the mark ``since`` tells the same story as the
    rows of ``space``: one ``task.claimed`` per attempt, one
    ``attempt.submitted`` per submission, one ``attempt.expired`` per
    expired attempt. Saves both counts of each and how many disagree."""
    params = {"space": space}
    in_space = (
        "join spaces sp on sp.id = a.space_id where (sp.slug = :space or sp.public_id = :space)"
    )
    rows = {
        "task.claimed": await run.scalar(
            f"select count(*) from task_attempts a {in_space}", params
        ),
        "attempt.submitted": await run.scalar(
            "select count(*) from task_submissions s "
            f"join task_attempts a on a.id = s.attempt_id {in_space}",
            params,
        ),
        "attempt.expired": await run.scalar(
            f"select count(*) from task_attempts a {in_space} and a.state = 'expired'", params
        ),
    }
    events = {action: 0 for action in rows}
    for event in await run.audit_events():
        action = event.get("action")
        if action in events and event.get("seq", 0) > since.get(event.get("chain", ""), 0):
            events[action] += 1
    disagree = {action: abs(int(rows[action]) - events[action]) for action in rows}
    return {
        "rows": {action: int(n) for action, n in rows.items()},
        "events": events,
        "disagree": disagree,
        "disagree_total": sum(disagree.values()),
    }
