"""Lessons in the work loop: carried in by a submission (committed with it
or not at all) and offered by the next claim of a task they apply to."""

from __future__ import annotations

import json
from typing import Any

import pytest

from buildmax.config import Config
from buildmax.testing.statements import watching_statements

from .conftest import Lab


@pytest.fixture
def buildmax_settings(buildmax_settings: Config) -> Config:
    """Every pooled connection open from the start, so each is watched."""
    return buildmax_settings.replace(pg_pool_min=4, pg_pool_max=4)


CARRIED = [
    {
        "kind": "gotcha",
        "title": "Retry flaky migrations",
        "text": "The migration runner times out on a cold database: retry once before failing.",
        "applies_to": {"tags": ["db"]},
    },
    {
        "kind": "convention",
        "title": "Name branches after the task",
        "text": "Branches are named after the task id so reviews find them.",
        "common": True,
    },
]


async def _task(lab: Lab, title: str, project: str = "main", **fields: Any) -> dict[str, Any]:
    body = {"project": project, "title": title, **fields}
    return await lab.call("POST", "/tasks", json=body, expect=201)  # type: ignore[no-any-return]


async def _claim(lab: Lab, task: dict[str, Any]) -> dict[str, Any]:
    path = f"/tasks/{task['id']}/claim"
    return await lab.call("POST", path, lab.agent, json={}, expect=201)  # type: ignore[no-any-return]


async def _submit(lab: Lab, claim: dict[str, Any], expect: int, **body: Any) -> Any:
    attempt = claim["attempt"]
    sent = {"generation": attempt["generation"], "summary": "done", **body}
    return await lab.call(
        "POST", f"/attempts/{attempt['id']}/submit", lab.agent, json=sent, expect=expect
    )


async def test_a_submission_commits_its_two_lessons_and_the_next_claim_offers_them(
    lab: Lab,
) -> None:
    first = await _task(lab, "migrate the schema")
    claim = await _claim(lab, first)
    assert "lessons" not in claim["attempt"]["run_environment"]
    handed = await _submit(lab, claim, 201, extensions={"lessons": CARRIED})
    submission = handed["submission"]["id"]

    found = await lab.search()
    assert {f["title"] for f in found} == {c["title"] for c in CARRIED}
    by_title = {f["title"]: f for f in found}
    project_one = by_title["Retry flaky migrations"]
    assert project_one["project_id"] == claim["task"]["project_id"]
    assert by_title["Name branches after the task"]["collection"] == "common"
    own = [
        {"type": "task", "id": first["id"]},
        {"type": "attempt", "id": claim["attempt"]["id"]},
        {"type": "submission", "id": submission},
    ]
    assert all(f["sources"] == own for f in found)
    assert all(f["author_id"] == lab.agent.id for f in found)
    events = await lab.audit()
    assert [(e["action"], e["actor_id"]) for e in events] == [("lesson.created", lab.agent.id)] * 2
    assert all(f'"submission_id":"{submission}"' in e["details"] for e in events)

    # The next claim in the project offers both: the one tagged with a
    # label of the task first.
    second = await _task(lab, "add a column", labels=["db"])
    offered = (await _claim(lab, second))["attempt"]["run_environment"]["lessons"]
    assert [o["title"] for o in offered] == [
        "Retry flaky migrations",
        "Name branches after the task",
    ]
    assert offered[0]["text"] == CARRIED[0]["text"] and offered[0]["revision"] == 1
    shown = await lab.call("GET", f"/attempts/{claim['attempt']['id']}", lab.agent, expect=200)
    assert "lessons" not in shown["run_environment"]

    # A task of another project is offered the common one only; a task
    # without the tag is not offered the tagged one.
    elsewhere = await _task(lab, "style the page", project="web")
    offered = (await _claim(lab, elsewhere))["attempt"]["run_environment"]["lessons"]
    assert [o["title"] for o in offered] == ["Name branches after the task"]
    untagged = await _task(lab, "rename a file")
    offered = (await _claim(lab, untagged))["attempt"]["run_environment"]["lessons"]
    assert [o["title"] for o in offered] == ["Name branches after the task"]


async def test_a_refused_submission_commits_none_of_its_lessons(lab: Lab) -> None:
    task = await _task(lab, "migrate")
    claim = await _claim(lab, task)
    bad_source = {**CARRIED[0], "sources": [{"type": "artifact", "id": "af_not_handed_in"}]}
    refused = await _submit(lab, claim, 422, extensions={"lessons": [CARRIED[1], bad_source]})
    assert refused["type"].endswith("submission-refused")
    invalid = await _submit(lab, claim, 422, extensions={"lessons": [CARRIED[1], {"kind": "x"}]})
    assert "lessons" in invalid["detail"]
    with_project = {**CARRIED[0], "project": "web"}
    await _submit(lab, claim, 422, extensions={"lessons": [with_project]})
    await _submit(lab, claim, 422, extensions={"lessons": [CARRIED[1]] * 6})
    stale = {"generation": claim["attempt"]["generation"] + 1}
    await _submit(lab, claim, 409, extensions={"lessons": CARRIED}, **stale)
    assert await lab.rows() == {"lessons": [], "revisions": [], "votes": []}
    assert await lab.audit() == []
    # The attempt is still active: the same submission without the bad lesson goes through.
    await _submit(lab, claim, 201, extensions={"lessons": [CARRIED[1]]})
    assert [f["title"] for f in await lab.search()] == [CARRIED[1]["title"]]


async def test_a_lesson_applies_by_task_kind_and_the_superseded_are_not_offered(lab: Lab) -> None:
    await lab.lesson(
        "Review with the checklist", kind="convention", applies_to={"task_kinds": ["review"]}
    )
    old = await lab.lesson("Use make test", project="main")
    new = await lab.lesson("Use tox", project="main")
    await lab.call("POST", f"/lessons/{old['id']}/supersede", json={"by": new["id"]}, expect=200)
    task = await _task(lab, "code something")
    offered = (await _claim(lab, task))["attempt"]["run_environment"]["lessons"]
    assert [o["title"] for o in offered] == ["Use tox"]


async def test_a_claim_offers_at_most_five_lessons_within_eight_kib(lab: Lab) -> None:
    for n in range(7):
        await lab.lesson(f"Long lesson {n}", "word " * 3000, project="main")
    task = await _task(lab, "anything")
    environment = (await _claim(lab, task))["attempt"]["run_environment"]
    offered = environment["lessons"]
    assert 1 <= len(offered) <= 5
    assert len(json.dumps(environment["lessons"], ensure_ascii=False).encode()) <= 8 * 1024
    assert offered[0]["truncated"] is True and offered[0]["text"].endswith("…")


async def test_a_claim_in_a_project_without_lessons_reads_no_lesson_after_the_first(
    lab: Lab,
) -> None:
    """This process remembers that the project has no lesson: the second
    claim sends no lesson statement; one made here is offered at once."""
    tasks = [await _task(lab, f"t{n}") for n in range(3)]
    await _claim(lab, tasks[0])
    async with watching_statements(lab.app) as log:
        await _claim(lab, tasks[1])
    assert not [s for s in log.statements if "lesson_" in s]
    await lab.lesson("Fresh lesson", project="main")
    async with watching_statements(lab.app) as log:
        offered = (await _claim(lab, tasks[2]))["attempt"]["run_environment"]["lessons"]
    assert [o["title"] for o in offered] == ["Fresh lesson"]
    assert [s for s in log.statements if "lesson_lessons" in s]
