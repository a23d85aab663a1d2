"""Steps for J17: a backup taken while agents work, restored as a pair.

``under_load`` lets agents claim, upload and hand in work while ``buildmax
backup create`` runs, and measures the longest any write waited while the
backup held its snapshot. ``restore_fresh`` stops the servers, moves the
data directory (and, on PostgreSQL, the database) out of the way, restores
the newest backup into the empty target and starts the servers on it, with
the fresh admin token the restore printed. ``artifacts`` and ``counts``
compare what the restored deployment holds with what the backup's manifest
and the load's ledger say; ``claim_again`` claims a recovered task.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import time
import uuid
from typing import Any

import httpx
from buildmax_graders.process import BUILDMAX
from buildmax_graders.run import JourneyRun, StepFailed

from buildmax.database import servers

#: How long the load runs before, during and after the backup, at most.
DEADLINE_SECONDS = 60.0
#: Tables whose row counts the restore itself changes: its token, its audit
#: events, the events of the attempts it ended, and their reservations; and,
#: on PostgreSQL, the event outbox: events committed just before the
#: snapshot but not yet numbered are in the restored outbox, and the
#: restored server numbers them into ``events`` (see buildmax.backups.restore).
RESTORE_WRITES = {"tokens", "audit_events", "events", "event_outbox", "task_reservations"}
_TOKEN = re.compile(r"shown once, keep it safe\):\s+(bmx_\S+)")


async def under_load(
    run: JourneyRun,
    space: str,
    project: str,
    agents: int = 6,
    agent_prefix: str = "agent",
    tasks: int = 40,
    backup_after_claims: int = 8,
) -> dict[str, Any]:
    """Agents work while a backup is taken; one agent keeps its claim
    (``holder``) across the backup. Saves the artifacts acknowledged before
    the backup began, the holder's claim, every surprise (any answer but the
    expected 2xx, 409 or an empty queue), the backup's exit and output, and
    the longest write while the backup ran."""
    base = run.url(0) + f"/v1/spaces/{space}"
    admin = run.token("admin")
    stop = asyncio.Event()
    backup_started = asyncio.Event()
    window: list[float] = []  # [start, end] of the backup, monotonic
    uploads_before: list[dict[str, Any]] = []
    writes: list[tuple[float, float]] = []  # (start, seconds) of every write
    surprises: list[dict[str, Any]] = []
    claims = 0
    holder: dict[str, Any] = {}
    limits = httpx.Limits(max_connections=agents + 4, max_keepalive_connections=agents + 4)

    async with httpx.AsyncClient(timeout=30.0, limits=limits) as http:

        async def write(what: str, path: str, token: str | None, **kwargs: Any) -> httpx.Response:
            headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": str(uuid.uuid4())}
            headers.update(kwargs.pop("headers", {}))
            began = time.monotonic()
            answer = await http.post(base + path, headers=headers, **kwargs)
            writes.append((began, time.monotonic() - began))
            if answer.status_code >= 300 and answer.status_code != 409:
                body = (
                    answer.json() if answer.headers.get("content-type", "").endswith("json") else {}
                )
                surprises.append(
                    {"request": what, "status": answer.status_code, "detail": body.get("detail")}
                )
            return answer

        for index in range(tasks):
            await write(
                "create task", "/tasks", admin, json={"project": project, "title": f"b{index}"}
            )

        async def agent(i: int) -> None:
            nonlocal claims
            token = run.token(f"{agent_prefix}{i}")
            while not stop.is_set():
                answer = await write("claim-next", "/claims", token, json={"project": project})
                if answer.status_code != 201:
                    await asyncio.sleep(0.05)
                    continue
                claim = answer.json()
                claims += 1
                attempt = claim["attempt"]
                attempt_token = run.secret(claim["token"])
                if i == 0 and not holder:
                    holder.update(
                        task=claim["task"]["id"],
                        attempt=attempt["id"],
                        generation=attempt["generation"],
                        token=attempt_token,
                    )
                    continue  # held across the backup: never handed in
                data = f"{space} {attempt['id']} {uuid.uuid4()}".encode() * 64
                answer = await write(
                    "upload",
                    f"/artifacts?name=out-{attempt['id']}.txt&attempt={attempt['id']}"
                    f"&generation={attempt['generation']}",
                    attempt_token,
                    content=data,
                    headers={"Content-Type": "text/plain"},
                )
                if answer.status_code == 201 and not backup_started.is_set():
                    uploads_before.append(
                        {"id": answer.json()["id"], "sha256": hashlib.sha256(data).hexdigest()}
                    )
                await write(
                    "submit",
                    f"/attempts/{attempt['id']}/submit",
                    attempt_token,
                    json={
                        "generation": attempt["generation"],
                        "summary": "done",
                        "candidate": _candidate(claim["task"]["kind"]),
                    },
                )
                if claims >= backup_after_claims and not backup_started.is_set():
                    backup_started.set()

        async def backup() -> dict[str, Any]:
            await backup_started.wait()
            window.append(time.monotonic())
            env = {**os.environ, **run.environment()}
            proc = await asyncio.create_subprocess_exec(
                *BUILDMAX,
                "backup",
                "create",
                "--output",
                str(run.workdir / "backups"),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                cwd=run.workdir,
            )
            out, _ = await proc.communicate()
            window.append(time.monotonic())
            await asyncio.sleep(0.5)  # the load goes on after the backup
            stop.set()
            return {"exit": proc.returncode, "output": out.decode(errors="replace")}

        workers = [asyncio.create_task(agent(i)) for i in range(agents)]
        try:
            taken = await asyncio.wait_for(backup(), DEADLINE_SECONDS)
        except TimeoutError:
            raise StepFailed(f"no backup within {DEADLINE_SECONDS:g} s ({claims} claims)") from None
        finally:
            stop.set()
            await asyncio.gather(*workers, return_exceptions=True)
    if not holder:
        raise StepFailed("no agent kept a claim across the backup")
    start, end = window
    during = [seconds for began, seconds in writes if start <= began <= end]
    return {
        "backup": taken,
        "holder": holder,
        "uploads_before": uploads_before,
        "unexpected": surprises,
        "claims": claims,
        "writes_during_backup": len(during),
        "longest_write_during_backup_ms": round(max(during, default=0.0) * 1000, 1),
        "backup_seconds": round(end - start, 2),
    }


def _candidate(kind: str) -> dict[str, Any]:
    """What an agent hands in: a commit for work, a merge for an integration."""
    if kind == "integration":
        return {"outcome": "merged", "before": "c0ffee0", "after": "c0ffee1"}
    return {"commit": "c0ffee"}


async def restore_fresh(run: JourneyRun) -> dict[str, Any]:
    """Stop the servers, move the deployment's data aside, restore the newest
    backup into the empty target and start the servers on it."""
    deployment = run.deployment
    await deployment.stop()
    await run.close()  # the journey's own database connections
    aside = deployment.data_dir.with_name("data-before-restore")
    deployment.data_dir.rename(aside)
    deployment.data_dir.mkdir()
    env = {**os.environ, **run.environment()}
    argv = [*BUILDMAX, "backup", "restore", str(run.workdir / "backups")]
    if deployment.engine == "postgres":
        name = f"bmq_{uuid.uuid4().hex[:16]}_restored"
        url = await servers.create_database(deployment.pg_server_url, name, None)
        config = deployment.config_path.read_text("utf-8")
        deployment.config_path.write_text(config.replace(deployment.database_url, url), "utf-8")
        deployment.database_url = url
        # The journey drops the database it created; the old one is dropped here.
        old, deployment.database_name = deployment.database_name, name
        if old is not None:
            await servers.drop_database(deployment.pg_server_url, old)
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
        cwd=run.workdir,
    )
    out, _ = await proc.communicate()
    output = out.decode(errors="replace")
    if proc.returncode != 0:
        raise StepFailed(f"buildmax backup restore: exit {proc.returncode}: {output.strip()}")
    found = _TOKEN.search(output)
    if found is None:
        raise StepFailed("the restore printed no admin token")
    old_admin = deployment.admin_token
    deployment.admin_token = run.secret(found.group(1))
    await deployment.start()
    return {
        "output": output.replace(found.group(1), "<token>"),
        "old_admin": {"token": old_admin},
        "lost": re.findall(r"^  (\S+)$", output, re.MULTILINE),
    }


async def artifacts(run: JourneyRun, space: str, before: list[dict[str, Any]]) -> dict[str, Any]:
    """Every artifact the restored deployment lists resolves to its bytes;
    every artifact acknowledged before the backup is among them (or was
    listed as lost by the restore)."""
    admin = run.token("admin")
    headers = {"Authorization": f"Bearer {admin}"}
    base = run.url(0) + f"/v1/spaces/{space}/artifacts"
    listed: dict[str, str] = {}
    cursor: str | None = None
    while True:
        page = await run.http.get(
            base, headers=headers, params={"cursor": cursor} if cursor else {}
        )
        body = page.json()
        for item in body["items"]:
            listed[item["id"]] = item["sha256"]
        cursor = body.get("next_cursor")
        if not cursor:
            break
    unresolved = []
    for artifact_id, sha256 in listed.items():
        content = await run.http.get(f"{base}/{artifact_id}/content", headers=headers)
        if content.status_code != 200 or hashlib.sha256(content.content).hexdigest() != sha256:
            unresolved.append({"id": artifact_id, "status": content.status_code})
    missing = [a["id"] for a in before if listed.get(a["id"]) != a["sha256"]]
    return {"listed": len(listed), "unresolved": unresolved, "missing_from_before": missing}


async def counts(run: JourneyRun) -> dict[str, Any]:
    """The restored tables' row counts against the manifest's (the tables
    the restore itself writes to aside)."""
    folder = sorted((run.workdir / "backups").glob("buildmax-*"))[-1]
    manifest = json.loads((folder / "manifest.json").read_text("utf-8"))
    differ = {}
    for table, expected in manifest["row_counts"].items():
        if table in RESTORE_WRITES:
            continue
        found = await run.scalar(f'SELECT count(*) FROM "{table}"')
        if int(found) != expected:
            differ[table] = {"manifest": expected, "restored": int(found)}
    return {"tables": len(manifest["row_counts"]), "differ": differ}


async def claim_again(
    run: JourneyRun, space: str, task: str, generation: int, agent: str
) -> dict[str, Any]:
    """A new token for ``agent`` (its old one is void), then a claim of the
    task its lost claim held: the generation it gets, and the least it may
    be (past every generation handed out before the restore)."""
    admin = {"Authorization": f"Bearer {run.token('admin')}"}
    principal = await run.http.get(run.url(0) + f"/v1/principals/{agent}", headers=admin)
    made = await run.http.post(
        run.url(0) + "/v1/tokens",
        headers=admin,
        json={"principal_id": principal.json()["id"], "name": "after the restore"},
    )
    token = run.secret(made.json()["token"])
    answer = await run.http.post(
        run.url(0) + f"/v1/spaces/{space}/tasks/{task}/claim",
        headers={"Authorization": f"Bearer {token}"},
        json={},
    )
    body = answer.json()
    got = body.get("attempt", {}).get("generation")
    return {
        "status": answer.status_code,
        "generation": got,
        "past_every_earlier_one": isinstance(got, int) and got > generation + 1_000_000,
    }
