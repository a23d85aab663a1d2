"""Concurrent mutations keep every chain gap-free and verifiable.

200 mutations from 20 principals across 3 spaces, fired at once from 4 OS
processes against real ``buildmax serve`` processes (two on PostgreSQL, one
on SQLite, which is one process by design), leave exactly 200 events, each
by the principal that made the request, and every chain verifies. Half the
mutations rename a space (its own chain), half mint a token (the system
chain, which nothing else serialises), so a chain head that is not locked
while appending shows up as a duplicate sequence number or a fork.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
from buildmax_audit.tables import SYSTEM_CHAIN
from buildmax_audit.verify import verify_database

from buildmax.config import Config
from buildmax.testing import ServerProcess, start_server

from .conftest import heads, trail

TOKEN = re.compile(r"bmx_[A-Za-z0-9_-]{43}")
PRINCIPALS = 20
SPACES = 3
PROCESSES = 4
MUTATIONS = 200

#: One OS process of load: prints ``ready`` once its imports are done, then
#: reads its share of the plan from stdin and sends all of it at once; prints
#: each request's index, status and (when not 2xx) body as one JSON line.
WORKER = """
import asyncio, json, sys
import httpx

print("ready", flush=True)
plan = json.loads(sys.stdin.read())

async def main():
    limits = httpx.Limits(max_connections=len(plan))
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        async def send(step):
            try:
                response = await client.request(
                    step["method"], step["url"], json=step["body"],
                    headers={"Authorization": "Bearer " + step["token"]},
                )
            except httpx.HTTPError as exc:
                return {"index": step["index"], "status": None, "body": repr(exc)}
            ok = 200 <= response.status_code < 300
            return {
                "index": step["index"],
                "status": response.status_code,
                "body": None if ok else response.text,
            }
        return await asyncio.gather(*(send(step) for step in plan))

print(json.dumps(asyncio.run(main())), flush=True)
"""


async def _run_workers(shares: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Run one worker process per share, released together; every result."""
    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            WORKER,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for _ in shares
    ]
    try:
        for worker in workers:  # every process is up before any request goes
            assert worker.stdout is not None
            assert await asyncio.wait_for(worker.stdout.readline(), 30) == b"ready\n"
        for worker, share in zip(workers, shares, strict=True):
            assert worker.stdin is not None
            worker.stdin.write(json.dumps(share).encode())
            await worker.stdin.drain()
            worker.stdin.close()
        outputs = await asyncio.wait_for(
            asyncio.gather(*(worker.communicate() for worker in workers)), 90
        )
    finally:
        for worker in workers:
            if worker.returncode is None:
                worker.kill()
                await worker.wait()
    assert [worker.returncode for worker in workers] == [0] * len(workers)
    return [result for stdout, _ in outputs for result in json.loads(stdout)]


def _log_errors(servers: list[ServerProcess]) -> list[str]:
    """A few distinct exception lines the servers logged (a failure's why)."""
    lines = (line.strip() for server in servers for line in server.log().splitlines())
    found = {line for line in lines if re.match(r"[\w.]+(Error|Exception): |DETAIL: ", line)}
    return sorted(found)[:5]


def _start_servers(settings: Config, tmp_path: Path, count: int) -> list[ServerProcess]:
    servers: list[ServerProcess] = []
    try:
        for number in range(count):
            servers.append(start_server(settings, tmp_path / f"server-{number}.log"))
    except BaseException:
        for server in servers:
            server.stop()
        raise
    return servers


async def test_concurrent_mutations_leave_gap_free_verifying_chains(
    app: Any, buildmax_engine: str, buildmax_database_url: str, tmp_path: Path
) -> None:
    postgres = buildmax_engine == "postgresql"
    settings = Config(
        data_dir=str(tmp_path / "data"), database_url=buildmax_database_url if postgres else ""
    )
    servers = await asyncio.to_thread(_start_servers, settings, tmp_path, 2 if postgres else 1)
    try:
        await _exercise(app, [server.url for server in servers], servers)
    finally:
        for server in servers:
            await asyncio.to_thread(server.stop)


async def _exercise(app: Any, urls: list[str], servers: list[ServerProcess]) -> None:
    minted = [token for server in servers for token in TOKEN.findall(server.log())]
    assert len(minted) == 1, "exactly one server process bootstraps the admin"
    admin = {"Authorization": f"Bearer {minted[0]}"}

    # Setup, as the bootstrapped admin: 3 spaces, 20 principals with a
    # token each, every principal an admin of every space.
    async with httpx.AsyncClient(base_url=urls[0], headers=admin, timeout=30) as client:

        async def call(method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
            response = await client.request(method, path, json=body)
            assert response.is_success, (method, path, response.status_code, response.text)
            return response.json()  # type: ignore[no-any-return]

        spaces = [
            (await call("POST", "/v1/spaces", {"slug": f"load-{n}", "name": f"Load {n}"}))["id"]
            for n in range(SPACES)
        ]
        principals = []
        for n in range(PRINCIPALS):
            principal = await call(
                "POST", "/v1/principals", {"name": f"agent-{n}", "kind": "agent"}
            )
            issued = await call(
                "POST", "/v1/tokens", {"name": "load", "principal_id": principal["id"]}
            )
            assert issued["principal_id"] == principal["id"]
            principals.append((principal["id"], issued["token"]))
        await asyncio.gather(
            *(
                call("PUT", f"/v1/spaces/{space}/members/{principal}", {"role": "admin"})
                for space in spaces
                for principal, _ in principals
            )
        )

    before = {event["id"] for event in await trail(app)}
    heads_before = await heads(app)
    assert set(heads_before) == {SYSTEM_CHAIN, *spaces}

    # The load: principal, kind, space and server all vary across each
    # process's share, so every process hits every server and principal.
    plan: list[dict[str, Any]] = []
    expected: dict[tuple[str, str], tuple[str, str]] = {}  # (action, name) -> (chain, actor)
    for index in range(MUTATIONS):
        principal, token = principals[index % PRINCIPALS]
        url = urls[index % len(urls)]
        if (index // PRINCIPALS) % 2 == 0:
            space = spaces[index % SPACES]
            name = f"renamed-{index}"
            step = {"method": "PATCH", "url": f"{url}/v1/spaces/{space}", "body": {"name": name}}
            expected["space.updated", name] = (space, principal)
        else:
            name = f"load-{index}"
            step = {"method": "POST", "url": f"{url}/v1/tokens", "body": {"name": name}}
            expected["token.created", name] = (SYSTEM_CHAIN, principal)
        plan.append({**step, "index": index, "token": token})
    share = MUTATIONS // PROCESSES
    results = await _run_workers([plan[k * share : (k + 1) * share] for k in range(PROCESSES)])

    assert sorted(result["index"] for result in results) == list(range(MUTATIONS))
    failed = [result for result in results if not 200 <= (result["status"] or 0) < 300]
    assert not failed, (
        f"{len(failed)} of {MUTATIONS} requests failed, first: {failed[:2]}; "
        f"server logs: {_log_errors(servers)}"
    )

    # Exactly one new event per mutation, on the right chain, by the
    # principal that made the request; nothing older changed.
    trail_after = await trail(app)
    assert before <= {event["id"] for event in trail_after}
    new = [event for event in trail_after if event["id"] not in before]
    assert len(new) == MUTATIONS
    found = {(event["action"], event["details"]["name"]): event for event in new}
    assert set(found) == set(expected)
    for key, (chain, actor) in expected.items():
        event = found[key]
        assert (event["chain"], event["actor_id"], event["actor_kind"]) == (chain, actor, "agent")
        if key[0] == "token.created":
            assert event["details"]["principal_id"] == actor
        else:
            assert (event["space_id"], event["target_id"]) == (chain, chain)

    # Every chain verifies, through each server and in the database.
    heads_after = await heads(app)
    async with httpx.AsyncClient(headers=admin, timeout=30) as client:
        for url in urls:
            response = await client.get(url + "/v1/audit/verify")
            assert response.status_code == 200, response.text
            report = response.json()
            broken = [(c["chain"], c["broken_seq"], c["cause"]) for c in report["chains"]]
            assert report["ok"], [problem for problem in broken if problem[1] is not None]
            assert {chain["chain"] for chain in report["chains"]} == set(heads_after)
    reports = await verify_database(app)
    assert [(r.chain, r.broken_seq, r.cause) for r in reports if not r.ok] == []
    assert {r.chain: r.last_seq for r in reports} == {
        chain: head["seq"] for chain, head in heads_after.items()
    }

    # Every chain gap-free, its head the last event, advanced by its share.
    assert set(heads_after) == set(heads_before)
    per_chain = Counter(event["chain"] for event in new)
    assert per_chain[SYSTEM_CHAIN] == MUTATIONS // 2
    for chain, head in heads_after.items():
        stored = [event for event in trail_after if event["chain"] == chain]
        seqs = [event["seq"] for event in stored]
        assert seqs == list(range(head["anchor_seq"] + 1, head["seq"] + 1)), chain
        assert head["head_hash"] == stored[-1]["hash"], chain
        assert head["seq"] - heads_before[chain]["seq"] == per_chain[chain], chain
