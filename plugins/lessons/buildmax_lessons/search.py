"""Finding lessons: the list's filters, and full-text search ranked by
relevance, then usefulness, then recency.

Without a query the list is newest first, paged by a keyset cursor. With
one, the index (:data:`~.tables.SEARCH`) gives the newest
:data:`~buildmax.fulltext.RANKED_MATCHES` lessons that match it and that
the filters keep, each with its relevance (so a search costs the same
however many lessons match); the page is an offset into their ranking (a
cursor holds it). Relevance is compared in steps of
:data:`RELEVANCE_STEPS` of the best match's, so two lessons about as
relevant are ordered by their usefulness score (helpful - not helpful -
2 * wrong on the current revision), then the more recently changed first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import sqlalchemy as sa
from buildmax_hookspecs import Transaction

from buildmax.fulltext import Query
from buildmax.pagination import encode_cursor

from .lessons import LESSON_SELECT, contains
from .offers import path_applies
from .tables import CURRENT_REVISION, SEARCH, lessons, revisions

#: A lesson's current applicability (what the path filter reads).
_CURRENT_APPLIES = (
    sa.select(revisions.c.applies_to).where(CURRENT_REVISION).scalar_subquery().label("applies_to")
)

#: The most lessons a path-filtered list reads for one page.
MAX_SCANNED = 2000
#: Relevance within 1/20 of the best match's is "as relevant".
RELEVANCE_STEPS = 20


@dataclass(frozen=True)
class Filters:
    """What a list or search keeps: ``project_id`` (its lessons, and the
    common collection's unless ``common`` is ``exclude``), ``common``
    (``include``, ``exclude``, ``only``), ``kind``, ``task_kind``, ``tag``,
    ``path`` and ``superseded`` (``exclude``, ``include``, ``only``)."""

    project_id: str | None = None
    common: str = "include"
    kind: str | None = None
    task_kind: str | None = None
    tag: str | None = None
    path: str | None = None
    superseded: str = "exclude"

    def conditions(self, space_pk: int, dialect: str) -> list[Any]:
        """The SQL conditions of every filter but ``path``."""
        found: list[Any] = [lessons.c.space_id == space_pk]
        common = lessons.c.project_id.is_(None)
        if self.common == "only":
            found.append(common)
        elif self.project_id is not None:
            mine = lessons.c.project_id == self.project_id
            found.append(sa.or_(mine, common) if self.common == "include" else mine)
        elif self.common == "exclude":
            found.append(sa.not_(common))
        if self.kind is not None:
            found.append(lessons.c.kind == self.kind)
        if self.task_kind is not None:
            found.append(
                sa.or_(
                    lessons.c.task_kinds == "",
                    contains(lessons.c.task_kinds, self.task_kind, dialect),
                )
            )
        if self.tag is not None:
            found.append(contains(lessons.c.tags, self.tag, dialect))
        superseded = lessons.c.superseded_by.is_not(None)
        if self.superseded == "exclude":
            found.append(sa.not_(superseded))
        elif self.superseded == "only":
            found.append(superseded)
        return found

    def admits_path(self, row: Mapping[str, Any]) -> bool:
        """The ``path`` filter (a lesson's globs match it, or it has none)."""
        return self.path is None or path_applies(json.loads(row["applies_to"]), self.path)


async def listing(
    conn: Transaction, space_pk: int, filters: Filters, limit: int, after: str | None
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of the lessons the filters keep, newest first, after lesson
    ``after``; the rows and the next page's cursor. The ``path`` filter is
    applied as rows are read, reading on (at most :data:`MAX_SCANNED` rows)
    until the page is full."""
    base = LESSON_SELECT.where(*filters.conditions(space_pk, conn.dialect)).order_by(
        lessons.c.id.desc()
    )
    page: list[dict[str, Any]] = []
    scanned = 0
    while True:
        query = base.limit(limit + 1)
        if after is not None:
            query = query.where(
                lessons.c.id
                < sa.select(lessons.c.id)
                .where(lessons.c.space_id == space_pk, lessons.c.public_id == after)
                .scalar_subquery()
            )
        rows = [dict(r) for r in await conn.fetch_all(query)]
        for row in rows[:limit]:
            after = row["public_id"]
            scanned += 1
            if filters.admits_path(row):
                page.append(row)
                if len(page) == limit:
                    break
        more = len(rows) > limit or (
            len(page) == limit and bool(rows) and after != rows[-1]["public_id"]
        )
        if len(page) == limit or not more or scanned >= MAX_SCANNED:
            break
    return page, encode_cursor([after]) if more and after is not None else None


def _nearest(value: Any, dialect: str) -> Any:
    """``value`` (never negative) to the nearest whole number, a half up:
    the same on both engines (PostgreSQL's ``round`` of a float takes a
    half to the even number, SQLite's away from zero)."""
    if dialect == "sqlite":
        return sa.cast(value + 0.5, sa.Integer)  # truncates: the floor, as value >= 0
    return sa.func.floor(value + 0.5)


async def search(
    conn: Transaction, space_pk: int, query: Query, filters: Filters, limit: int, offset: int
) -> tuple[list[dict[str, Any]], str | None]:
    """A page of the lessons matching ``query`` that the filters keep, from
    ``offset`` in the ranking of the newest
    :data:`~buildmax.fulltext.RANKED_MATCHES` of them; each row gains
    ``match`` (its snippet and relevance). The rows and the next page's
    cursor."""
    conditions = filters.conditions(space_pk, conn.dialect)
    newest = partial(
        SEARCH.matches, conn.dialect, space_pk, query, key=lessons.c.id, space=lessons.c.space_id
    )
    if filters.path is not None:
        # Globs are matched here, not in SQL: the matches' paths first, then
        # the ranking of those the path admits (relevance against the best
        # of them, not of a lesson the path leaves out).
        paths = newest(columns=[_CURRENT_APPLIES], conditions=conditions)
        rows = await conn.fetch_all(sa.select(paths))
        admitted = [row["key"] for row in rows if filters.admits_path(row)]
        if not admitted:
            return [], None
        conditions = [*conditions, lessons.c.id.in_(admitted)]
    # What ranking needs of every match; the rest for the page only.
    matches = newest(columns=[lessons.c.score, lessons.c.updated_at], conditions=conditions)
    best = sa.func.max(matches.c.rank).over()
    # As relevant: within a step of the best match's relevance.
    step = _nearest(matches.c.rank / sa.func.nullif(best, 0) * RELEVANCE_STEPS, conn.dialect)
    ranked = (
        sa.select(*matches.c, best.label("best"))
        .order_by(
            step.desc(), matches.c.score.desc(), matches.c.updated_at.desc(), matches.c.key.desc()
        )
        .limit(limit + 1)
        .offset(offset)
    )
    rows = await conn.fetch_all(ranked)
    shown, more = rows[:limit], len(rows) > limit
    keys = [row["key"] for row in shown]
    full = {
        r["id"]: dict(r)
        for r in await conn.fetch_all(
            LESSON_SELECT.where(lessons.c.id.in_(sa.bindparam("keys", expanding=True))),
            {"keys": keys},
        )
    }
    # Snippets only for the page shown: making them is most of a search's work.
    marked = await SEARCH.snippets(conn, space_pk, query, keys)
    page = [
        {
            **full[row["key"]],
            "match": {
                "relevance": round(row["rank"] / row["best"], 4) if row["best"] else 0.0,
                "snippet": marked.get(row["key"], ""),
            },
        }
        for row in shown
        if row["key"] in full
    ]
    return page, encode_cursor([offset + limit]) if more else None
