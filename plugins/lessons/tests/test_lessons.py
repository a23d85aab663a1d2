"""Lessons over HTTP: publish, show, correct, supersede, vote, with their
rows and audit events, on both engines."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import sqlalchemy as sa
from buildmax_lessons.search import _nearest

from buildmax.fulltext import RANKED_MATCHES
from buildmax.pagination import encode_cursor

from .conftest import Lab


async def test_a_lesson_is_published_in_a_project_shown_and_audited(lab: Lab) -> None:
    made = await lab.lesson(
        "Migrations need a lock timeout",
        "Set lock_timeout before ALTER TABLE or the deploy hangs behind a long query.",
        project="main",
        kind="gotcha",
        applies_to={"task_kinds": ["code"], "paths": ["migrations/**"], "tags": ["db"]},
        sources=[{"type": "url", "url": "https://example.test/postmortem"}],
    )
    assert made["id"].startswith("ls_")
    assert made["collection"] == "project" and made["project_id"].startswith("pj_")
    assert made["revision"] == 1 and made["author_id"] == lab.agent.id
    assert made["usefulness"] == {"helpful": 0, "not_helpful": 0, "wrong": 0, "score": 0}
    shown = await lab.call("GET", f"/lessons/{made['id']}", lab.viewer, expect=200)
    assert shown == made
    (event,) = await lab.audit()
    assert (event["action"], event["target_id"], event["actor_id"]) == (
        "lesson.created",
        made["id"],
        lab.agent.id,
    )
    rows = await lab.rows()
    assert [r["title"] for r in rows["revisions"]] == ["Migrations need a lock timeout"]
    assert rows["lessons"][0]["tags"] == ",db," and rows["lessons"][0]["task_kinds"] == ",code,"


async def test_a_common_lesson_has_no_project(lab: Lab) -> None:
    made = await lab.lesson("Run the linter before pushing", kind="convention")
    assert (made["collection"], made["project_id"]) == ("common", None)


async def test_bad_lessons_are_refused_and_change_nothing(lab: Lab) -> None:
    bad = [
        ({"kind": "gotcha", "title": "", "text": "x"}, "validation-error"),
        ({"kind": "rumour", "title": "t", "text": "x"}, "validation-error"),
        ({"kind": "note", "title": "t", "text": "a\x02b"}, "validation-error"),
        ({"kind": "note", "title": "t", "text": "x" * 20_001}, "validation-error"),
        ({"kind": "note", "title": "t", "text": "x", "project": "nope"}, "not-found"),
        ({"kind": "note", "title": "t", "text": "x", "extra": 1}, "validation-error"),
        (
            {
                "kind": "note",
                "title": "t",
                "text": "x",
                "sources": [{"type": "task", "id": "tk_x"}],
            },
            "invalid-lesson-source",
        ),
        (
            {
                "kind": "note",
                "title": "t",
                "text": "x",
                "sources": [{"type": "url", "url": "ftp://x"}],
            },
            "validation-error",
        ),
        (
            {"kind": "note", "title": "t", "text": "x", "applies_to": {"paths": ["../etc"]}},
            "validation-error",
        ),
    ]
    for body, slug in bad:
        await lab.call("POST", "/lessons", lab.agent, json=body, problem=slug)
    await lab.call(
        "POST", "/lessons", lab.viewer, json={"kind": "note", "title": "t", "text": "x"}, expect=403
    )
    assert await lab.rows() == {"lessons": [], "revisions": [], "votes": []}
    assert await lab.audit() == []


async def test_a_correction_is_a_new_revision_against_the_current_one(lab: Lab) -> None:
    made = await lab.lesson("Cache keys", "Keys include the locale.", project="main")
    await lab.call(
        "POST", f"/lessons/{made['id']}/votes", lab.agent2, json={"vote": "wrong"}, expect=200
    )
    fixed = await lab.call(
        "POST",
        f"/lessons/{made['id']}/revisions",
        lab.agent2,
        json={"revision": 1, "reason": "the locale moved", "text": "Keys include the tenant."},
        expect=201,
    )
    assert (fixed["revision"], fixed["text"], fixed["title"]) == (
        2,
        "Keys include the tenant.",
        "Cache keys",
    )
    assert fixed["revised_by"] == lab.agent2.id and fixed["author_id"] == lab.agent.id
    assert fixed["usefulness"]["wrong"] == 0, "votes start afresh on a new revision"
    await lab.call(
        "POST",
        f"/lessons/{made['id']}/revisions",
        json={"revision": 1, "reason": "late", "text": "Keys include nothing."},
        problem="lesson-changed",
    )
    page = await lab.call("GET", f"/lessons/{made['id']}/revisions", lab.viewer, expect=200)
    assert [(r["number"], r["reason"]) for r in page["items"]] == [(2, "the locale moved"), (1, "")]
    assert [e["action"] for e in await lab.audit()] == [
        "lesson.created",
        "lesson.voted",
        "lesson.corrected",
    ]
    assert [h["id"] for h in await lab.search(q="tenant")] == [made["id"]]
    assert await lab.search(q="locale") == []


async def test_a_superseded_lesson_is_hidden_by_default_and_reachable_by_link(lab: Lab) -> None:
    old = await lab.lesson("Deploy with make release", "make release builds the image")
    new = await lab.lesson(
        "Deploy with the release workflow", "the release workflow builds the image"
    )
    shown = await lab.call(
        "POST",
        f"/lessons/{old['id']}/supersede",
        json={"by": new["id"], "reason": "moved"},
        expect=200,
    )
    assert shown["superseded_by"] == new["id"]
    assert [h["id"] for h in await lab.search(q="image")] == [new["id"]]
    assert {h["id"] for h in await lab.search(q="image", superseded="include")} == {
        old["id"],
        new["id"],
    }
    assert [h["id"] for h in await lab.search()] == [new["id"]]
    replacement = await lab.call("GET", f"/lessons/{new['id']}", expect=200)
    assert replacement["supersedes"] == [old["id"]]
    still = await lab.call("GET", f"/lessons/{old['id']}", lab.viewer, expect=200)
    assert still["superseded_by"] == new["id"]
    await lab.call(
        "POST",
        f"/lessons/{new['id']}/supersede",
        json={"by": old["id"]},
        problem="lesson-superseded",
    )
    await lab.call(
        "POST",
        f"/lessons/{old['id']}/revisions",
        json={"revision": 1, "reason": "x", "text": "y"},
        problem="lesson-superseded",
    )


async def test_one_vote_per_principal_and_revision(lab: Lab) -> None:
    made = await lab.lesson("Use the fixture", "use the fixture")
    path = f"/lessons/{made['id']}/votes"
    first = await lab.call("POST", path, lab.agent2, json={"vote": "helpful"}, expect=200)
    assert first["usefulness"] == {"helpful": 1, "not_helpful": 0, "wrong": 0, "score": 1}
    again = await lab.call("POST", path, lab.agent2, json={"vote": "helpful"}, expect=200)
    assert again["usefulness"]["helpful"] == 1
    changed = await lab.call("POST", path, lab.agent2, json={"vote": "wrong"}, expect=200)
    assert changed["usefulness"] == {"helpful": 0, "not_helpful": 0, "wrong": 1, "score": -2}
    await lab.call("POST", path, lab.owner, json={"vote": "not_helpful"}, expect=200)
    await lab.call("POST", path, lab.viewer, json={"vote": "helpful"}, expect=403)
    await lab.call(
        "POST", path, lab.owner, json={"vote": "helpful", "revision": 2}, problem="lesson-changed"
    )
    votes = await lab.call("GET", path, lab.viewer, expect=200)
    assert sorted((v["principal_id"], v["vote"]) for v in votes["items"]) == sorted(
        [(lab.agent2.id, "wrong"), (lab.owner.id, "not_helpful")]
    )
    assert len((await lab.rows())["votes"]) == 2
    assert [e["action"] for e in await lab.audit("lesson.voted")] == ["lesson.voted"] * 3


async def test_paths_are_globs_of_folders_and_a_path_filtered_list_fills_its_pages(
    lab: Lab,
) -> None:
    src = await lab.lesson("Source rule", applies_to={"paths": ["src/*.py"]})
    deep = await lab.lesson("Deep rule", applies_to={"paths": ["src/**"]})
    folder = await lab.lesson("Folder rule", applies_to={"paths": ["src/auth"]})
    for n in range(5):
        await lab.lesson(f"Docs rule {n}", applies_to={"paths": ["docs/*/*.md"]})
    everywhere = await lab.lesson("No paths")

    def titles(items: list[dict[str, Any]]) -> set[str]:
        return {i["title"] for i in items}

    assert titles(await lab.search(path="src/a.py")) == {"Source rule", "Deep rule", "No paths"}
    assert titles(await lab.search(path="src/auth/login.py")) == {
        "Deep rule",
        "Folder rule",
        "No paths",
    }
    assert len(await lab.search(path="docs/api/x.md")) == 6
    assert titles(await lab.search(path="docs/x.md")) == {"No paths"}
    # The newest five do not apply to src/a.py: a page of two still has two.
    page = await lab.call("GET", "/lessons?path=src/a.py&limit=2", expect=200)
    assert [i["id"] for i in page["items"]] == [everywhere["id"], deep["id"]]
    rest = await lab.call(
        "GET", f"/lessons?path=src/a.py&limit=2&cursor={page['next_cursor']}", expect=200
    )
    assert [i["id"] for i in rest["items"]] == [src["id"]]
    assert rest["next_cursor"] is None
    assert folder["id"] not in {i["id"] for i in page["items"] + rest["items"]}


async def test_relevance_is_measured_against_the_best_lesson_shown(lab: Lab) -> None:
    await lab.lesson("Tombstone " * 19, "tombstone " * 200, project="main")
    twice = await lab.lesson("Compaction", "tombstone tombstone and other words", project="web")
    once = await lab.lesson("Compaction later", "tombstone and other words here", project="web")
    found = await lab.search(q="tombstone", project="web", common="exclude")
    assert [f["id"] for f in found] == [twice["id"], once["id"]]
    assert found[0]["match"]["relevance"] == 1.0


async def test_relevance_is_measured_against_the_best_lesson_a_path_admits(lab: Lab) -> None:
    """The path filter is read after SQL: the best lesson it leaves out
    sets no scale for those it keeps."""
    await lab.lesson("Tombstone " * 19, "tombstone " * 200, applies_to={"paths": ["docs/**"]})
    twice = await lab.lesson("Compaction", "tombstone tombstone and other words")
    once = await lab.lesson("Compaction later", "tombstone and other words here")
    found = await lab.search(q="tombstone", path="src/a.py")
    assert [f["id"] for f in found] == [twice["id"], once["id"]]
    assert found[0]["match"]["relevance"] == 1.0 > found[1]["match"]["relevance"]
    assert await lab.search(q="tombstone", path="src/a.py", kind="decision") == []


async def test_a_search_cursor_the_server_did_not_issue_is_refused(lab: Lab) -> None:
    for n in range(3):
        await lab.lesson(f"Rotate the keys {n}", "rotate them")
    for query in ({}, {"path": "src/a.py"}):
        page = await lab.call("GET", "/lessons?" + urlencode({"q": "rotate", "limit": 2, **query}))
        assert len(page["items"]) == 2 and page["next_cursor"]
        rest = await lab.call(
            "GET",
            "/lessons?"
            + urlencode({"q": "rotate", "limit": 2, "cursor": page["next_cursor"], **query}),
        )
        assert len(rest["items"]) == 1 and rest["next_cursor"] is None
        for forged in ([-3], [RANKED_MATCHES], [10**9], ["x"]):
            cursor = encode_cursor(forged)
            await lab.call(
                "GET",
                "/lessons?" + urlencode({"q": "rotate", "cursor": cursor, **query}),
                expect=400,
                problem="bad-cursor",
            )


async def test_relevance_steps_round_a_half_up_on_both_engines(lab: Lab) -> None:
    """PostgreSQL's round() of a float takes 2.5 to 2, SQLite's to 3: the
    step of a relevance exactly between two is the same on both."""
    async with lab.app.db.read() as conn:
        steps = [
            await conn.fetch_val(sa.select(_nearest(sa.cast(value, sa.Float), conn.dialect)))
            for value in (2.5, 3.5, 0.49, 0.0, 19.99)
        ]
    assert [int(step) for step in steps] == [3, 4, 0, 0, 20]
