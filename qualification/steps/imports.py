"""Steps for J21's imports half: a beads export written to the journey's
directory, and the tasks two spaces imported it into compared.

``write_export`` writes the export (:func:`buildmax_imports.testing.beads_export`)
and saves what it holds of note. ``same_tasks`` reads every imported task of
two spaces through the API, as the admin, and compares them by source id:
title, body, criteria, state, priority, labels, kind, revision, source,
prerequisites and links (each by the source id of the task it names). Ids of
the space's own (task ids) are not compared: two imports make other ids.
"""

from __future__ import annotations

import asyncio
from typing import Any

from buildmax_graders.run import JourneyRun
from buildmax_imports.testing import BROKEN, CYCLE, beads_export

#: Task reads in flight at once.
_AT_ONCE = 8


async def write_export(run: JourneyRun, path: str, issues: int, seed: int = 21) -> dict[str, Any]:
    """Write an export of ``issues`` issues at ``path`` (in the journey's
    directory); saves its path, how many issues, held and closed ones, the
    cycle and the broken link."""
    export = beads_export(issues, seed)
    export.write(run.workdir / path)
    return {
        "path": path,
        "issues": issues,
        "held": export.held,
        "closed": export.closed,
        "cycle": list(CYCLE),
        "broken": list(BROKEN),
    }


async def _imported(run: JourneyRun, space: str) -> dict[str, dict[str, Any]]:
    """Every task of ``space`` that came from a record, by source id, read
    through the API (the list, then each task's prerequisites)."""
    headers = {"Authorization": f"Bearer {run.token('admin')}"}
    base = f"{run.url()}/v1/spaces/{space}"
    listed: list[dict[str, Any]] = []
    cursor = None
    while True:
        params = {"limit": 200, **({"cursor": cursor} if cursor else {})}
        page = (await run.http.get(f"{base}/tasks", params=params, headers=headers)).json()
        listed += page["items"]
        cursor = page.get("next_cursor")
        if not cursor:
            break
    gate = asyncio.Semaphore(_AT_ONCE)

    async def waits_for(task_id: str) -> list[str]:
        async with gate:
            answer = await run.http.get(f"{base}/tasks/{task_id}/dependencies", headers=headers)
        return [prerequisite["id"] for prerequisite in answer.json()["prerequisites"]]

    tasks = [task for task in listed if task.get("source")]
    prerequisites = await asyncio.gather(*(waits_for(task["id"]) for task in tasks))
    source_of = {task["id"]: task["source"]["id"] for task in tasks}
    return {
        task["source"]["id"]: {
            "title": task["title"],
            "body": task["body"],
            "criteria": task["criteria"],
            "state": task["state"],
            "priority": task["priority"],
            "labels": task["labels"],
            "kind": task["kind"],
            "revision": task["revision"],
            "source": task["source"],
            "prerequisites": sorted(source_of[task_id] for task_id in waiting),
            "links": sorted(f"{link['kind']}:{source_of[link['task']]}" for link in task["links"]),
        }
        for task, waiting in zip(tasks, prerequisites, strict=True)
    }


async def same_tasks(run: JourneyRun, spaces: list[str]) -> dict[str, Any]:
    """Compare the imported tasks of two spaces; saves ``equal``, how many
    tasks each has, and the first few source ids that differ, with both sides."""
    first, second = [await _imported(run, space) for space in spaces]
    differ = sorted(
        key for key in first.keys() | second.keys() if first.get(key) != second.get(key)
    )
    return {
        "equal": not differ,
        "tasks": [len(first), len(second)],
        "differences": [
            {"source_id": key, "first": first.get(key), "second": second.get(key)}
            for key in differ[:5]
        ],
    }
