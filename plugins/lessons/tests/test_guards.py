"""The guards an acceptance pass found unwatched or broken: concurrent
writes to one lesson, supersession across spaces and in a ring, the votes
of each revision, artifact sources, globs that would stall a search, and
offers that an oversized lesson would have emptied."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from buildmax_lessons.offers import glob_matches

from buildmax.spaces import put_member

from .conftest import Lab


async def test_two_lessons_superseding_each_other_at_once_make_no_ring(lab: Lab) -> None:
    for _ in range(5):
        a = await lab.lesson("A", "first")
        b = await lab.lesson("B", "second")
        answers = await asyncio.gather(
            lab.call("POST", f"/lessons/{a['id']}/supersede", json={"by": b["id"]}),
            lab.call("POST", f"/lessons/{b['id']}/supersede", json={"by": a["id"]}),
        )
        slugs = sorted(x.get("type", "ok").rsplit(":", 1)[-1] for x in answers)
        assert slugs == ["lesson-superseded", "ok"], answers
        shown = [await lab.call("GET", f"/lessons/{x['id']}", expect=200) for x in (a, b)]
        assert sorted(bool(x["superseded_by"]) for x in shown) == [False, True]


async def test_concurrent_corrections_and_votes_answer_409_never_404(lab: Lab) -> None:
    made = await lab.lesson("Cache keys", "keys include the locale")
    path = f"/lessons/{made['id']}"
    answers = await asyncio.gather(
        *(
            lab.call(
                "POST", f"{path}/revisions", json={"revision": 1, "reason": "r", "text": f"v{n}"}
            )
            for n in range(4)
        ),
        lab.call("POST", f"{path}/votes", lab.agent2, json={"vote": "helpful", "revision": 1}),
    )
    statuses = sorted(a.get("status", 200) if "type" in a else 201 for a in answers)
    assert 404 not in statuses, answers
    assert sum(1 for a in answers if a.get("revision") == 2 and "type" not in a) >= 1
    assert all(a.get("status") in (None, 409) for a in answers), answers


async def test_a_lesson_is_superseded_only_by_a_live_lesson_of_its_space_once(
    lab: Lab, make_space: Any
) -> None:
    old = await lab.lesson("Old way")
    new = await lab.lesson("New way")
    other = await make_space(lab.owner)
    async with lab.app.db.write() as tx:
        await put_member(tx, other.pk, lab.agent.pk, "member", lab.app.clock.now_ms())
    there = f"/v1/spaces/{other.id}"
    foreign = await lab.call(
        "POST", f"{there}/lessons", json={"kind": "note", "title": "t", "text": "x"}, expect=201
    )
    await lab.call(
        "POST",
        f"/lessons/{old['id']}/supersede",
        json={"by": foreign["id"]},
        problem="invalid-lesson-source",
    )
    await lab.call("POST", f"/lessons/{old['id']}/supersede", json={"by": new["id"]}, expect=200)
    again = await lab.call(
        "POST", f"/lessons/{old['id']}/supersede", json={"by": new["id"]}, expect=200
    )
    assert again["superseded_by"] == new["id"]
    third = await lab.lesson("Third way")
    await lab.call(
        "POST",
        f"/lessons/{old['id']}/supersede",
        json={"by": third["id"]},
        problem="lesson-superseded",
    )
    await lab.call(
        "POST", f"/lessons/{old['id']}/votes", json={"vote": "helpful"}, problem="lesson-superseded"
    )
    assert (await lab.call("GET", f"/lessons/{old['id']}", expect=200))["superseded_by"] == new[
        "id"
    ]


async def test_each_revision_keeps_its_own_votes(lab: Lab) -> None:
    made = await lab.lesson("Use the fixture", "use it")
    path = f"/lessons/{made['id']}"
    await lab.call("POST", f"{path}/votes", lab.agent2, json={"vote": "wrong"}, expect=200)
    await lab.call(
        "POST",
        f"{path}/revisions",
        json={"revision": 1, "reason": "r", "text": "use it well"},
        expect=201,
    )
    await lab.call("POST", f"{path}/votes", lab.agent2, json={"vote": "helpful"}, expect=200)
    votes = await lab.call("GET", f"{path}/votes", expect=200)
    assert [(v["revision"], v["vote"]) for v in votes["items"]] == [(2, "helpful"), (1, "wrong")]
    shown = await lab.call("GET", path, expect=200)
    assert shown["usefulness"] == {"helpful": 1, "not_helpful": 0, "wrong": 0, "score": 1}


async def test_a_correction_that_changes_nothing_is_refused(lab: Lab) -> None:
    made = await lab.lesson("Same", "same text")
    same = {"revision": 1, "reason": "no change", "title": "Same", "text": "same text"}
    await lab.call(
        "POST", f"/lessons/{made['id']}/revisions", json=same, problem="validation-error"
    )
    await lab.call(
        "POST",
        f"/lessons/{made['id']}/revisions",
        json={"revision": 1, "reason": "r"},
        problem="validation-error",
    )
    assert len((await lab.rows())["revisions"]) == 1


async def test_an_artifact_source_is_one_of_the_space(lab: Lab) -> None:
    task = await lab.call("POST", "/tasks", json={"project": "main", "title": "t"}, expect=201)
    claim = await lab.call("POST", f"/tasks/{task['id']}/claim", lab.agent, json={}, expect=201)
    artifact = await lab.call(
        "POST",
        "/artifacts?name=notes.txt",
        claim["token"],
        data=b"notes",
        content_type="text/plain",
        expect=201,
    )
    body = {"kind": "note", "title": "With evidence", "text": "see the notes"}
    await lab.call(
        "POST",
        "/lessons",
        json={**body, "sources": [{"type": "artifact", "id": "af_nope"}]},
        problem="invalid-lesson-source",
    )
    made = await lab.call(
        "POST",
        "/lessons",
        json={**body, "sources": [{"type": "artifact", "id": artifact["id"]}]},
        expect=201,
    )
    assert made["sources"] == [{"type": "artifact", "id": artifact["id"]}]


async def test_a_carried_lesson_names_at_most_twenty_sources_in_all(lab: Lab) -> None:
    task = await lab.call("POST", "/tasks", json={"project": "main", "title": "t"}, expect=201)
    claim = await lab.call("POST", f"/tasks/{task['id']}/claim", lab.agent, json={}, expect=201)
    urls = [{"type": "url", "url": f"https://example.test/{n}"} for n in range(18)]
    lesson = {"kind": "note", "title": "Many sources", "text": "x", "sources": urls}
    submit = f"/attempts/{claim['attempt']['id']}/submit"
    body = {"generation": 1, "summary": "s", "extensions": {"lessons": [lesson]}}
    await lab.call("POST", submit, lab.agent, json=body, expect=422)
    lesson["sources"] = urls[:17]
    await lab.call("POST", submit, lab.agent, json=body, expect=201)
    (made,) = await lab.search()
    assert len(made["sources"]) == 20


async def test_globs_that_would_backtrack_or_expand_are_matched_quickly_or_refused(
    lab: Lab,
) -> None:
    started = time.perf_counter()
    assert not glob_matches("a/" * 100 + "c", "**/a*/**/a*/**/a*/**/a*/**/a*/**/a*/b")
    assert not glob_matches("a" * 300, "*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b")
    assert time.perf_counter() - started < 1.0
    assert glob_matches("src/a/b.py", "src/**") and glob_matches("x/y.sql", "**/*.sql")
    assert not glob_matches("docs/g/x.md", "docs/*.md") and glob_matches("docs/x.md", "docs/*.md")
    for bomb in ["{a,b}{a,b}{a,b}{a,b}", "a/" * 32 + "b"]:
        await lab.call(
            "POST",
            "/lessons",
            json={"kind": "note", "title": "t", "text": "x", "applies_to": {"paths": [bomb]}},
            problem="validation-error",
        )
    await lab.lesson("Deep", applies_to={"paths": ["**/a*/**/a*/**/a*/**/a*/**/a*/**/a*/b"]})
    page = await lab.call("GET", "/lessons?path=" + "a/" * 100 + "c", expect=200)
    assert page["items"] == []


async def test_an_oversized_lesson_leaves_room_for_shorter_ones(lab: Lab) -> None:
    for n in range(3):
        await lab.lesson(f"Small {n}", "short and useful", project="main")
    await lab.lesson("Escapes", "\\" * 9000 + " tail", project="main", applies_to={"tags": ["win"]})
    task = await lab.call(
        "POST", "/tasks", json={"project": "main", "title": "t", "labels": ["win"]}, expect=201
    )
    offered = (
        await lab.call("POST", f"/tasks/{task['id']}/claim", lab.agent, json={}, expect=201)
    )["attempt"]["run_environment"]["lessons"]
    titles = [o["title"] for o in offered]
    assert titles[0] == "Escapes" and offered[0]["truncated"] is True
    assert {"Small 0", "Small 1", "Small 2"} <= set(titles)
