"""Task search (``GET /tasks?q=``): a full-text index of each task's title
and current acceptance criteria, kept with every create and edit, ranked,
with marked snippets, scoped to the space, paged by an opaque cursor, and
rebuilt by ``buildmax task reindex``."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlencode

import pytest
import sqlalchemy as sa
from buildmax_tasks.commands.tasks import marked, task_group
from buildmax_tasks.search import TASK_SEARCH, create_index
from click.testing import CliRunner

from buildmax.fulltext import MARK_END, MARK_START, MAX_QUERY_CHARS
from buildmax.pagination import encode_cursor

from .conftest import PROBLEM, Work


async def search(work: Work, q: str, expect: int = 200, **filters: Any) -> Any:
    """``GET /tasks`` with ``q`` and ``filters`` as a viewer."""
    query = urlencode({"q": q, **filters})
    return await work.call("GET", f"/tasks?{query}", work.viewer, expect=expect)


async def found(work: Work, q: str, **filters: Any) -> list[str]:
    """The titles a search finds, in its order (every page)."""
    return [t["title"] for t in (await search(work, q, **filters))["items"]]


async def test_a_search_finds_stemmed_words_in_the_title(work):
    await work.task("Fix failing login tests")
    await work.task("Write the release notes")
    assert await found(work, "fail test") == ["Fix failing login tests"]
    assert await found(work, "LOGIN") == ["Fix failing login tests"]
    assert await found(work, "tests release") == []  # every word must match
    [item] = (await search(work, "failed"))["items"]
    assert f"{MARK_START}failing{MARK_END}" in item["match"]["snippet"]


async def test_a_search_finds_words_of_the_current_criteria(work):
    await work.task("Refactor the parser", criteria="Unicode escapes round-trip")
    await work.task("Parser docs", criteria="Explain the grammar")
    [item] = (await search(work, "unicode escape"))["items"]
    assert item["title"] == "Refactor the parser"
    assert f"{MARK_START}Unicode{MARK_END}" in item["match"]["snippet"]
    assert await found(work, "grammar") == ["Parser docs"]


async def test_a_phrase_keeps_its_word_order(work):
    await work.task("Fix the login form tests")
    await work.task("Tests of the form login")
    assert await found(work, '"login form"') == ["Fix the login form tests"]
    assert await found(work, '"form login"') == ["Tests of the form login"]
    assert len(await found(work, "form login")) == 2


async def test_a_search_combines_with_every_other_filter(work):
    await work.call("POST", "/projects", json={"name": "side"}, expect=201)
    await work.task("cache one", labels=["web"], priority=5)
    claimed = await work.task("cache two", priority=5)
    await work.claim(claimed["id"])
    await work.task("cache three", kind="general")
    await work.task("cache four", project="side", priority=-5)
    await work.task("nothing else", labels=["web"])
    assert await found(work, "cache") == ["cache four", "cache three", "cache two", "cache one"]
    assert await found(work, "cache", state="claimed") == ["cache two"]
    assert await found(work, "cache", kind="general") == ["cache three"]
    assert await found(work, "cache", label="web") == ["cache one"]
    assert await found(work, "cache", project="side") == ["cache four"]
    assert await found(work, "cache", min_priority="1") == ["cache two", "cache one"]
    assert await found(work, "cache", state="ready", min_priority="1") == ["cache one"]
    assert await found(work, "cache", kind="review") == []
    plain = await work.call("GET", "/tasks?label=web", work.viewer, expect=200)
    assert all("match" not in t for t in plain["items"])  # only a search explains itself


async def test_a_title_match_ranks_above_a_criteria_match_and_ties_go_newest_first(work):
    older = await work.task("Warm the cache")
    criteria_only = await work.task("Speed up start-up", criteria="Warm the cache")
    newer = await work.task("Warm the cache")
    ranked = (await search(work, "cache"))["items"]
    assert [t["id"] for t in ranked] == [newer["id"], older["id"], criteria_only["id"]]


async def test_an_edit_indexes_the_new_title_and_criteria_in_its_transaction(work):
    task = await work.task("Parse the config file", criteria="YAML only")
    assert await found(work, "parse config") == ["Parse the config file"]

    async def edit(revision: int, **changes: Any) -> None:
        body = {"expected_revision": revision, **changes}
        await work.call("PATCH", f"/tasks/{task['id']}", json=body, expect=200)

    await edit(1, title="Validate the settings file")
    assert await found(work, "parse") == []
    assert await found(work, "validating settings") == ["Validate the settings file"]
    assert await found(work, "yaml") == ["Validate the settings file"]
    await edit(2, criteria="TOML only")
    assert await found(work, "yaml") == []
    assert await found(work, "toml") == ["Validate the settings file"]
    await edit(3, priority=9)  # no text changed: the index keeps what it holds
    assert await found(work, "toml settings") == ["Validate the settings file"]
    # A refused edit leaves the index as it was (one transaction).
    await work.call(
        "PATCH",
        f"/tasks/{task['id']}",
        json={"expected_revision": 1, "title": "Stale words"},
        expect=409,
    )
    assert await found(work, "stale") == []


async def test_a_search_never_finds_another_spaces_task(work, make_principal, make_space):
    await work.task("Our login work")
    bob = await make_principal("human")
    other = await make_space(bob)
    theirs = f"/v1/spaces/{other.id}"
    await work.call("POST", f"{theirs}/projects", bob, json={"name": "main"}, expect=201)
    for title in ("Secret login work", "More login work"):  # newer: they would rank first
        await work.call(
            "POST",
            f"{theirs}/tasks",
            bob,
            json={"project": "main", "title": title, "criteria": "login"},
            expect=201,
        )
    assert await found(work, "login") == ["Our login work"]
    assert await found(work, "secret") == []
    first = await search(work, "login", limit="1")
    assert [t["title"] for t in first["items"]] == ["Our login work"]
    assert first["next_cursor"] is None
    mine = await work.call("GET", f"{theirs}/tasks?q=login", bob, expect=200)
    assert [t["title"] for t in mine["items"]] == ["More login work", "Secret login work"]
    # A member of this space only is a stranger there: 404, as for any of its routes.
    await work.call("GET", f"{theirs}/tasks?q=login", work.viewer, expect=404)


async def test_a_hostile_query_is_text_or_a_422_naming_q_never_an_error(work):
    await work.task("Fix the login OR logout near the form")
    before = await work.snapshot()
    for q in ('"', "*", "***", '""', "-", "_"):
        refused = await search(work, q, expect=422)
        assert refused["type"] == PROBLEM + "validation-error"
        assert list(refused["errors"]) == ["q"], refused
    too_long = await search(work, "x" * (MAX_QUERY_CHARS + 1), expect=422)
    assert list(too_long["errors"]) == ["q"]
    too_many = await search(work, " ".join(f"w{n}" for n in range(21)), expect=422)
    assert list(too_many["errors"]) == ["q"]
    for q in (
        "OR",
        "NEAR(login form)",
        "-x",
        "login -logout",
        "login OR",
        "title:login",
        "login*",
        '"unclosed login',
        "login & !form | (x)",
        "'; DROP TABLE task_search; --",
        "\u0002login\u0003",
        "x" * MAX_QUERY_CHARS,
    ):
        await search(work, q)  # a plain search: 200
    # Operators are words: "OR" must be in the text (PostgreSQL drops it as a stop word).
    assert await found(work, "login logout") == ["Fix the login OR logout near the form"]
    assert await found(work, "NEAR(login form)") == ["Fix the login OR logout near the form"]
    assert await found(work, "login -nothing") == []
    assert await found(work, "   ") == ["Fix the login OR logout near the form"]  # no search
    assert await work.snapshot() == before


async def test_a_search_pages_through_its_ranked_matches_with_an_opaque_cursor(work):
    for n in range(7):
        await work.task(f"alpha task {n}")
    await work.task("beta task")
    everything = await found(work, "alpha")
    assert everything == [f"alpha task {n}" for n in reversed(range(7))]
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        args = {"limit": "3", **({"cursor": cursor} if cursor else {})}
        page = await search(work, "alpha", **args)
        seen += [t["title"] for t in page["items"]]
        pages += 1
        assert all(MARK_START in t["match"]["snippet"] for t in page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert (pages, seen) == (3, everything)
    # A cursor this server did not issue is 400, never a 500.
    plain = await work.call("GET", "/tasks?limit=1", work.viewer, expect=200)
    for forged in (
        encode_cursor([-3]),
        encode_cursor([0]),
        encode_cursor([10**9]),
        encode_cursor([True]),
        encode_cursor(["3"]),
        encode_cursor([3, 4]),
        plain["next_cursor"],
        "not a cursor",
        "%%%",
    ):
        refused = await search(work, "alpha", expect=400, cursor=forged)
        assert refused["type"] == PROBLEM + "bad-cursor", forged
    searched = await search(work, "alpha", limit="2")
    await work.call(
        "GET", f"/tasks?cursor={searched['next_cursor']}", work.viewer, problem="bad-cursor"
    )


async def test_the_migration_indexes_the_tasks_there_are(work):
    await work.task("Older work", criteria="before search existed")
    async with work.app.db.write() as tx:
        await tx.execute(sa.text(f"DROP TABLE {TASK_SEARCH.name}"))
        await create_index(tx)
    assert await found(work, "search existed") == ["Older work"]


async def test_reindex_rebuilds_the_index_from_the_tasks(work, buildmax_settings):
    first = await work.task("Rotate the keys", criteria="monthly")
    await work.task("Rotate the logs")
    await work.call(
        "PATCH",
        f"/tasks/{first['id']}",
        json={"expected_revision": 1, "criteria": "weekly"},
        expect=200,
    )
    async with work.app.db.write() as tx:
        await TASK_SEARCH.clear(tx)
    assert await found(work, "rotate") == []
    location = ["--data-dir", buildmax_settings.data_dir]
    if buildmax_settings.database_url:
        location = ["--database-url", buildmax_settings.database_url]
    result = await asyncio.to_thread(CliRunner().invoke, task_group, ["reindex", *location])
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.output == "Indexed 2 task(s) for search.\n"
    assert await found(work, "rotate") == ["Rotate the logs", "Rotate the keys"]
    assert await found(work, "weekly") == ["Rotate the keys"]  # the current criteria
    assert await found(work, "monthly") == []


@pytest.mark.engine_independent
def test_the_cli_shows_the_matched_words():
    snippet = f"Fix {MARK_START}failing{MARK_END} login\n{MARK_START}tests{MARK_END} [x]"
    assert marked(snippet, bold=False) == "Fix [failing] login [tests] [x]"
    assert marked(snippet, bold=True) == "Fix \x1b[1mfailing\x1b[0m login \x1b[1mtests\x1b[0m [x]"
    assert marked(f"a {MARK_START}b", bold=False) == "a [b"
