"""Full-text search on both engines (:mod:`buildmax.fulltext`): stemmed
words, phrases, ranking, snippets, space scoping, and a person's query that
is never an engine's query syntax."""

from __future__ import annotations

import gc
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy.dialects import sqlite

from buildmax.database.postgres import _postgres_dialect
from buildmax.database.statements import StatementCompiler
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


#: The records the tests index, by key: their space.
RECORDS = {**dict.fromkeys((1, 2, 3, 4, 5, 10, 11, 12, 20, 22, *range(100, 130)), 1), 21: 2, 99: 2}


@dataclass(frozen=True)
class Indexed:
    """An index of DOCS and the table of the records it indexes."""

    index: TextIndex
    records: sa.Table


@pytest.fixture
async def indexed(app: Any) -> AsyncIterator[Indexed]:
    """A fresh index of DOCS (space 1), plus one document of space 2, and
    a table of every record the tests index (key and space)."""
    made = TextIndex(f"test_search_{secrets.token_hex(4)}", ("title", "body"))
    records = sa.Table(
        f"test_records_{secrets.token_hex(4)}",
        sa.MetaData(),
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("space", sa.BigInteger, nullable=False),
        sa.Column("hidden", sa.Boolean, nullable=False, default=False),
    )
    async with app.db.write() as tx:
        await made.create(tx)
        await tx.execute(sa.schema.CreateTable(records))
        for key, space in RECORDS.items():
            await tx.execute(records.insert().values(id=key, space=space, hidden=False))
        for key, (title, body) in DOCS.items():
            await made.put(tx, key, 1, {"title": title, "body": body})
        await made.put(tx, 99, 2, {"title": "Running the tests", "body": "another space"})
    try:
        yield Indexed(made, records)
    finally:
        async with app.db.write() as tx:
            await tx.execute(sa.text(f"DROP TABLE {made.name}"))
            await tx.execute(sa.schema.DropTable(records))


@pytest.fixture
def index(indexed: Indexed) -> TextIndex:
    return indexed.index


async def _ranked(
    app: Any, indexed: Indexed, text: str, scope: int = 1, **options: Any
) -> list[dict[str, Any]]:
    """The matches of ``text``, most relevant first (ties: the newer)."""
    records = indexed.records
    async with app.db.read() as conn:
        matches = indexed.index.matches(
            conn.dialect,
            scope,
            parse_query(text),
            key=records.c.id,
            space=records.c.space,
            **options,
        )
        rows = await conn.fetch_all(
            sa.select(matches).order_by(matches.c.rank.desc(), matches.c.key.desc())
        )
    return [dict(row) for row in rows]


async def _keys(app: Any, indexed: Indexed, text: str, scope: int = 1) -> list[int]:
    return [row["key"] for row in await _ranked(app, indexed, text, scope)]


async def _snippet(app: Any, index: TextIndex, text: str, key: int) -> str:
    async with app.db.read() as conn:
        return (await index.snippets(conn, 1, parse_query(text), [key]))[key]


async def test_a_word_finds_its_stemmed_forms(app, indexed):
    assert set(await _keys(app, indexed, "running")) == {1, 4}  # "Running", "Run", "runs"
    assert set(await _keys(app, indexed, "tested")) == {1, 4}  # "tests", "test"
    assert await _keys(app, indexed, "migration") == [4]


async def test_a_possessive_finds_the_word_on_both_engines(app, indexed):
    assert await _keys(app, indexed, "runner's cache") == [3]


async def test_every_word_must_match_and_a_phrase_keeps_its_order(app, indexed):
    assert await _keys(app, indexed, "test merge") == [1]
    assert await _keys(app, indexed, '"merge queue"') == [5]
    assert await _keys(app, indexed, '"queue merge"') == []
    assert await _keys(app, indexed, "release wheel") == [2]


async def test_a_match_in_the_title_ranks_above_one_in_the_text(app, indexed, index):
    async with app.db.write() as tx:
        await index.put(tx, 10, 1, {"title": "Cache warming", "body": "nothing else"})
        await index.put(tx, 11, 1, {"title": "Something", "body": "about the cache, once"})
    found = await _keys(app, indexed, "cache")
    assert found.index(10) < found.index(11)


async def test_a_search_sees_its_space_and_its_conditions_only(app, indexed, index):
    assert 99 not in await _keys(app, indexed, "running")
    assert await _keys(app, indexed, "running", scope=2) == [99]
    # The records' own space decides, not the index's copy of it.
    async with app.db.write() as tx:
        await index.put(tx, 21, 1, {"title": "Running elsewhere", "body": "space 2's record"})
    assert 21 not in await _keys(app, indexed, "running")
    records = indexed.records
    async with app.db.write() as tx:
        await tx.execute(records.update().where(records.c.id == 4).values(hidden=True))
    shown = await _ranked(
        app,
        indexed,
        "running",
        conditions=[records.c.hidden.is_(False)],
        columns=[records.c.hidden],
    )
    assert [(row["key"], row["hidden"]) for row in shown] == [(1, False)]


async def test_a_search_ranks_the_newest_matches_only(app, indexed, index):
    async with app.db.write() as tx:
        for key in range(100, 130):
            title = "Cache" if key == 100 else "Notes"
            await index.put(tx, key, 1, {"title": title, "body": "the cache again"})
    newest = await _ranked(app, indexed, "cache", limit=10)
    assert sorted(row["key"] for row in newest) == list(range(120, 130))
    assert 100 not in [row["key"] for row in newest]  # the best match, but not among the newest
    assert (await _keys(app, indexed, "cache"))[0] == 100


async def test_a_snippet_marks_the_matched_words(app, index):
    snippet = await _snippet(app, index, "cold cache", 3)
    assert f"{MARK_START}cache{MARK_END}" in snippet
    assert f"{MARK_START}cold{MARK_END}" in snippet


async def test_snippets_are_of_the_keys_asked_that_match_in_the_space(app, index):
    async with app.db.read() as conn:
        found = await index.snippets(conn, 1, parse_query("running"), [1, 2, 99])
        assert await index.snippets(conn, 1, parse_query("running"), []) == {}
    # 2 does not match, 99 is of space 2, and 4 matches but was not asked for.
    assert list(found) == [1] and MARK_START in found[1]


async def test_a_snippet_marks_only_what_matched(app, index):
    async with app.db.write() as tx:
        await index.put(tx, 12, 1, {"title": "x", "body": f"gravel {MARK_START}forged{MARK_END}"})
    snippet = await _snippet(app, index, "gravel", 12)
    assert f"{MARK_START}gravel{MARK_END}" in snippet
    assert snippet.count(MARK_START) == snippet.count(MARK_END) == 1


async def test_put_again_replaces_and_remove_takes_out(app, indexed, index):
    async with app.db.write() as tx:
        await index.put(tx, 2, 1, {"title": "Release checklist", "body": "sign the tarball"})
    assert await _keys(app, indexed, "tarball") == [2]
    assert await _keys(app, indexed, "wheel") == []
    async with app.db.write() as tx:
        await index.remove(tx, 2)
    assert await _keys(app, indexed, "tarball") == []
    async with app.db.write() as tx:
        await index.clear(tx)
    assert await _keys(app, indexed, "running") == []


async def test_fill_indexes_every_row_of_a_select(app, indexed, index):
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
        assert await _keys(app, indexed, "tarball") == [20, 2]  # title first, then the newer key
        assert (await _snippet(app, index, "parsing", 20)).count(MARK_START) == 1
        assert await _keys(app, indexed, "wheel") == []  # key 2's old text is gone
        assert await _keys(app, indexed, "tarball", scope=2) == [21]
        assert set(await _keys(app, indexed, "running")) == {1, 4}  # the others untouched
        async with app.db.write() as tx:
            await index.clear(tx)
            await index.fill(tx, rows)  # a rebuild: clear, then fill
        assert await _keys(app, indexed, "tarball") == [20, 2]
        assert await _keys(app, indexed, "running") == []
    finally:
        async with app.db.write() as tx:
            await tx.execute(sa.schema.DropTable(source))


async def test_query_syntax_of_either_engine_is_only_text(app, indexed, index):
    for text in (
        'NEAR(test merge) OR title:release AND -wheel * ^ "unclosed',
        "test OR release",
        "-merge test",
        "test:* & !merge | (release)",
        "'; DROP TABLE x; --",
        "it's o'clock",
    ):
        await _ranked(app, indexed, text)  # never an error
        async with app.db.read() as conn:
            await index.snippets(conn, 1, parse_query(text), [1, 2])
    # Words an engine reads as operators are words here: all of them must match.
    assert await _keys(app, indexed, "test OR release") == []
    assert await _keys(app, indexed, "-merge test") == [1]


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


async def test_the_index_drives_a_search_walk_newest_first(app, indexed):
    """The limit can end the walk only if the index is walked first, in key
    order: never the records' own index with a full-text lookup each."""
    if app.db.dialect != "sqlite":
        pytest.skip("SQLite's join order (CROSS JOIN); PostgreSQL plans each search's words")
    records = indexed.records
    async with app.db.write() as tx:
        await tx.execute(sa.schema.CreateIndex(sa.Index(f"{records.name}_space", records.c.space)))
    # A condition that makes the records' side look the cheaper one to start with.
    matches = indexed.index.matches(
        "sqlite",
        1,
        parse_query("running"),
        key=records.c.id,
        space=records.c.space,
        conditions=[records.c.id == 4],
    )
    sql, params = StatementCompiler(sqlite.dialect(paramstyle="named")).compile(sa.select(matches))
    async with app.db.read() as conn:
        plan = [
            row["detail"]
            for row in await conn.fetch_all(sa.text("EXPLAIN QUERY PLAN " + sql), params)
        ]
    walk = [line for line in plan if not line.startswith(("CO-ROUTINE", "SCAN matches"))]
    assert walk[0].startswith(f"SCAN {indexed.index.name} VIRTUAL TABLE"), plan
    assert not any("TEMP B-TREE" in line for line in walk), plan  # the index's own order


@pytest.mark.engine_independent
def test_a_postgresql_search_is_planned_for_its_own_words():
    """Its words are in the statement's text, not a parameter: a plan made
    once for any words (a prepared statement's generic plan) walks the
    whole table for a rare one."""
    records = sa.Table(
        "records", sa.MetaData(), sa.Column("id", sa.BigInteger), sa.Column("space", sa.BigInteger)
    )
    index = TextIndex("things", ("title",))
    matches = index.matches(
        "postgresql",
        7,
        parse_query('flaky "lock timeout"'),
        key=records.c.id,
        space=records.c.space,
    )
    sql, args, one_off = StatementCompiler(_postgres_dialect()).compile_positional(
        sa.select(matches)
    )
    assert one_off  # prepared apart from the connection's cache
    assert "websearch_to_tsquery('english', '\"lock timeout\" \"flaky\"')" in sql
    assert not any("flaky" in str(arg) for arg in args)


async def test_a_postgresql_search_leaves_no_statement_prepared_behind(app, indexed):
    """Each search's words make a text of its own: it is prepared apart
    from the connection's cache of statements and closed after, so that
    searches never push out the statements every request runs again."""
    if app.db.dialect != "postgresql":
        pytest.skip("PostgreSQL's prepared statements")
    records = indexed.records
    prepared = (
        "SELECT count(*) FROM pg_prepared_statements "
        "WHERE statement LIKE '%websearch_to_tsquery%' AND statement NOT LIKE '%pg_prepared%'"
    )
    async with app.db.read(background=True) as conn:
        for text in ("running", "tests", "merge queue", "cold cache", "release"):
            matches = indexed.index.matches(
                conn.dialect, 1, parse_query(text), key=records.c.id, space=records.c.space
            )
            assert await conn.fetch_all(sa.select(matches)) is not None
        gc.collect()
        await conn.fetch_val(sa.text("SELECT 1"))  # a prepared statement dropped closes here
        assert await conn.fetch_val(sa.text(prepared)) == 0
