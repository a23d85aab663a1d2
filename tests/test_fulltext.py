"""Full-text search on both engines (:mod:`buildmax.fulltext`): stemmed
words, phrases, ranking, snippets, space scoping, and a person's query that
is never an engine's query syntax."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from buildmax.fulltext import (
    MARK_END,
    MARK_START,
    MAX_QUERY_CHARS,
    MAX_QUERY_TERMS,
    Query,
    QueryRefused,
    TextIndex,
    parse_query,
)

DOCS = {
    1: (
        "Running the tests",
        "Run the whole suite before you push; a failing test blocks the merge.",
    ),
    2: ("Release checklist", "Tag the release, then publish the wheel and announce it."),
    3: ("Flaky runner", "The CI runner times out when the cache is cold."),
    4: ("Database migrations", "Each migration runs in one transaction; test it on both engines."),
    5: ("Naming branches", "Name a branch after its task; the merge queue reads it."),
}


@pytest.fixture
async def index(app: Any) -> AsyncIterator[TextIndex]:
    """A fresh index of DOCS (space 1), plus one document of space 2."""
    made = TextIndex(f"test_search_{secrets.token_hex(4)}", ("title", "body"))
    async with app.db.write() as tx:
        await made.create(tx)
        for key, (title, body) in DOCS.items():
            await made.put(tx, key, 1, {"title": title, "body": body})
        await made.put(tx, 99, 2, {"title": "Running the tests", "body": "another space"})
    try:
        yield made
    finally:
        async with app.db.write() as tx:
            await tx.execute(sa.text(f"DROP TABLE {made.name}"))


async def _keys(app: Any, index: TextIndex, text: str, scope: int = 1) -> list[int]:
    async with app.db.read() as conn:
        return [hit.key for hit in await index.search(conn, scope, parse_query(text))]


async def test_a_word_finds_its_stemmed_forms(app, index):
    assert set(await _keys(app, index, "running")) == {1, 4}  # "Running", "Run", "runs"
    assert set(await _keys(app, index, "tested")) == {1, 4}  # "tests", "test"
    assert await _keys(app, index, "migration") == [4]


async def test_a_possessive_finds_the_word_on_both_engines(app, index):
    assert await _keys(app, index, "runner's cache") == [3]


async def test_every_word_must_match_and_a_phrase_keeps_its_order(app, index):
    assert await _keys(app, index, "test merge") == [1]
    assert await _keys(app, index, '"merge queue"') == [5]
    assert await _keys(app, index, '"queue merge"') == []
    assert await _keys(app, index, "release wheel") == [2]


async def test_a_match_in_the_title_ranks_above_one_in_the_text(app, index):
    async with app.db.write() as tx:
        await index.put(tx, 10, 1, {"title": "Cache warming", "body": "nothing else"})
        await index.put(tx, 11, 1, {"title": "Something", "body": "about the cache, once"})
    found = await _keys(app, index, "cache")
    assert found.index(10) < found.index(11)


async def test_a_search_sees_its_space_only_and_the_keys_given(app, index):
    assert 99 not in await _keys(app, index, "running")
    assert await _keys(app, index, "running", scope=2) == [99]
    async with app.db.read() as conn:
        hits = await index.search(conn, 1, parse_query("running"), keys=[4])
        assert [h.key for h in hits] == [4]
        assert await index.search(conn, 1, parse_query("running"), keys=[]) == []


async def test_a_snippet_marks_the_matched_words(app, index):
    async with app.db.read() as conn:
        [hit] = await index.search(conn, 1, parse_query("cold cache"))
    assert f"{MARK_START}cache{MARK_END}" in hit.snippet
    assert f"{MARK_START}cold{MARK_END}" in hit.snippet


async def test_a_search_ranks_without_snippets_and_snippets_the_keys_asked(app, index):
    async with app.db.read() as conn:
        ranked = await index.search(conn, 1, parse_query("running"), snippets=False)
        assert {h.key for h in ranked} == {1, 4} and {h.snippet for h in ranked} == {""}
        shown = await index.search(conn, 1, parse_query("running"), keys=[ranked[0].key])
    assert [h.key for h in shown] == [ranked[0].key] and MARK_START in shown[0].snippet


async def test_a_snippet_marks_only_what_matched(app, index):
    async with app.db.write() as tx:
        await index.put(tx, 12, 1, {"title": "x", "body": f"gravel {MARK_START}forged{MARK_END}"})
    async with app.db.read() as conn:
        [hit] = await index.search(conn, 1, parse_query("gravel"))
    assert f"{MARK_START}gravel{MARK_END}" in hit.snippet
    assert hit.snippet.count(MARK_START) == hit.snippet.count(MARK_END) == 1


async def test_put_again_replaces_and_remove_takes_out(app, index):
    async with app.db.write() as tx:
        await index.put(tx, 2, 1, {"title": "Release checklist", "body": "sign the tarball"})
    assert await _keys(app, index, "tarball") == [2]
    assert await _keys(app, index, "wheel") == []
    async with app.db.write() as tx:
        await index.remove(tx, 2)
    assert await _keys(app, index, "tarball") == []
    async with app.db.write() as tx:
        await index.clear(tx)
    assert await _keys(app, index, "running") == []


async def test_fill_indexes_every_row_of_a_select(app, index):
    source = sa.Table(
        f"test_source_{secrets.token_hex(4)}",
        sa.MetaData(),
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("space", sa.BigInteger, nullable=False),
        sa.Column("heading", sa.Text, nullable=False),
        sa.Column("text", sa.Text, nullable=True),
    )
    async with app.db.write() as tx:
        await tx.execute(sa.schema.CreateTable(source))
        for key, space, heading, text in (
            (2, 1, "Release checklist", "sign the tarball"),  # indexed already: replaced
            (20, 1, f"Parsing {MARK_START}tarballs{MARK_END}", None),
            (21, 2, "Another space's tarball", "kept apart"),
            (22, 1, "Left out", "a tarball the select does not take"),
        ):
            await tx.execute(
                source.insert().values(id=key, space=space, heading=heading, text=text)
            )
    rows = sa.select(
        source.c.id,
        source.c.space,
        source.c.heading,
        sa.func.coalesce(source.c.text, ""),
    ).where(source.c.heading != "Left out")
    try:
        async with app.db.write() as tx:
            with pytest.raises(ValueError):
                await index.fill(tx, sa.select(source.c.id, source.c.space, source.c.heading))
            await index.fill(tx, rows)
        assert await _keys(app, index, "tarball") == [20, 2]  # title first, then the newer key
        async with app.db.read() as conn:
            hits = await index.search(conn, 1, parse_query("parsing"))
        assert [h.snippet.count(MARK_START) for h in hits] == [1]  # a stored mark is a space
        assert await _keys(app, index, "wheel") == []  # key 2's old text is gone
        assert await _keys(app, index, "tarball", scope=2) == [21]
        assert set(await _keys(app, index, "running")) == {1, 4}  # the others untouched
        async with app.db.write() as tx:
            await index.clear(tx)
            await index.fill(tx, rows)  # a rebuild: clear, then fill
        assert await _keys(app, index, "tarball") == [20, 2]
        assert await _keys(app, index, "running") == []
    finally:
        async with app.db.write() as tx:
            await tx.execute(sa.schema.DropTable(source))


async def test_query_syntax_of_either_engine_is_only_text(app, index):
    for text in (
        'NEAR(test merge) OR title:release AND -wheel * ^ "unclosed',
        "test OR release",
        "-merge test",
        "test:* & !merge | (release)",
        "'; DROP TABLE x; --",
    ):
        async with app.db.read() as conn:
            await index.search(conn, 1, parse_query(text))  # never an error
    # Words an engine reads as operators are words here: all of them must match.
    assert await _keys(app, index, "test OR release") == []
    assert await _keys(app, index, "-merge test") == [1]


@pytest.mark.engine_independent
def test_a_query_is_parsed_into_words_and_phrases():
    assert parse_query('Merge "the Queue"  tests-x') == Query(
        (("the", "queue"), ("merge",), ("tests",), ("x",))
    )
    assert parse_query('"unclosed phrase').phrases == (("unclosed",), ("phrase",))
    assert parse_query("a a A").phrases == (("a",),)
    assert parse_query("the runner\u2019s cache").phrases == (("the",), ("runner",), ("cache",))
    assert parse_query("tables' rows").phrases == (("tables",), ("rows",))
    for empty in ("", "   ", '""', "*** ---", "_"):
        with pytest.raises(QueryRefused):
            parse_query(empty)
    with pytest.raises(QueryRefused):
        parse_query("x" * (MAX_QUERY_CHARS + 1))
    with pytest.raises(QueryRefused):
        parse_query(" ".join(f"w{n}" for n in range(MAX_QUERY_TERMS + 1)))


@pytest.mark.engine_independent
@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=200))
def test_a_parsed_query_holds_nothing_but_quoted_words(text):
    try:
        query = parse_query(text)
    except QueryRefused:
        return
    expression = query.fts5()
    assert expression.count('"') == 2 * len(query.phrases)
    for words in query.phrases:
        assert all(w.isalnum() for w in words)


@pytest.mark.engine_independent
def test_an_index_is_named_and_fielded_plainly():
    for name, fields in (("x; drop", ("a",)), ("ok", ()), ("ok", ("key",)), ("ok", ("a b",))):
        with pytest.raises(ValueError):
            TextIndex(name, fields)
