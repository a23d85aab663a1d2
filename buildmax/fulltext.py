"""Full-text search on both engines, for a plugin's searchable records.

A :class:`TextIndex` is a plugin's index of some text fields of its records
(a lesson's title and text, a task's title and criteria), each record
indexed under its primary key and the key of the space it belongs to:

- on SQLite, an FTS5 table whose rowid is the record's key, with the Porter
  stemmer over Unicode words (diacritics folded);
- on PostgreSQL, a table with a stored ``tsvector`` (the ``english``
  configuration; the first field weighted above the others) and a GIN
  index on it.

The index is never a second source of truth: a plugin writes it in the
same transaction as the record (:meth:`TextIndex.put`, one statement on
either engine), and can rebuild it from its records at any time
(:meth:`TextIndex.clear`, then :meth:`TextIndex.fill` from a select of
them: one statement too).

A person's query is parsed here (:func:`parse_query`), never handed to an
engine's query syntax: words and ``"quoted phrases"``, every one of which
must match (stemmed: ``running`` finds ``runs``); anything else a query
language would read as an operator is only text. :meth:`TextIndex.matches`
gives the newest :data:`RANKED_MATCHES` records that match, and pass the
plugin's own conditions on its records, each with its relevance, for the
plugin to order and page: a search costs the same however common its words
are. :meth:`TextIndex.snippets` marks the matched words of the records
shown between :data:`MARK_START` and :data:`MARK_END`, control characters
no indexed text holds (a record's own are indexed as spaces), so a client
escapes the snippet and then marks them.

The engines are close, not equal. The stemmers differ at the edges
(SQLite's Porter keeps ``quickli`` for ``quickly``, PostgreSQL's Snowball
makes it ``quick``), and PostgreSQL leaves English stop words (``the``,
``or``, ``not``) out of documents and queries where SQLite keeps them: the
same query may find a little more on PostgreSQL.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Transaction
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import Join

#: What marks the start and the end of a matched word in a snippet.
MARK_START = "\x02"
MARK_END = "\x03"
#: The longest query read, and the most words and phrases it may hold.
MAX_QUERY_CHARS = 500
MAX_QUERY_TERMS = 20
#: About how many words a snippet shows.
SNIPPET_WORDS = 16
#: How many of a search's matches it ranks at most: the newest.
RANKED_MATCHES = 1000
#: A word as the query parser reads it: letters and digits (any script).
_WORD = re.compile(r"[^\W_]+")
_PHRASE = re.compile(r'"([^"]*)"')
#: A possessive's ``'s`` (or with U+2019 for the apostrophe) after a word.
_POSSESSIVE = re.compile(r"(?<=[^\W_])['\u2019][sS](?![^\W_])")
#: The PostgreSQL text search configuration.
_CONFIG = "english"
#: A PostgreSQL index table's rows are stored apart only past 8 KB (not
#: 2 KB): a search reads each match's document, and a row stored apart
#: costs it a lookup more (measured: a fifth to a third of a lesson
#: search's ranking statement at 100,000 lessons).
_WHOLE_ROWS = "toast_tuple_target = 8160"


class QueryRefused(ValueError):
    """A query that cannot be searched: empty of words, or too long."""


@dataclass(frozen=True)
class Query:
    """A parsed query: every phrase (a tuple of words) must match; a
    single word is a phrase of one."""

    phrases: tuple[tuple[str, ...], ...]

    def fts5(self) -> str:
        """The query as an FTS5 ``MATCH`` expression: each phrase quoted
        (its words hold letters and digits only, so nothing in it is FTS5
        syntax), all of them required."""
        return " ".join('"' + " ".join(words) + '"' for words in self.phrases)

    def websearch(self) -> str:
        """The query as ``websearch_to_tsquery`` text: each phrase quoted,
        so no word is read as ``or`` or a negation."""
        return " ".join('"' + " ".join(words) + '"' for words in self.phrases)


def parse_query(text: str) -> Query:
    """The words and ``"phrases"`` of a person's query, lowercased; an
    unclosed quote is text, and a possessive's ``'s`` is left out of a word
    (``table's`` is ``table``: the engines index the ``s`` apart, and
    PostgreSQL drops it). :class:`QueryRefused` when it has no word, is
    longer than :data:`MAX_QUERY_CHARS` or holds more than
    :data:`MAX_QUERY_TERMS` words and phrases."""
    if len(text) > MAX_QUERY_CHARS:
        raise QueryRefused(f"a query is at most {MAX_QUERY_CHARS} characters")
    phrases: list[tuple[str, ...]] = []
    rest = _PHRASE.sub(lambda m: _keep_phrase(m.group(1), phrases), text)
    phrases.extend((word,) for word in _words(_POSSESSIVE.sub("", rest)))
    if not phrases:
        raise QueryRefused("a query needs at least one word")
    if len(phrases) > MAX_QUERY_TERMS:
        raise QueryRefused(f"a query holds at most {MAX_QUERY_TERMS} words and phrases")
    return Query(tuple(dict.fromkeys(phrases)))


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def _keep_phrase(text: str, phrases: list[tuple[str, ...]]) -> str:
    words = _words(text)
    if words:
        phrases.append(tuple(words))
    return " "


def _unmarked(text: str) -> str:
    """``text`` with any mark a snippet could show as a match made a space."""
    return text.replace(MARK_START, " ").replace(MARK_END, " ")


def _unmarked_column(column: Any) -> Any:
    """:func:`_unmarked` in SQL."""
    return sa.func.replace(sa.func.replace(column, MARK_START, " "), MARK_END, " ")


class _IndexFirst(Join):
    """A join SQLite runs with its left side outermost (``CROSS JOIN``): a
    full-text index walked in key order, never the records' own indexes
    first with a full-text lookup per record."""

    inherit_cache = True


@compiles(_IndexFirst, "sqlite")
def _compile_index_first(join: _IndexFirst, compiler: Any, **kw: Any) -> str:
    return str(compiler.visit_join(join, **kw)).replace(" JOIN ", " CROSS JOIN ", 1)


@dataclass(frozen=True)
class TextIndex:
    """The full-text index ``name`` (a table the plugin owns: its name
    starts with the plugin's prefix) of the text ``fields`` of records; the
    first field weighs most."""

    name: str
    fields: tuple[str, ...]

    def __post_init__(self) -> None:
        for identifier in (self.name, *self.fields):
            if not re.fullmatch(r"[a-z][a-z0-9_]{0,62}", identifier):
                raise ValueError(f"not a plain identifier: {identifier!r}")
        if not self.fields or {"key", "scope", "document"} & set(self.fields):
            raise ValueError("an index needs fields, none named key, scope or document")

    async def create(self, tx: Transaction) -> None:
        """Create the index (a migration's step)."""
        for statement in self._ddl(tx.dialect):
            await tx.execute(sa.text(statement))

    def _ddl(self, dialect: str) -> list[str]:
        columns = ", ".join(self.fields)
        if dialect == "sqlite":
            return [
                f"CREATE VIRTUAL TABLE {self.name} USING fts5(scope UNINDEXED, {columns}, "
                "tokenize = 'porter unicode61 remove_diacritics 2')"
            ]
        weighted = " || ".join(
            f"setweight(to_tsvector('{_CONFIG}', coalesce({field}, '')), "
            f"'{'A' if number == 0 else 'B'}')"
            for number, field in enumerate(self.fields)
        )
        texts = ", ".join(f"{field} TEXT NOT NULL" for field in self.fields)
        return [
            f"CREATE TABLE {self.name} (key BIGINT PRIMARY KEY, scope BIGINT NOT NULL, "
            f"{texts}, document tsvector GENERATED ALWAYS AS ({weighted}) STORED) "
            f"WITH ({_WHOLE_ROWS})",
            f"CREATE INDEX {self.name}_document ON {self.name} USING GIN (document)",
            f"CREATE INDEX {self.name}_scope ON {self.name} (scope)",
        ]

    async def keep_rows_whole(self, tx: Transaction) -> None:
        """Keep each indexed record's row whole on PostgreSQL (up to 8 KB),
        as :meth:`create` now does: a row it stores apart (a long text's
        document) costs a search a lookup more for each match. Rows
        written before stay apart until they are written again (a rebuild:
        :meth:`clear`, then :meth:`fill`). Nothing to do on SQLite."""
        if tx.dialect == "postgresql":
            await tx.execute(sa.text(f"ALTER TABLE {self.name} SET ({_WHOLE_ROWS})"))

    async def put(self, tx: Transaction, key: int, scope: int, values: Mapping[str, str]) -> None:
        """Index (or index again) record ``key`` of space ``scope`` with its
        ``values`` for every field: one statement. A mark
        (:data:`MARK_START`, :data:`MARK_END`) in a value is indexed as a
        space, so that a snippet's marks are the search's own."""
        missing = set(self.fields) - set(values)
        if missing:
            raise ValueError(f"no value for {sorted(missing)}")
        columns = ", ".join(self.fields)
        params = {"key": key, "scope": scope, **{f: _unmarked(values[f]) for f in self.fields}}
        placeholders = ", ".join(f":{f}" for f in self.fields)
        if tx.dialect == "sqlite":
            statement = (
                f"INSERT OR REPLACE INTO {self.name} (rowid, scope, {columns}) "
                f"VALUES (:key, :scope, {placeholders})"
            )
        else:
            updates = ", ".join(f"{f} = excluded.{f}" for f in ("scope", *self.fields))
            statement = (
                f"INSERT INTO {self.name} (key, scope, {columns}) "
                f"VALUES (:key, :scope, {placeholders}) "
                f"ON CONFLICT (key) DO UPDATE SET {updates}"
            )
        await tx.execute(sa.text(statement), params)

    async def fill(self, tx: Transaction, rows: sa.Select[Any]) -> None:
        """Index (or index again) every row of the select ``rows``, whose
        columns are, in order, the record's key, its space's key and the
        text of each field (never ``NULL``: ``coalesce`` what may be), at
        most one row per key: one ``INSERT ... SELECT`` statement. Marks
        in the text are indexed as spaces, as by :meth:`put`."""
        if len(rows.selected_columns) != 2 + len(self.fields):
            raise ValueError(
                f"the select needs {2 + len(self.fields)} columns: key, scope, "
                + ", ".join(self.fields)
            )
        source = rows.subquery()
        key, scope, *texts = source.c
        rows = sa.select(key, scope, *map(_unmarked_column, texts))
        if tx.dialect == "sqlite":
            columns = ["rowid", "scope", *self.fields]
            index = sa.table(self.name, *map(sa.column, columns))
            statement: sa.Insert = (
                sa.insert(index).from_select(columns, rows).prefix_with("OR REPLACE")
            )
        else:
            columns = ["key", "scope", *self.fields]
            index = sa.table(self.name, *map(sa.column, columns))
            upsert = postgresql.insert(index).from_select(columns, rows)
            statement = upsert.on_conflict_do_update(
                index_elements=["key"],
                set_={name: upsert.excluded[name] for name in ("scope", *self.fields)},
            )
        await tx.execute(statement)

    async def remove(self, tx: Transaction, key: int) -> None:
        """Take record ``key`` out of the index."""
        column = "rowid" if tx.dialect == "sqlite" else "key"
        await tx.execute(sa.text(f"DELETE FROM {self.name} WHERE {column} = :key"), {"key": key})

    async def clear(self, tx: Transaction) -> None:
        """Empty the index (before a rebuild)."""
        await tx.execute(sa.text(f"DELETE FROM {self.name}"))

    def matches(
        self,
        dialect: str,
        space_pk: int,
        query: Query,
        *,
        key: sa.Column[Any],
        space: sa.Column[Any],
        columns: Sequence[Any] = (),
        conditions: Sequence[Any] = (),
        limit: int = RANKED_MATCHES,
    ) -> sa.Subquery:
        """The records of space ``space_pk`` that match ``query`` and every
        one of ``conditions``, as a subquery to order and page: the newest
        ``limit`` of them (by ``key``, the records' primary key and the
        index's key; ``space`` is their space column). Its columns are
        ``key``, ``rank`` (relevance: higher is better, comparable within
        one search only) and the ``columns`` asked (of the records' table,
        or labelled).

        Its cost grows with ``limit``, never with how many records match:
        a word in every record of a space costs what a rare one does. On
        PostgreSQL the query's words are written into the statement rather
        than bound, so that each search is planned for its own words (a plan
        made once for any words walks the whole table for a rare one)."""
        table = key.table
        if dialect == "sqlite":
            index = sa.table(self.name, sa.column("rowid"))
            weights = ", ".join(["0"] + ["2" if n == 0 else "1" for n in range(len(self.fields))])
            return (
                sa.select(
                    key.label("key"),
                    sa.literal_column(f"-bm25({self.name}, {weights})").label("rank"),
                    *columns,
                )
                # The index drives the join, newest match first, so that the
                # limit ends the walk.
                .select_from(_IndexFirst(index, table, key == index.c.rowid))
                .where(
                    sa.text(f"{self.name} MATCH :fts_query").bindparams(fts_query=query.fts5()),
                    space == space_pk,
                    *conditions,
                )
                .order_by(index.c.rowid.desc())
                .limit(limit)
                .subquery("matches")
            )
        index = sa.table(self.name, sa.column("key"), sa.column("document"))
        words = sa.func.websearch_to_tsquery(
            sa.literal_column(f"'{_CONFIG}'"),
            sa.literal(query.websearch(), sa.Text, literal_execute=True),
        )
        newest = (
            sa.select(index.c.key, index.c.document, *columns)
            .select_from(sa.join(index, table, key == index.c.key))
            .where(index.c.document.op("@@")(words), space == space_pk, *conditions)
            .order_by(index.c.key.desc())
            .limit(limit)
            .subquery("newest")
        )
        return (
            sa.select(
                newest.c.key,
                sa.func.ts_rank_cd(newest.c.document, words).label("rank"),
                *(newest.c[c.name] for c in columns),
            )
            # Kept a subquery of its own (a limit is never merged into the
            # query around it), so that each match is ranked once.
            .limit(limit)
            .subquery("matches")
        )

    async def snippets(
        self, conn: Transaction, space_pk: int, query: Query, keys: Sequence[int]
    ) -> dict[int, str]:
        """A snippet of the text of each record of ``keys`` (of space
        ``space_pk``) that matches ``query``, by key: about
        :data:`SNIPPET_WORDS` words of the field that matched best, the
        matched words between :data:`MARK_START` and :data:`MARK_END`.
        Making a snippet costs far more than ranking a record: ask for the
        records shown only."""
        if not keys:
            return {}
        params: dict[str, object] = {"scope": space_pk}
        numbered = {f"k{n}": k for n, k in enumerate(keys)}
        params.update(numbered)
        listed = ", ".join(":" + k for k in numbered)
        if conn.dialect == "sqlite":
            # A key range the index walks once; the keys themselves (``+``:
            # not a lookup each) pick the records in it.
            statement = (
                f"SELECT rowid AS key, "
                f"snippet({self.name}, -1, char(2), char(3), '…', {SNIPPET_WORDS}) AS snippet "
                f"FROM {self.name} WHERE {self.name} MATCH :query "
                f"AND rowid BETWEEN :low AND :high AND +rowid IN ({listed}) AND scope = :scope"
            )
            params.update(query=query.fts5(), low=min(keys), high=max(keys))
        else:
            text = " || ' ' || ".join(self.fields)
            statement = (
                f"SELECT key, ts_headline('{_CONFIG}', {text}, q, :headline) AS snippet "
                f"FROM {self.name}, websearch_to_tsquery('{_CONFIG}', :query) AS q "
                f"WHERE key IN ({listed}) AND document @@ q AND scope = :scope"
            )
            params.update(
                query=query.websearch(),
                headline=(
                    f"StartSel={MARK_START}, StopSel={MARK_END}, "
                    f"MaxWords={SNIPPET_WORDS + 8}, MinWords={SNIPPET_WORDS // 2}"
                ),
            )
        rows = await conn.fetch_all(sa.text(statement), params)
        return {int(r["key"]): str(r["snippet"]) for r in rows}
