"""The lessons plugin's tables (every name starts with ``lesson_``).

``lesson_lessons`` holds one row per lesson: where it lives (a project,
named by the tasks plugin's public id, or the space's common collection
when ``project_id`` is null), its current revision's number and what the
filters read of it, its supersession and the usefulness votes on its
current revision. ``lesson_revisions`` holds every revision, immutable;
``lesson_votes`` one vote per principal and revision. :data:`SEARCH` is
the full-text index of the current revisions' title and text.
"""

from __future__ import annotations

import sqlalchemy as sa

from buildmax.fulltext import TextIndex
from buildmax.tables import Id, Millis, one_of

metadata = sa.MetaData()

#: Kernel tables referenced by foreign key (declared here only for DDL).
_spaces = sa.Table("spaces", metadata, sa.Column("id", Id, primary_key=True))

KINDS = ("gotcha", "convention", "how-to", "decision", "note")
VOTES = ("helpful", "not_helpful", "wrong")

lessons = sa.Table(
    "lesson_lessons",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("public_id", sa.Text, nullable=False, unique=True),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    # The project's public id (tasks plugin); null: the common collection.
    sa.Column("project_id", sa.Text, nullable=True),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("revision", sa.Integer, nullable=False),
    # The current revision's applicability, as ",a,b," (empty: any), so a
    # filter is one LIKE on either engine.
    sa.Column("task_kinds", sa.Text, nullable=False, server_default=""),
    sa.Column("tags", sa.Text, nullable=False, server_default=""),
    # Votes on the current revision, and their score
    # (helpful - not_helpful - 2 * wrong).
    sa.Column("helpful", sa.Integer, nullable=False, server_default="0"),
    sa.Column("not_helpful", sa.Integer, nullable=False, server_default="0"),
    sa.Column("wrong", sa.Integer, nullable=False, server_default="0"),
    sa.Column("score", sa.Integer, nullable=False, server_default="0"),
    sa.Column("superseded_by", sa.Text, nullable=True),
    sa.Column("superseded_at", Millis, nullable=True),
    sa.Column("superseded_reason", sa.Text, nullable=True),
    sa.Column("author_id", sa.Text, nullable=True),
    sa.Column("created_at", Millis, nullable=False),
    sa.Column("updated_at", Millis, nullable=False),
    sa.CheckConstraint(one_of("kind", KINDS), name="lesson_kind"),
)
sa.Index("lesson_lessons_space", lessons.c.space_id, lessons.c.id)
# What a claim offers: a project's (or the common collection's) live
# lessons, most useful first.
sa.Index(
    "lesson_lessons_offer",
    lessons.c.space_id,
    lessons.c.project_id,
    lessons.c.superseded_by,
    lessons.c.score,
    lessons.c.id,
)

revisions = sa.Table(
    "lesson_revisions",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("lesson_id", Id, sa.ForeignKey("lesson_lessons.id"), nullable=False),
    sa.Column("number", sa.Integer, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("title", sa.Text, nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    # JSON: {"task_kinds": [...], "paths": [...], "tags": [...]}
    sa.Column("applies_to", sa.Text, nullable=False),
    # JSON: [{"type": ..., "id": ...} or {"type": "url", "url": ...}]
    sa.Column("sources", sa.Text, nullable=False),
    sa.Column("author_id", sa.Text, nullable=True),
    sa.Column("author_kind", sa.Text, nullable=False),
    # Why it was corrected (empty on the first revision).
    sa.Column("reason", sa.Text, nullable=False, server_default=""),
    sa.Column("created_at", Millis, nullable=False),
    sa.UniqueConstraint("lesson_id", "number", name="lesson_revision_number"),
)

votes = sa.Table(
    "lesson_votes",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("lesson_id", Id, sa.ForeignKey("lesson_lessons.id"), nullable=False),
    sa.Column("revision", sa.Integer, nullable=False),
    sa.Column("principal_id", sa.Text, nullable=False),
    sa.Column("vote", sa.Text, nullable=False),
    sa.Column("note", sa.Text, nullable=False, server_default=""),
    sa.Column("created_at", Millis, nullable=False),
    sa.Column("updated_at", Millis, nullable=False),
    sa.UniqueConstraint("lesson_id", "revision", "principal_id", name="lesson_vote_once"),
    sa.CheckConstraint(one_of("vote", VOTES), name="lesson_vote_kind"),
)

TABLES = (lessons, revisions, votes)

#: A lesson's current revision: the join condition every read of what a
#: lesson says now uses.
CURRENT_REVISION = sa.and_(
    revisions.c.lesson_id == lessons.c.id, revisions.c.number == lessons.c.revision
)

#: The full-text index of every lesson's current title and text, keyed by
#: the lesson's row id and scoped to its space.
SEARCH = TextIndex("lesson_search", ("title", "text"))
