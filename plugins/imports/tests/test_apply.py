"""A file previewed and applied through the API, chunk by chunk: tasks made
through the tasks plugin with their source, prerequisites, links, holds and
closed states; chunks in order, each once; a stale preview refused; a
re-import changing nothing; a newer export updating only what changed."""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_audit.tables import events as audit_events
from buildmax_hookspecs import TaskQueue
from buildmax_imports.tables import chunks, imports, mappings
from buildmax_tasks.tables import dependencies, holds, task_revisions, tasks

from buildmax.spaces import put_member
from buildmax.testing import PrincipalHandle, call

BASE = {"created_at": "2026-01-02T03:04:05Z"}


def export(*issues: dict[str, Any]) -> bytes:
    return "".join(json.dumps({**BASE, **issue}) + "\n" for issue in issues).encode()


def issue(number: int, **fields: Any) -> dict[str, Any]:
    return {"id": f"bd-{number}", "title": f"Issue {number}", "status": "open", **fields}


def blocks(*numbers: int) -> list[dict[str, str]]:
    return [{"depends_on_id": f"bd-{n}", "type": "blocks"} for n in numbers]


class Desk:
    """A space with a project, its owner, a member and a viewer."""

    def __init__(self, app: Any, client: Any, space: Any, owner: PrincipalHandle) -> None:
        self.app, self.client, self.space, self.owner = app, client, space, owner
        self.base = f"/v1/spaces/{space.id}"

    async def call(self, method: str, path: str, who: Any = None, **options: Any) -> Any:
        return await call(self.client, method, self.base + path, who or self.owner, **options)

    async def preview(self, data: bytes, expect: int = 201, **query: Any) -> Any:
        """Preview ``data``; the preview with its items (``GET /imports/{id}``)."""
        params = {"format": "beads", "project": "main", **query}
        text = "&".join(f"{k}={v}" for k, v in params.items())
        made = await self.call("POST", f"/imports?{text}", data=data, expect=expect)
        if expect != 201:
            return made
        assert "items" not in made
        shown = await self.call("GET", f"/imports/{made['id']}", expect=200)
        assert {k: v for k, v in shown.items() if k != "items"} == made
        return shown

    async def apply(self, preview: dict[str, Any], number: int, **options: Any) -> Any:
        return await self.call(
            "POST",
            f"/imports/{preview['id']}/chunks/{number}",
            json={"identity": preview["identity"]},
            **options,
        )

    async def apply_all(self, preview: dict[str, Any]) -> list[Any]:
        return [
            await self.apply(preview, number, expect=200)
            for number in range(1, len(preview["chunks"]) + 1)
        ]

    async def rows(self, table: sa.Table, *where: Any) -> list[dict[str, Any]]:
        async with self.app.db.read(background=True) as conn:
            return [dict(r) for r in await conn.fetch_all(sa.select(table).where(*where))]

    async def tasks_by_source(self) -> dict[str, dict[str, Any]]:
        rows = await self.rows(tasks, tasks.c.space_id == self.space.pk)
        return {row["source_id"]: row for row in rows if row["source_id"]}

    async def state(self) -> dict[str, Any]:
        """What the space's tasks say: by source id, their content, state,
        prerequisites (by source id), links and holds."""
        found = await self.tasks_by_source()
        by_pk = {row["id"]: key for key, row in found.items()}
        by_public = {row["public_id"]: key for key, row in found.items()}
        edges = await self.rows(dependencies)
        held = {
            row["scope_pk"]
            for row in await self.rows(holds, holds.c.lifted_at.is_(None))
            if row["scope_type"] == "task"
        }
        shown = {}
        for key, row in found.items():
            task = await self.call("GET", f"/tasks/{row['public_id']}", expect=200)
            shown[key] = {
                "title": task["title"],
                "body": task["body"],
                "state": task["state"],
                "priority": task["priority"],
                "labels": task["labels"],
                "revision": task["revision"],
                "prerequisites": sorted(
                    by_pk[e["prerequisite_id"]] for e in edges if e["task_id"] == row["id"]
                ),
                "links": sorted((link["kind"], by_public[link["task"]]) for link in task["links"]),
                "held": row["id"] in held,
            }
        return shown


@pytest.fixture
async def desk(app, client, make_principal, make_space) -> Desk:
    owner = await make_principal("human")
    space = await make_space(owner)
    made = Desk(app, client, space, owner)
    await made.call("POST", "/projects", json={"name": "main"}, expect=201)
    return made


SMALL = export(
    issue(1, priority=0, labels=["ui"], issue_type="bug"),
    issue(2, status="closed", close_reason="fixed upstream", dependencies=blocks(1)),
    issue(3, status="in_progress", dependencies=blocks(1, 2)),
    issue(
        4,
        dependencies=[*blocks(3), {"depends_on_id": "bd-1", "type": "parent-child"}],
        description="Body.",
        acceptance_criteria="It works.",
    ),
    issue(5, dependencies=[{"depends_on_id": "bd-99", "type": "related"}]),
)


async def test_a_preview_says_what_would_happen_and_changes_no_task(desk: Desk) -> None:
    preview = await desk.preview(SMALL, chunk_size=2)
    assert preview["counts"] == {
        "records": 5,
        "create": 5,
        "update": 0,
        "unchanged": 0,
        "conflict": 0,
        "problems": 0,
        "refused": 1,
    }
    assert [c["records"] for c in preview["chunks"]] == [2, 2, 1]
    assert preview["refused"] == [
        {
            "source_id": "bd-5",
            "kind": "related",
            "target": "bd-99",
            "reason": "no such record in the file or imported before: a broken link",
        }
    ]
    items = {item["source_id"]: item for item in preview["items"]}
    assert items["bd-3"]["state"] == "held" and items["bd-3"]["state_reason"]
    assert items["bd-4"]["prerequisites"] == ["bd-3"]
    assert items["bd-4"]["links"] == [{"kind": "parent", "target": "bd-1"}]
    assert await desk.tasks_by_source() == {}
    assert await desk.rows(mappings) == []
    bare = await desk.call("GET", f"/imports/{preview['id']}?items=exclude", expect=200)
    assert "items" not in bare and bare["identity"] == preview["identity"]


async def test_chunks_apply_in_order_once_each(desk: Desk) -> None:
    preview = await desk.preview(SMALL, chunk_size=2)
    await desk.apply(preview, 2, expect=409, problem="import-chunk-out-of-order")
    assert await desk.tasks_by_source() == {}
    first = await desk.apply(preview, 1, expect=200)
    assert first["counts"]["create"] == 2
    again = await desk.apply(preview, 1, expect=200)
    assert again == {**first, "replayed": True}  # the kept report: applied once
    assert first["replayed"] is False
    assert len(await desk.tasks_by_source()) == 2
    await desk.apply(preview, 2, expect=200)
    await desk.apply(preview, 3, expect=200)
    await desk.apply(preview, 4, expect=404)
    state = await desk.state()
    assert state["bd-1"]["state"] == "ready" and state["bd-1"]["labels"] == ["type:bug", "ui"]
    assert state["bd-2"]["state"] == "done" and state["bd-2"]["prerequisites"] == ["bd-1"]
    assert state["bd-3"]["held"] and state["bd-3"]["prerequisites"] == ["bd-1", "bd-2"]
    assert state["bd-3"]["state"] == "open"  # bd-1 is not done
    assert state["bd-4"]["links"] == [("parent", "bd-1")]
    assert state["bd-4"]["body"] == "Body."
    row = (await desk.rows(imports))[0]
    assert row["state"] == "applied" and row["chunks_applied"] == 3
    assert len(await desk.rows(chunks)) == 3 and len(await desk.rows(mappings)) == 5


async def test_links_to_a_later_chunk_are_made_when_it_is_applied(desk: Desk) -> None:
    data = export(
        issue(1, dependencies=[{"depends_on_id": "bd-2", "type": "related"}]),
        issue(2),
    )
    preview = await desk.preview(data, chunk_size=1)
    await desk.apply_all(preview)
    state = await desk.state()
    assert state["bd-1"]["links"] == [("related", "bd-2")]


async def test_the_same_export_again_changes_nothing(desk: Desk) -> None:
    await desk.apply_all(await desk.preview(SMALL))
    before = await desk.state()
    audited = len(await desk.rows(audit_events))
    again = await desk.preview(SMALL)
    assert again["counts"]["unchanged"] == 5 and again["counts"]["create"] == 0
    reports = await desk.apply_all(again)
    assert all(item["changes"] == [] for item in reports[0]["items"])
    assert await desk.state() == before
    # Only the import's own events: the preview and its chunk.
    actions = [row["action"] for row in await desk.rows(audit_events)][audited:]
    assert actions == ["import.previewed", "import.chunk.applied"]


async def test_a_newer_export_updates_only_what_changed(desk: Desk) -> None:
    await desk.apply_all(await desk.preview(SMALL))
    before = await desk.state()
    newer = export(
        issue(1, priority=0, labels=["ui"], issue_type="bug", status="closed"),
        issue(2, status="open", close_reason="fixed upstream", dependencies=blocks(1)),
        issue(3, status="in_progress", dependencies=blocks(1, 2)),
        issue(
            4,
            title="Issue 4, renamed",
            dependencies=[*blocks(3), {"depends_on_id": "bd-1", "type": "parent-child"}],
            description="Body.",
            acceptance_criteria="It works.",
        ),
        issue(5, dependencies=[{"depends_on_id": "bd-99", "type": "related"}, *blocks(4)]),
        issue(6),
    )
    preview = await desk.preview(newer)
    actions = {item["source_id"]: item["action"] for item in preview["items"]}
    assert actions == {
        "bd-1": "update",
        "bd-2": "update",
        "bd-3": "unchanged",
        "bd-4": "update",
        "bd-5": "update",
        "bd-6": "create",
    }
    notes = {item["source_id"]: item["notes"] for item in preview["items"]}
    assert notes["bd-2"] and "stays closed" in notes["bd-2"][0]
    (report,) = await desk.apply_all(preview)
    entries = {entry["source_id"]: entry for entry in report["items"]}
    assert entries["bd-1"]["changes"] == ["closed"]
    assert any(
        "done here: it stays closed and is not revised" in n for n in entries["bd-2"]["notes"]
    )
    assert entries["bd-4"]["changes"] == ["revised"] and entries["bd-6"]["changes"] == ["created"]
    assert entries["bd-5"]["changes"] == ["prerequisites"]
    after = await desk.state()
    assert after["bd-1"]["state"] == "done"  # closed in the source, nobody held it
    assert after["bd-2"]["state"] == "done"  # never reopened
    assert after["bd-4"]["title"] == "Issue 4, renamed"
    assert after["bd-4"]["revision"] == before["bd-4"]["revision"] + 1
    for same in ("bd-2", "bd-3", "bd-5"):
        assert after[same]["revision"] == before[same]["revision"]
    assert after["bd-6"]["state"] == "ready"
    assert after["bd-5"]["prerequisites"] == ["bd-4"] and after["bd-5"]["state"] == "open"


async def test_a_task_edited_here_is_a_conflict_left_alone(desk: Desk) -> None:
    await desk.apply_all(await desk.preview(SMALL))
    mine = (await desk.tasks_by_source())["bd-1"]
    await desk.call(
        "PATCH",
        f"/tasks/{mine['public_id']}",
        json={"expected_revision": 1, "title": "Mine now"},
        expect=200,
    )
    newer = SMALL.replace(b'"Issue 1"', b'"Issue 1, theirs"')
    preview = await desk.preview(newer)
    (item,) = [i for i in preview["items"] if i["source_id"] == "bd-1"]
    assert item["action"] == "conflict" and item["notes"]
    await desk.apply_all(preview)
    assert (await desk.state())["bd-1"]["title"] == "Mine now"


async def test_a_preview_is_stale_once_what_it_assumed_moved(desk: Desk) -> None:
    await desk.apply_all(await desk.preview(SMALL))
    newer = SMALL.replace(b'"Issue 1"', b'"Issue 1, theirs"')
    preview = await desk.preview(newer)
    mine = (await desk.tasks_by_source())["bd-1"]
    await desk.call(
        "PATCH",
        f"/tasks/{mine['public_id']}",
        json={"expected_revision": 1, "title": "Mine now"},
        expect=200,
    )
    before = await desk.state()
    refused = await desk.apply(preview, 1, expect=409, problem="import-stale")
    assert refused["records"] == ["bd-1"]
    assert await desk.state() == before
    assert (await desk.rows(imports, imports.c.public_id == preview["id"]))[0][
        "chunks_applied"
    ] == 0
    wrong = {**preview, "identity": "0" * 64}
    await desk.apply(wrong, 1, expect=409, problem="import-stale")


async def test_a_file_of_another_format_is_refused_with_its_line(desk: Desk) -> None:
    refused = await desk.preview(b"id,title\n1,x\n", expect=422)
    assert refused["type"].endswith("import-file-refused") and refused["line"] == 1
    assert await desk.rows(imports) == []


async def test_another_space_cannot_be_imported_into(
    desk: Desk, make_principal, make_space
) -> None:
    stranger = await make_principal("human")
    await desk.call(
        "POST",
        "/imports?format=beads&project=main",
        stranger,
        data=SMALL,
        expect=404,
    )
    preview = await desk.preview(SMALL)
    await desk.call(
        "POST",
        f"/imports/{preview['id']}/chunks/1",
        stranger,
        json={"identity": preview["identity"]},
        expect=404,
    )
    await desk.call("GET", f"/imports/{preview['id']}", stranger, expect=404)
    # Named under a space of the stranger's own, the import is not found either.
    own = await make_space(stranger)
    await call(
        desk.client, "POST", f"/v1/spaces/{own.id}/projects", stranger, json={"name": "main"}
    )
    elsewhere = f"/v1/spaces/{own.id}/imports/{preview['id']}"
    await call(desk.client, "GET", elsewhere, stranger, expect=404)
    await call(
        desk.client,
        "POST",
        f"{elsewhere}/chunks/1",
        stranger,
        json={"identity": preview["identity"]},
        expect=404,
    )
    await call(desk.client, "GET", f"{elsewhere}/chunks/1", stranger, expect=404)
    viewer = await make_principal("human")
    async with desk.app.db.write() as tx:
        await put_member(tx, desk.space.pk, viewer.pk, "viewer", desk.app.clock.now_ms())
    await desk.call(
        "POST",
        f"/imports/{preview['id']}/chunks/1",
        viewer,
        json={"identity": preview["identity"]},
        expect=403,
    )
    assert await desk.tasks_by_source() == {}


async def test_imported_tasks_carry_their_source_in_the_api_and_audit(desk: Desk) -> None:
    await desk.apply_all(await desk.preview(SMALL))
    one = (await desk.tasks_by_source())["bd-1"]
    shown = await desk.call("GET", f"/tasks/{one['public_id']}", expect=200)
    assert shown["source"] == {"system": "beads", "id": "bd-1"}
    (created,) = await desk.rows(
        audit_events,
        audit_events.c.action == "task.created",
        audit_events.c.target_id == one["public_id"],
    )
    assert json.loads(created["details"])["source"] == "beads:bd-1"
    (applied,) = await desk.rows(audit_events, audit_events.c.action == "import.chunk.applied")
    assert json.loads(applied["details"])["create"] == 5


async def test_a_task_made_outside_an_import_naming_a_record_is_updated(desk: Desk) -> None:
    made = await desk.call(
        "POST",
        "/tasks",
        json={"project": "main", "title": "mine", "source": {"system": "beads", "id": "bd-4"}},
        expect=201,
    )
    preview = await desk.preview(SMALL)
    (item,) = [i for i in preview["items"] if i["source_id"] == "bd-4"]
    assert item["action"] == "update" and item["task_id"] == made["id"]
    assert "made outside an import" in item["notes"][0]
    await desk.apply_all(preview)
    found = await desk.tasks_by_source()
    assert found["bd-4"]["public_id"] == made["id"] and len(found) == 5
    assert (await desk.state())["bd-4"]["title"] == "Issue 4"
    again = await desk.preview(SMALL)
    assert again["counts"]["unchanged"] == 5


async def test_a_chunk_refused_part_way_leaves_nothing_of_it(desk: Desk) -> None:
    """bd-4's source identity is taken by a task made through the API after
    the preview: the chunk stops at bd-4, after bd-1 to bd-3 were written in
    its transaction, and none of them is left."""
    preview = await desk.preview(SMALL, chunk_size=5)
    taken = await desk.call(
        "POST",
        "/tasks",
        json={"project": "main", "title": "mine", "source": {"system": "beads", "id": "bd-4"}},
        expect=201,
    )
    before = len(await desk.rows(audit_events))
    refused = await desk.apply(preview, 1, expect=409, problem="import-stale")
    assert refused["records"] == ["bd-4"]
    assert set(await desk.tasks_by_source()) == {"bd-4"}
    assert (await desk.tasks_by_source())["bd-4"]["public_id"] == taken["id"]
    assert await desk.rows(mappings) == [] and await desk.rows(chunks) == []
    (row,) = await desk.rows(imports)
    assert row["chunks_applied"] == 0 and row["state"] == "previewed"
    assert len(await desk.rows(audit_events)) == before


async def test_a_chunk_of_another_preview_is_refused(desk: Desk) -> None:
    preview = await desk.preview(SMALL)
    wrong = {**preview, "identity": "0" * 64}
    refused = await desk.apply(wrong, 1, expect=409, problem="import-stale")
    assert refused["identity"] == preview["identity"]
    assert await desk.tasks_by_source() == {} and await desk.rows(chunks) == []


async def test_a_link_to_a_record_later_in_the_same_chunk_is_made(desk: Desk) -> None:
    data = export(
        issue(1, dependencies=[{"depends_on_id": "bd-2", "type": "related"}]),
        issue(2),
    )
    (report,) = await desk.apply_all(await desk.preview(data))
    state = await desk.state()
    assert state["bd-1"]["links"] == [("related", "bd-2")]
    assert report["relinked"] == [(await desk.tasks_by_source())["bd-1"]["public_id"]]


async def test_a_link_broken_before_is_made_once_its_record_is_imported(desk: Desk) -> None:
    first = export(
        issue(1, dependencies=[*blocks(9), {"depends_on_id": "bd-8", "type": "related"}])
    )
    preview = await desk.preview(first)
    assert preview["counts"]["refused"] == 2
    await desk.apply_all(preview)
    # bd-8 and bd-9 arrive in a file of their own; bd-1, unchanged, in the next.
    await desk.apply_all(await desk.preview(export(issue(8), issue(9))))
    again = await desk.preview(first)
    (item,) = again["items"]
    assert item["action"] == "update" and again["refused"] == []
    await desk.apply_all(again)
    state = await desk.state()
    assert state["bd-1"]["prerequisites"] == ["bd-9"] and state["bd-1"]["state"] == "open"
    assert state["bd-1"]["links"] == [("related", "bd-8")]
    assert (await desk.preview(first))["counts"]["unchanged"] == 1


async def test_an_update_adds_and_never_removes_links_made_here(desk: Desk) -> None:
    await desk.apply_all(await desk.preview(SMALL))
    found = await desk.tasks_by_source()
    one, two = found["bd-1"]["public_id"], found["bd-2"]["public_id"]
    await desk.call(
        "PUT", f"/tasks/{one}/links", json={"links": [{"kind": "related", "task": two}]}, expect=200
    )
    renamed = SMALL.replace(b'"Issue 1"', b'"Issue 1, renamed"')
    await desk.apply_all(await desk.preview(renamed))
    state = await desk.state()
    assert state["bd-1"]["title"] == "Issue 1, renamed"
    assert state["bd-1"]["links"] == [("related", "bd-2")]


async def test_work_started_in_the_source_is_held_and_a_claimed_task_waits(desk: Desk) -> None:
    await desk.apply_all(await desk.preview(SMALL))
    found = await desk.tasks_by_source()
    # bd-1 is claimed here; bd-5 goes in progress in the source; bd-1 is renamed there.
    claim = await desk.call(
        "POST", f"/tasks/{found['bd-1']['public_id']}/claim", json={}, expect=201
    )
    newer = SMALL.replace(b'"Issue 1"', b'"Issue 1, renamed"').replace(
        b'"id": "bd-5", "title": "Issue 5", "status": "open"',
        b'"id": "bd-5", "title": "Issue 5", "status": "in_progress"',
    )
    (report,) = await desk.apply_all(await desk.preview(newer))
    entries = {entry["source_id"]: entry for entry in report["items"]}
    assert entries["bd-5"]["changes"] == ["held"]
    assert entries["bd-1"]["changes"] == [] and "someone holds it" in entries["bd-1"]["notes"][-1]
    state = await desk.state()
    assert state["bd-5"]["held"] and state["bd-1"]["title"] == "Issue 1"
    # Not applied yet, so the next import of the same file tries again.
    again = await desk.preview(newer)
    actions = {item["source_id"]: item["action"] for item in again["items"]}
    assert actions["bd-1"] == "update" and actions["bd-5"] == "unchanged"
    await desk.call(
        "POST",
        f"/attempts/{claim['attempt']['id']}/release",
        claim["token"],
        json={"generation": claim["attempt"]["generation"], "reason": "later"},
        expect=200,
    )
    await desk.apply_all(await desk.preview(newer))
    assert (await desk.state())["bd-1"]["title"] == "Issue 1, renamed"


async def test_a_link_to_a_record_an_earlier_import_made_is_kept(desk: Desk) -> None:
    await desk.apply_all(await desk.preview(export(issue(1))))
    preview = await desk.preview(export(issue(2, dependencies=blocks(1))))
    assert preview["refused"] == [] and preview["items"][0]["prerequisites"] == ["bd-1"]
    await desk.apply_all(preview)
    assert (await desk.state())["bd-2"]["prerequisites"] == ["bd-1"]


async def test_an_admin_outside_the_space_is_audited_as_an_override(
    desk: Desk, make_principal
) -> None:
    admin = await make_principal("human", system_role="admin")
    preview = await desk.preview(SMALL)
    await desk.call(
        "POST",
        f"/imports/{preview['id']}/chunks/1",
        admin,
        json={"identity": preview["identity"]},
        expect=200,
    )
    rows = await desk.rows(audit_events, audit_events.c.actor_id == admin.id)
    assert {row["action"] for row in rows} >= {"import.chunk.applied", "task.created"}
    assert all(row["admin_override"] for row in rows)


async def test_an_edit_landing_after_the_staleness_check_refuses_the_chunk(
    desk: Desk, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The staleness check reads without a lock: an edit committing right
    after it (PostgreSQL runs both at once) is caught when the task's row is
    locked, by its revision, and the chunk is refused whole."""
    from buildmax_imports import importing

    await desk.apply_all(await desk.preview(SMALL))
    theirs = SMALL.replace(b'"Issue 1"', b'"Issue 1, theirs"').replace(
        b'"Issue 4"', b'"Issue 4, theirs"'
    )
    preview = await desk.preview(theirs)
    checked = importing._check_unmoved

    async def then_edited(job: Any, system: str, items: Any) -> Any:
        known = await checked(job, system, items)
        row = await job.tx.fetch_one(sa.select(tasks).where(tasks.c.source_id == "bd-4"))
        await job.tx.execute(
            task_revisions.insert().values(
                task_id=row["id"],
                number=row["revision"] + 1,
                title="Mine now",
                body="",
                criteria="",
                created_at=row["created_at"],
                created_by=row["created_by"],
            )
        )
        await job.tx.execute(
            sa.update(tasks)
            .where(tasks.c.id == row["id"])
            .values(revision=row["revision"] + 1, title="Mine now")
        )
        return known

    monkeypatch.setattr(importing, "_check_unmoved", then_edited)
    refused = await desk.apply(preview, 1, expect=409, problem="revision-conflict")
    assert refused["source_id"] == "bd-4" and refused["detail"].startswith("record bd-4 (line 4): ")
    # bd-1 was revised in the chunk's transaction before bd-4 refused it: gone with it.
    state = await desk.state()
    assert state["bd-1"]["title"] == "Issue 1" and state["bd-1"]["revision"] == 1
    assert state["bd-4"]["title"] == "Issue 4"
    assert len(await desk.rows(chunks)) == 1
    # The tasks plugin forgot the change of the transaction that rolled back.
    assert desk.app.services.get(TaskQueue)._imports == {}


@pytest.mark.parametrize(
    ("format_", "data"),
    [("github", b"[]"), ("csv", b"id,title\n"), ("beads", b'{"id": "bd-1"}\n')],
)
async def test_a_file_with_no_record_to_import_is_refused(
    desk: Desk, format_: str, data: bytes
) -> None:
    refused = await desk.preview(data, expect=422, format=format_)
    assert refused["type"].endswith("import-file-refused")
    assert refused["detail"].startswith("the file holds no record to import")
    if format_ == "beads":
        assert refused["problems"][0]["line"] == 1
    assert await desk.rows(imports) == []


async def test_an_import_whose_file_is_gone_is_410_not_a_crash(desk: Desk) -> None:
    from buildmax_imports import importing

    from buildmax.app import blob_store

    preview = await desk.preview(SMALL)
    (row,) = await desk.rows(imports)
    assert await blob_store(desk.app).delete(row["blob_key"])
    importing._plans.clear()  # another server process, or this one restarted
    await desk.call("GET", f"/imports/{preview['id']}", expect=410, problem="blob-missing")
    await desk.apply(preview, 1, expect=410, problem="blob-missing")
    assert await desk.tasks_by_source() == {}


async def test_the_list_shows_each_import_without_its_items(desk: Desk) -> None:
    first = await desk.preview(SMALL)
    second = await desk.preview(export(issue(7)))
    listed = await desk.call("GET", "/imports", expect=200)
    assert [item["id"] for item in listed["items"]] == [second["id"], first["id"]]
    assert all("items" not in item and "earlier" not in item for item in listed["items"])
    assert listed["items"][1]["counts"]["records"] == 5


@pytest.mark.parametrize("number", ["0", "01", "-1", "1.0", "x", "\u0661"])
async def test_a_chunk_that_is_no_number_of_the_import_is_404(desk: Desk, number: str) -> None:
    preview = await desk.preview(SMALL)
    await desk.apply(preview, number, expect=404, problem="not-found")  # type: ignore[arg-type]
    assert await desk.tasks_by_source() == {}


async def test_bad_lines_are_previewed_with_their_line_and_the_rest_imported(desk: Desk) -> None:
    data = (
        export(issue(1, comments=[{"text": "a field we do not keep"}]))
        + b'{"id": "bd-2", "title": \n'
        + export(issue(3, title="x" * 501), issue(1, title="again"))
        + b'{"id": "bd-5", "title": "caf\xe9"}\n'
        + export(issue(6))
    )
    preview = await desk.preview(data)
    assert [(p["line"], p["reason"]) for p in preview["problems"]] == [
        (2, "not JSON: Expecting value at column 25"),
        (3, "title is 501 characters (at most 500)"),
        (4, "id 'bd-1' again (first on line 1): left out"),
        (5, "not UTF-8 text: 0xe9 at byte 29 of the line"),
    ]
    items = {item["source_id"]: item for item in preview["items"]}
    assert sorted(items) == ["bd-1", "bd-6"]
    assert items["bd-1"]["warnings"] == ["fields not imported: comments"]
    await desk.apply_all(preview)
    assert sorted(await desk.tasks_by_source()) == ["bd-1", "bd-6"]


async def test_an_import_without_its_items_is_shown_without_its_file(desk: Desk) -> None:
    from buildmax_imports import importing

    from buildmax.app import blob_store

    preview = await desk.preview(SMALL, chunk_size=2)
    await desk.apply(preview, 1, expect=200)
    (row,) = await desk.rows(imports)
    assert await blob_store(desk.app).delete(row["blob_key"])
    importing._plans.clear()
    bare = await desk.call("GET", f"/imports/{preview['id']}?items=exclude", expect=200)
    assert bare == {
        **{k: v for k, v in preview.items() if k not in ("items", "state", "updated_at")},
        "state": "applying",
        "updated_at": bare["updated_at"],
        "chunks_applied": 1,
        "chunks": [{**c, "applied": c["number"] == 1} for c in preview["chunks"]],
    }


async def _made_here(desk: Desk, number: int) -> dict[str, Any]:
    """A task made through the API naming beads record ``bd-<number>``."""
    return await desk.call(  # type: ignore[no-any-return]
        "POST",
        "/tasks",
        json={
            "project": "main",
            "title": f"made here {number}",
            "source": {"system": "beads", "id": f"bd-{number}"},
        },
        expect=201,
    )


async def test_edges_to_a_task_made_here_naming_a_record_are_kept(desk: Desk) -> None:
    nine = await _made_here(desk, 9)
    data = export(issue(1, dependencies=[*blocks(9), {"depends_on_id": "bd-9", "type": "related"}]))
    preview = await desk.preview(data)
    assert preview["refused"] == []
    await desk.apply_all(preview)
    (task,) = [t for t in (await desk.tasks_by_source()).values() if t["source_id"] == "bd-1"]
    shown = await desk.call("GET", f"/tasks/{task['public_id']}", expect=200)
    assert shown["links"] == [{"kind": "related", "task": nine["id"]}]
    waits = await desk.call("GET", f"/tasks/{task['public_id']}/dependencies", expect=200)
    assert [p["id"] for p in waits["prerequisites"]] == [nine["id"]]


async def test_a_held_task_made_here_waits_and_the_rest_is_linked(desk: Desk) -> None:
    one = await _made_here(desk, 1)
    await desk.call("POST", f"/tasks/{one['id']}/claim", json={}, expect=201)
    data = export(issue(1, dependencies=[{"depends_on_id": "bd-2", "type": "related"}]), issue(2))
    (report,) = await desk.apply_all(await desk.preview(data))
    entries = {entry["source_id"]: entry for entry in report["items"]}
    assert "someone holds it" in entries["bd-1"]["notes"][-1]
    assert entries["bd-2"]["changes"] == ["created"]


async def test_a_link_to_a_later_record_is_made_after_a_stop_and_a_new_preview(desk: Desk) -> None:
    data = export(issue(1, dependencies=[{"depends_on_id": "bd-2", "type": "related"}]), issue(2))
    await desk.apply(await desk.preview(data, chunk_size=1), 1, expect=200)
    # Stopped after chunk 1; the same file previewed again, and applied.
    again = await desk.preview(data, chunk_size=1)
    assert [item["action"] for item in again["items"]] == ["unchanged", "create"]
    await desk.apply_all(again)
    assert (await desk.state())["bd-1"]["links"] == [("related", "bd-2")]


async def test_what_a_person_took_away_an_update_does_not_bring_back(desk: Desk) -> None:
    data = export(
        issue(1),
        issue(
            2,
            status="in_progress",
            dependencies=[*blocks(1), {"depends_on_id": "bd-1", "type": "related"}],
        ),
    )
    await desk.apply_all(await desk.preview(data))
    found = await desk.tasks_by_source()
    two, one = found["bd-2"]["public_id"], found["bd-1"]["public_id"]
    # A person frees bd-2: no prerequisite, no link, no hold.
    await desk.call("DELETE", f"/tasks/{two}/dependencies/{one}", expect=204)
    await desk.call("PUT", f"/tasks/{two}/links", json={"links": []}, expect=200)
    (hold,) = await desk.rows(holds, holds.c.lifted_at.is_(None))
    await desk.call("POST", f"/holds/{hold['public_id']}/lift", json={}, expect=200)
    # The source renames bd-2 and adds a prerequisite: only that is applied.
    newer = export(
        issue(1),
        issue(3),
        issue(
            2,
            title="Issue 2, renamed",
            status="in_progress",
            dependencies=[
                *blocks(1, 3),
                {"depends_on_id": "bd-1", "type": "related"},
                {"depends_on_id": "bd-3", "type": "related"},
            ],
        ),
    )
    (report,) = await desk.apply_all(await desk.preview(newer))
    entries = {entry["source_id"]: entry for entry in report["items"]}
    assert entries["bd-2"]["changes"] == ["revised", "prerequisites", "links"]
    state = await desk.state()
    assert state["bd-2"]["title"] == "Issue 2, renamed"
    assert state["bd-2"]["prerequisites"] == ["bd-3"]
    assert state["bd-2"]["links"] == [("related", "bd-3")]
    assert not state["bd-2"]["held"]


async def test_the_queue_keeps_no_change_of_an_ended_transaction(desk: Desk) -> None:
    await desk.apply_all(await desk.preview(SMALL, chunk_size=2))
    assert desk.app.services.get(TaskQueue)._imports == {}
