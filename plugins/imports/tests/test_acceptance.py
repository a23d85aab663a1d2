"""Issue-sized: a beads export of 5,000 issues (prerequisites, parents,
related and discovered-from links, closed and in-progress issues, a cycle
and a broken link) previewed and applied with ``buildmax import`` against
a running server; the apply killed (SIGKILL) part way and run again ends
equal to an uninterrupted import into another space; importing the file
again changes nothing; a newer export updates only what changed."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa
from buildmax_audit.tables import events as audit_events
from buildmax_imports.tables import mappings
from buildmax_imports.testing import BROKEN, CYCLE, beads_export
from buildmax_tasks.tables import dependencies, holds, task_revisions, tasks

from buildmax.config import Config
from buildmax.testing import ServerProcess, start_server

ISSUES = 5_000
CHUNK = 100


class Cli:
    """``buildmax import`` against a running server, as one principal."""

    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("BUILDMAX_")},
            "BUILDMAX_URL": url,
            "BUILDMAX_TOKEN": token,
        }

    def args(self, space: str, *words: str) -> list[str]:
        return [sys.executable, "-m", "buildmax", "import", *words, "--space", space]

    def run(self, space: str, *words: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            self.args(space, *words), env=self.env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, done.stderr
        return done

    def preview(self, space: str, path: Path) -> dict[str, Any]:
        done = self.run(
            space, "preview", str(path), "--format", "beads", "--project", "main", "--json"
        )
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    def start_apply(self, space: str, import_id: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.args(space, "apply", import_id),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


async def _state(app: Any, space_pk: int) -> dict[str, Any]:
    """A space's imported tasks as data that holds no id of its own: by
    source id, each task's text, state, priority, labels, revision,
    prerequisites and links (by source id) and whether a hold is on it."""
    async with app.db.read(background=True) as conn:
        rows = await conn.fetch_all(
            sa.select(tasks, task_revisions.c.body, task_revisions.c.criteria)
            .join(
                task_revisions,
                sa.and_(
                    task_revisions.c.task_id == tasks.c.id,
                    task_revisions.c.number == tasks.c.revision,
                ),
            )
            .where(tasks.c.space_id == space_pk)
        )
        edges = await conn.fetch_all(sa.select(dependencies))
        held = {
            row["scope_pk"]
            for row in await conn.fetch_all(
                sa.select(holds).where(holds.c.space_id == space_pk, holds.c.lifted_at.is_(None))
            )
        }
    by_pk = {row["id"]: row["source_id"] for row in rows}
    by_public = {row["public_id"]: row["source_id"] for row in rows}
    waits: dict[str, list[str]] = {}
    for edge in edges:
        if edge["task_id"] in by_pk:
            waits.setdefault(by_pk[edge["task_id"]], []).append(by_pk[edge["prerequisite_id"]])
    return {
        row["source_id"]: (
            row["title"],
            row["body"],
            row["criteria"],
            row["state"],
            row["outcome_reason"],
            row["priority"],
            row["labels"],
            row["kind"],
            row["revision"],
            sorted(waits.get(row["source_id"], [])),
            sorted((link["kind"], by_public[link["task"]]) for link in json.loads(row["links"])),
            row["id"] in held,
        )
        for row in rows
    }


async def _applied(api: httpx.AsyncClient, space: str, import_id: str) -> int:
    answer = await api.get(f"/v1/spaces/{space}/imports/{import_id}", params={"items": "exclude"})
    return int(answer.json()["chunks_applied"])


async def test_a_5000_issue_export_killed_and_resumed_equals_one_import(
    app: Any, buildmax_settings: Config, make_principal: Any, make_space: Any, tmp_path: Path
) -> None:
    owner = await make_principal("human")
    killed_space, whole_space = await make_space(owner), await make_space(owner)
    server: ServerProcess = await asyncio.to_thread(
        start_server, buildmax_settings, tmp_path / "server.log"
    )
    api = httpx.AsyncClient(base_url=server.url, headers=owner.headers, timeout=30)
    try:
        cli = Cli(server.url, owner.token)
        for space in (killed_space, whole_space):
            made = await api.post(f"/v1/spaces/{space.id}/projects", json={"name": "main"})
            made.raise_for_status()
        export = beads_export(ISSUES)
        issues = export.issues
        path = export.write(tmp_path / "issues.jsonl")

        preview = await asyncio.to_thread(cli.preview, killed_space.id, path)
        assert preview["counts"]["create"] == ISSUES
        assert len(preview["chunks"]) == ISSUES // CHUNK
        refused = {(e["source_id"], e["target"]): e["reason"] for e in preview["refused"]}
        ring = set(CYCLE)
        (cut,) = [edge for edge, reason in refused.items() if "would close a cycle" in reason]
        assert set(cut) <= ring
        assert "broken link" in refused[BROKEN]
        held = sum(1 for item in preview["items"] if item["state"] == "held")
        assert held == export.held > 400

        # Killed part way, then run again to the end.
        apply = await asyncio.to_thread(cli.start_apply, killed_space.id, preview["id"])
        deadline = time.monotonic() + 300
        while await _applied(api, killed_space.id, preview["id"]) < 3:
            assert apply.poll() is None, apply.communicate()
            assert time.monotonic() < deadline, "the apply did not get to chunk 3"
            await asyncio.sleep(0.05)
        apply.send_signal(signal.SIGKILL)
        apply.communicate()  # waits, and closes its pipes
        assert apply.returncode == -signal.SIGKILL
        stopped = await _applied(api, killed_space.id, preview["id"])
        assert 3 <= stopped < len(preview["chunks"])
        resumed = await asyncio.to_thread(cli.run, killed_space.id, "apply", preview["id"])
        assert f"of {len(preview['chunks'])}" in resumed.stdout

        whole = await asyncio.to_thread(cli.preview, whole_space.id, path)
        await asyncio.to_thread(cli.run, whole_space.id, "apply", whole["id"])

        killed_state = await _state(app, killed_space.pk)
        assert len(killed_state) == ISSUES
        assert killed_state == await _state(app, whole_space.pk)
        async with app.db.read(background=True) as conn:
            mapped = await conn.fetch_val(
                sa.select(sa.func.count())
                .select_from(mappings)
                .where(mappings.c.space_id == killed_space.pk)
            )
        assert mapped == ISSUES
        kept = {(key, target) for key in ring for target in killed_state[key][9]}
        assert len(kept) == 2 and cut not in kept  # the rest of the cycle is imported
        assert ("related", BROKEN[1]) not in killed_state[BROKEN[0]][10]

        # The same export again: nothing changes, no task is audited.
        async with app.db.read(background=True) as conn:
            audited = await conn.fetch_val(sa.select(sa.func.max(audit_events.c.id)))
        again = await asyncio.to_thread(cli.preview, killed_space.id, path)
        assert again["counts"]["unchanged"] == ISSUES and again["counts"]["create"] == 0
        await asyncio.to_thread(cli.run, killed_space.id, "apply", again["id"])
        assert await _state(app, killed_space.pk) == killed_state
        async with app.db.read(background=True) as conn:
            since = await conn.fetch_all(
                sa.select(audit_events.c.action).where(audit_events.c.id > audited)
            )
        assert {row["action"] for row in since} == {"import.previewed", "import.chunk.applied"}

        # A newer export: 50 renamed, 30 open ones closed, 10 new.
        rng = random.Random(7)
        renamed = rng.sample(range(100, ISSUES), 50)
        for index in renamed:
            issues[index]["title"] += " (renamed)"
        open_ones = [
            i
            for i, issue in enumerate(issues)
            if issue["status"] == "open" and i not in renamed and i > 20
        ]
        closed = rng.sample(open_ones, 30)
        for index in closed:
            issues[index]["status"] = "closed"
        issues += [{"id": f"bd-new-{n}", "title": f"New {n}", "status": "open"} for n in range(10)]
        newer = await asyncio.to_thread(
            cli.preview, killed_space.id, export.write(tmp_path / "newer.jsonl")
        )
        assert newer["counts"]["update"] == 80 and newer["counts"]["create"] == 10
        await asyncio.to_thread(cli.run, killed_space.id, "apply", newer["id"])
        after = await _state(app, killed_space.pk)
        changed = {key for key in killed_state if after[key] != killed_state[key]}
        touched = {f"bd-{i + 1}" for i in (*renamed, *closed)}
        # Closing a task readies those that waited for it and nothing else.
        released = {
            key
            for key in changed - touched
            if killed_state[key][3] == "open" and after[key][3] == "ready"
        }
        assert changed - touched == released
        for index in renamed:
            key = f"bd-{index + 1}"
            if killed_state[key][3] in ("done", "canceled"):
                assert after[key] == killed_state[key]  # closed here: never revised
            else:
                assert after[key][0].endswith("(renamed)")
                assert after[key][8] == killed_state[key][8] + 1
        for index in closed:
            assert after[f"bd-{index + 1}"][3] == "done"
        assert len(after) == ISSUES + 10

        # What a person reads: the status, and a file of another format refused.
        status = await asyncio.to_thread(cli.run, killed_space.id, "status", preview["id"])
        assert f"applied, {ISSUES // CHUNK} of {ISSUES // CHUNK} chunks applied" in status.stdout
        assert f"{export.held} held" in status.stdout and "lift the hold" in status.stdout
        assert "would close a cycle" in status.stdout
        other = tmp_path / "issues.csv"
        other.write_text("id,title\nc-1,a row\n")
        refused = await asyncio.to_thread(
            subprocess.run,
            cli.args(
                killed_space.id, "preview", str(other), "--format", "beads", "--project", "main"
            ),
            env=cli.env,
            capture_output=True,
            text=True,
        )
        assert refused.returncode == 1 and refused.stdout == ""
        assert refused.stderr.startswith("error: 422 import-file-refused: line 1:")
    finally:
        await api.aclose()
        await asyncio.to_thread(server.stop)
