"""The reviews plugin's tables (every name starts with ``review_``).

Tasks, submissions and attempts belong to the tasks plugin: they are named
here by public id, never joined. ``review_activities`` holds one row per
work item the review and integrate stages created (unique per submission,
kind and slot); ``review_reviews`` and ``review_integrations`` hold what was
handed in for one of them (at most one each), ``review_findings`` the
findings of a review, each resolvable later.
"""

from __future__ import annotations

import sqlalchemy as sa

from buildmax.tables import Id, Millis, one_of

metadata = sa.MetaData()

#: Kernel tables referenced by foreign key (declared here only for DDL).
_spaces = sa.Table("spaces", metadata, sa.Column("id", Id, primary_key=True))

KINDS = ("review", "integration")
DECISIONS = ("approve", "request_changes", "reject")
SEVERITIES = ("blocker", "major", "minor", "note")
OUTCOMES = ("merged", "failed")


activities = sa.Table(
    "review_activities",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    # Public ids (tasks plugin): the subject, its submission, the work item.
    sa.Column("subject_task_id", sa.Text, nullable=False),
    sa.Column("submission_id", sa.Text, nullable=False),
    sa.Column("work_task_id", sa.Text, nullable=False, unique=True),
    sa.Column("slot", sa.Integer, nullable=False),
    sa.Column("human_only", sa.Integer, nullable=False, server_default="0"),
    # The subject's revision the submission was made against, and the
    # sha256 of its acceptance criteria then (a change makes reviews stale).
    sa.Column("task_revision", sa.Integer, nullable=False),
    sa.Column("criteria_sha256", sa.Text, nullable=False),
    # Integration: the reserved target, and the decision a human answers first.
    sa.Column("target", sa.Text, nullable=True),
    sa.Column("decision_id", sa.Text, nullable=True),
    sa.Column("created_at", Millis, nullable=False),
    sa.UniqueConstraint("submission_id", "kind", "slot", name="review_activity_slot"),
    sa.CheckConstraint(one_of("kind", KINDS), name="review_activity_kind"),
)
sa.Index("review_activities_space", activities.c.space_id, activities.c.id)
sa.Index("review_activities_subject", activities.c.subject_task_id, activities.c.id)

reviews = sa.Table(
    "review_reviews",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("public_id", sa.Text, nullable=False, unique=True),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    sa.Column(
        "activity_id", Id, sa.ForeignKey("review_activities.id"), nullable=False, unique=True
    ),
    sa.Column("subject_task_id", sa.Text, nullable=False),
    sa.Column("submission_id", sa.Text, nullable=False),
    sa.Column("attempt_id", sa.Text, nullable=False),
    # Principal public id and kind: a review is human only if its author is.
    sa.Column("reviewer_id", sa.Text, nullable=False),
    sa.Column("reviewer_kind", sa.Text, nullable=False),
    sa.Column("decision", sa.Text, nullable=False),
    sa.Column("summary", sa.Text, nullable=False, server_default=""),
    sa.Column("task_revision", sa.Integer, nullable=False),
    sa.Column("created_at", Millis, nullable=False),
    sa.CheckConstraint(one_of("decision", DECISIONS), name="review_decision"),
)
sa.Index("review_reviews_submission", reviews.c.submission_id)

findings = sa.Table(
    "review_findings",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("public_id", sa.Text, nullable=False, unique=True),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    sa.Column("review_id", Id, sa.ForeignKey("review_reviews.id"), nullable=False),
    sa.Column("subject_task_id", sa.Text, nullable=False),
    sa.Column("severity", sa.Text, nullable=False),
    sa.Column("path", sa.Text, nullable=True),
    sa.Column("line", sa.Integer, nullable=True),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("resolved_at", Millis, nullable=True),
    sa.Column("resolved_by", sa.Text, nullable=True),
    sa.Column("resolution", sa.Text, nullable=True),
    sa.Column("created_at", Millis, nullable=False),
    sa.CheckConstraint(one_of("severity", SEVERITIES), name="review_finding_severity"),
)
sa.Index("review_findings_subject", findings.c.subject_task_id, findings.c.id)
sa.Index("review_findings_review", findings.c.review_id)

integrations = sa.Table(
    "review_integrations",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("public_id", sa.Text, nullable=False, unique=True),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    sa.Column(
        "activity_id", Id, sa.ForeignKey("review_activities.id"), nullable=False, unique=True
    ),
    sa.Column("subject_task_id", sa.Text, nullable=False),
    sa.Column("submission_id", sa.Text, nullable=False),
    sa.Column("attempt_id", sa.Text, nullable=False),
    sa.Column("integrator_id", sa.Text, nullable=False),
    sa.Column("integrator_kind", sa.Text, nullable=False),
    sa.Column("target", sa.Text, nullable=False),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("before_ref", sa.Text, nullable=True),
    sa.Column("after_ref", sa.Text, nullable=True),
    sa.Column("reason", sa.Text, nullable=True),
    sa.Column("created_at", Millis, nullable=False),
    sa.CheckConstraint(one_of("outcome", OUTCOMES), name="review_integration_outcome"),
)
sa.Index("review_integrations_subject", integrations.c.subject_task_id, integrations.c.id)

#: Review work nothing is recorded on yet: a row per review activity,
#: written with it and deleted once its review is recorded or its slot given
#: up (another slot asked for changes or rejected, or a newer submission of
#: the subject entered review). What waits is read from here, not from
#: every activity there ever was. A slot ended by other means (the subject
#: or the work item canceled) keeps its row; a reader asks the task queue
#: whether the work item is still open.
waiting = sa.Table(
    "review_waiting",
    metadata,
    sa.Column("activity_id", Id, sa.ForeignKey("review_activities.id"), primary_key=True),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    sa.Column("created_at", Millis, nullable=False),
)
sa.Index("review_waiting_space", waiting.c.space_id, waiting.c.created_at)
sa.Index("review_waiting_age", waiting.c.created_at)

#: Created by migration 1.
TABLES = [activities, reviews, findings, integrations]
#: Created by migration 2.
TABLES_2 = [waiting]
