"""A task made from a record of another tool: its source, unique in the
space; created closed as the work was there; and links to other tasks that
are not prerequisites (docs/tasks.md, "Sources and links")."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_audit.tables import events as audit_events
from buildmax_tasks.tables import TASKS_BY_SOURCE, tasks

from buildmax.migrations import migrate
from buildmax.tables import schema_migrations

BEADS = {"system": "beads", "id": "bd-12"}
PROBLEM = "urn:buildmax:problem:"


async def _count(work: Any) -> int:
    return len(await work.rows(tasks))


async def _audited(work: Any, action: str, target: str) -> list[dict[str, Any]]:
    rows = await work.rows(
        audit_events, audit_events.c.action == action, audit_events.c.target_id == target
    )
    return list(rows)


async def _task_elsewhere(work: Any, make_space: Any, **fields: Any) -> dict[str, Any]:
    """A task made in a space of its own (another than the work's)."""
    elsewhere = await make_space(work.owner)
    project = await work.call(
        "POST", f"/v1/spaces/{elsewhere.id}/projects", json={"name": "p"}, expect=201
    )
    return await work.call(  # type: ignore[no-any-return]
        "POST",
        f"/v1/spaces/{elsewhere.id}/tasks",
        json={"project": project["id"], "title": "t", **fields},
        expect=201,
    )


async def test_a_task_names_its_source_once_in_a_space(work, make_space) -> None:
    made = await work.call(
        "POST", "/tasks", json={"project": work.project, "title": "t", "source": BEADS}, expect=201
    )
    assert made["source"] == BEADS and made["state"] == "ready"
    shown = await work.call("GET", f"/tasks/{made['id']}", work.viewer, expect=200)
    assert shown["source"] == BEADS and shown["links"] == []
    (audited,) = await _audited(work, "task.created", made["id"])
    assert json.loads(audited["details"])["source"] == "beads:bd-12"

    before = await _count(work)
    again = await work.call(
        "POST",
        "/tasks",
        json={"project": work.project, "title": "again", "source": BEADS},
        expect=409,
        problem="task-source-taken",
    )
    assert again["task"] == made["id"] and await _count(work) == before

    # Another record of the same source, and the same record in another space, are fine.
    other = {"system": "beads", "id": "bd-13"}
    await work.call(
        "POST", "/tasks", json={"project": work.project, "title": "t", "source": other}, expect=201
    )
    await _task_elsewhere(work, make_space, source=BEADS)
    plain = await work.call(
        "POST", "/tasks", json={"project": work.project, "title": "here"}, expect=201
    )
    assert plain["source"] is None


@pytest.mark.parametrize("state", ["done", "canceled"])
async def test_a_task_from_a_source_may_be_created_closed_and_counts_so(work, state: str) -> None:
    unfinished = await work.task("still to do")
    closed = await work.call(
        "POST",
        "/tasks",
        json={
            "project": work.project,
            "title": "shipped elsewhere",
            "source": BEADS,
            "state": state,
            "outcome_reason": "closed in beads",
            # Closed elsewhere before what it waited for: it stays closed.
            "prerequisites": [unfinished["id"]],
        },
        expect=201,
    )
    assert (closed["state"], closed["outcome_reason"]) == (state, "closed in beads")
    assert closed["id"] not in await work.ready_ids()
    await work.call("POST", f"/tasks/{closed['id']}/claim", work.agent, expect=409)
    waiting = await work.call(
        "POST",
        "/tasks",
        json={"project": work.project, "title": "next", "prerequisites": [closed["id"]]},
        expect=201,
    )
    assert waiting["state"] == ("ready" if state == "done" else "open")
    (audited,) = await _audited(work, "task.created", closed["id"])
    assert json.loads(audited["details"])["state"] == state


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"state": "done"}, "state"),
        ({"state": "canceled", "outcome_reason": "x"}, "state"),
        ({"outcome_reason": "why"}, "outcome_reason"),
        ({"state": "claimed", "source": BEADS}, "state"),
        ({"source": {"system": "Beads!", "id": "1"}}, "source"),
        ({"source": {"system": "beads", "id": ""}}, "source"),
        ({"links": [{"kind": "prerequisite", "task": "ta_x"}]}, "links"),
        ({"links": [{"kind": "related", "task": "ta_nowhere"}]}, "links"),
    ],
)
async def test_a_bad_source_state_or_link_is_refused_and_creates_nothing(
    work, body: dict[str, Any], field: str
) -> None:
    before = await _count(work)
    refused = await work.call(
        "POST", "/tasks", json={"project": work.project, "title": "t", **body}, expect=422
    )
    assert field in refused["errors"] and await _count(work) == before


async def test_links_are_kept_and_replaced_in_any_state(work, make_space) -> None:
    parent = await work.task("parent")
    sibling = await work.task("sibling")
    child = await work.call(
        "POST",
        "/tasks",
        json={
            "project": work.project,
            "title": "child",
            "links": [
                {"kind": "parent", "task": parent["id"]},
                {"kind": "parent", "task": parent["id"]},
                {"kind": "related", "task": sibling["id"]},
            ],
        },
        expect=201,
    )
    assert child["links"] == [
        {"kind": "parent", "task": parent["id"]},
        {"kind": "related", "task": sibling["id"]},
    ]
    await work.call("POST", f"/tasks/{child['id']}/cancel", json={"reason": "moved"}, expect=200)
    replaced = await work.call(
        "PUT",
        f"/tasks/{child['id']}/links",
        json={"links": [{"kind": "discovered-from", "task": sibling["id"]}]},
        expect=200,
    )
    assert replaced["state"] == "canceled"
    assert replaced["links"] == [{"kind": "discovered-from", "task": sibling["id"]}]
    assert len(await _audited(work, "task.links.set", child["id"])) == 1
    # The same links again change nothing and audit nothing.
    await work.call(
        "PUT",
        f"/tasks/{child['id']}/links",
        json={"links": [{"kind": "discovered-from", "task": sibling["id"]}]},
        expect=200,
    )
    assert len(await _audited(work, "task.links.set", child["id"])) == 1

    foreign = await _task_elsewhere(work, make_space)
    for links in (
        [{"kind": "related", "task": foreign["id"]}],
        [{"kind": "related", "task": child["id"]}],
    ):
        await work.call("PUT", f"/tasks/{child['id']}/links", json={"links": links}, expect=422)
    await work.call(
        "PUT", f"/tasks/{child['id']}/links", work.viewer, json={"links": []}, expect=403
    )
    shown = await work.call("GET", f"/tasks/{child['id']}", expect=200)
    assert shown["links"] == [{"kind": "discovered-from", "task": sibling["id"]}]


async def test_migration_6_adds_sources_and_links_to_a_database_made_before_it(work, app) -> None:
    """A database of tasks migration 5 has no source or link columns: the
    migration adds them, and its tasks read with no source and no links."""
    old = await work.task("from before")
    async with app.db.write() as tx:
        await tx.execute(sa.text(f"DROP INDEX {TASKS_BY_SOURCE.name}"))
        for column in ("source_system", "source_id", "links"):
            await tx.execute(sa.text(f"ALTER TABLE task_tasks DROP COLUMN {column}"))
        await tx.execute(
            sa.delete(schema_migrations).where(
                schema_migrations.c.plugin == "tasks", schema_migrations.c.version == 6
            )
        )
    applied = await migrate(app.db, app.migrations(), app.clock)
    assert [(m.plugin, m.version) for m in applied] == [("tasks", 6)]
    shown = await work.call("GET", f"/tasks/{old['id']}", expect=200)
    assert (shown["source"], shown["links"]) == (None, [])
    made = await work.call(
        "POST", "/tasks", json={"project": work.project, "title": "t", "source": BEADS}, expect=201
    )
    await work.call(
        "POST",
        "/tasks",
        json={"project": work.project, "title": "t", "source": BEADS},
        expect=409,
        problem="task-source-taken",
    )
    assert made["source"] == BEADS


async def test_concurrent_creates_from_one_source_record_make_one_task(work) -> None:
    """Each create checks that the record is not taken before it writes;
    the unique index is what holds when several check at once, and the
    losers are told which task came from it."""
    body = {"project": work.project, "title": "raced", "source": BEADS}
    answers = await asyncio.gather(*(work.call("POST", "/tasks", json=body) for _ in range(6)))
    made = await work.rows(tasks, tasks.c.source_id == BEADS["id"])
    assert len(made) == 1
    assert sorted(a.get("type", "made").removeprefix(PROBLEM) for a in answers) == [
        "made",
        *["task-source-taken"] * 5,
    ], answers
    assert {a["task"] for a in answers if "task" in a} == {made[0]["public_id"]}
