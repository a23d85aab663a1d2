"""The tasks plugin's tables (every name starts with ``task_``).

Types follow the kernel's rule (Integer/BigInteger/Text only): JSON is Text,
flags are integers, timestamps are UTC epoch milliseconds. Foreign keys
point at the kernel's ``spaces`` and ``principals`` by numeric key; numeric
keys never leave the server.
"""

from __future__ import annotations

import sqlalchemy as sa
from buildmax_hookspecs import TASK_KINDS

from buildmax.tables import Id, Millis, one_of

metadata = sa.MetaData()

#: A kernel table referenced by foreign key (declared here only for DDL).
_spaces = sa.Table("spaces", metadata, sa.Column("id", Id, primary_key=True))
_principals = sa.Table("principals", metadata, sa.Column("id", Id, primary_key=True))

TASK_STATES = ("open", "ready", "claimed", "waiting", "done", "canceled", "failed")
ATTEMPT_STATES = ("active", "submitted", "released", "expired", "canceled", "failed")
HOLD_STRENGTHS = ("suspended", "stopped")
HOLD_SCOPES = ("space", "project", "task")
INTEGRATION_MODES = ("automatic", "human")


projects = sa.Table(
    "task_projects",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("public_id", sa.Text, nullable=False, unique=True),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("description", sa.Text, nullable=False, server_default=""),
    sa.Column("repository_url", sa.Text, nullable=True),
    sa.Column("target_branch", sa.Text, nullable=True),
    # Current workflow policy revision (task_policies.id).
    sa.Column("policy_id", Id, nullable=True),
    # Bumped on every edit; edits carry the revision they saw.
    sa.Column("revision", sa.Integer, nullable=False, server_default="1"),
    sa.Column("created_at", Millis, nullable=False),
    sa.Column("created_by", Id, sa.ForeignKey("principals.id"), nullable=True),
    sa.Column("updated_at", Millis, nullable=False),
    sa.UniqueConstraint("space_id", "name", name="task_project_name"),
)

policies = sa.Table(
    "task_policies",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("project_id", Id, sa.ForeignKey("task_projects.id"), nullable=False),
    sa.Column("revision", sa.Integer, nullable=False),
    sa.Column("approvals_required", sa.Integer, nullable=False),
    sa.Column("human_review_required", sa.Integer, nullable=False),
    sa.Column("integration", sa.Text, nullable=False),
    sa.Column("created_at", Millis, nullable=False),
    sa.Column("created_by", Id, sa.ForeignKey("principals.id"), nullable=True),
    sa.UniqueConstraint("project_id", "revision", name="task_policy_revision"),
    sa.CheckConstraint(one_of("integration", INTEGRATION_MODES), name="task_policy_integration"),
)

agents = sa.Table(
    "task_agents",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("public_id", sa.Text, nullable=False, unique=True),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("current_revision_id", Id, nullable=True),
    sa.Column("created_at", Millis, nullable=False),
    sa.Column("created_by", Id, sa.ForeignKey("principals.id"), nullable=True),
    sa.UniqueConstraint("space_id", "name", name="task_agent_name"),
)

agent_revisions = sa.Table(
    "task_agent_revisions",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("public_id", sa.Text, nullable=False, unique=True),
    sa.Column("agent_id", Id, sa.ForeignKey("task_agents.id"), nullable=False),
    sa.Column("number", sa.Integer, nullable=False),
    sa.Column("instructions", sa.Text, nullable=False),
    # JSON array of plugin names (never versions).
    sa.Column("plugins", sa.Text, nullable=False),
    sa.Column("created_at", Millis, nullable=False),
    sa.Column("created_by", Id, sa.ForeignKey("principals.id"), nullable=True),
    sa.UniqueConstraint("agent_id", "number", name="task_agent_revision_number"),
)

#: One row per (agent revision, plugin named), so "which agents name X" is indexed.
agent_plugins = sa.Table(
    "task_agent_plugins",
    metadata,
    sa.Column("revision_id", Id, sa.ForeignKey("task_agent_revisions.id"), primary_key=True),
    sa.Column("plugin", sa.Text, primary_key=True),
)
sa.Index("task_agent_plugins_plugin", agent_plugins.c.plugin)

tasks = sa.Table(
    "task_tasks",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("public_id", sa.Text, nullable=False, unique=True),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    sa.Column("project_id", Id, sa.ForeignKey("task_projects.id"), nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("title", sa.Text, nullable=False),
    sa.Column("priority", sa.Integer, nullable=False, server_default="0"),
    # JSON array of label strings.
    sa.Column("labels", sa.Text, nullable=False, server_default="[]"),
    # JSON array of the canonical resources a claim reserves (sorted).
    sa.Column("resources", sa.Text, nullable=False, server_default="[]"),
    sa.Column("agent_id", Id, sa.ForeignKey("task_agents.id"), nullable=True),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("stage", sa.Text, nullable=True),
    # Linked stage work: the subject task, the submission and the slot.
    sa.Column("subject_task_id", Id, sa.ForeignKey("task_tasks.id"), nullable=True),
    sa.Column("subject_submission_id", Id, nullable=True),
    sa.Column("slot", sa.Integer, nullable=True),
    sa.Column("human_only", sa.Integer, nullable=False, server_default="0"),
    sa.Column("max_attempts", sa.Integer, nullable=False, server_default="3"),
    # Attempts spent against max_attempts (failures and lapsed leases).
    sa.Column("attempts_used", sa.Integer, nullable=False, server_default="0"),
    sa.Column("generation", sa.Integer, nullable=False, server_default="0"),
    sa.Column("revision", sa.Integer, nullable=False, server_default="1"),
    sa.Column("current_attempt_id", Id, nullable=True),
    sa.Column("current_submission_id", Id, nullable=True),
    # JSON array of finding ids a "changes" verdict attached for the next attempt.
    sa.Column("finding_ids", sa.Text, nullable=False, server_default="[]"),
    sa.Column("outcome_reason", sa.Text, nullable=True),
    # When the task last became ready: the queue's age order.
    sa.Column("ready_at", Millis, nullable=True),
    sa.Column("created_at", Millis, nullable=False),
    sa.Column("created_by", Id, sa.ForeignKey("principals.id"), nullable=True),
    sa.Column("updated_at", Millis, nullable=False),
    # Where an imported task came from: the source (``beads``) and its id
    # there, unique in the space, so a re-import finds the task it made.
    sa.Column("source_system", sa.Text, nullable=True),
    sa.Column("source_id", sa.Text, nullable=True),
    # JSON array of {"kind", "task"}: links to other tasks of the space that
    # are not prerequisites (an imported parent, a related task).
    sa.Column("links", sa.Text, nullable=False, server_default="[]"),
    sa.CheckConstraint(one_of("kind", TASK_KINDS), name="task_kind"),
    sa.CheckConstraint(one_of("state", TASK_STATES), name="task_state"),
    sa.CheckConstraint("max_attempts >= 1", name="task_max_attempts"),
)
#: The ready queue: only ready rows are indexed, so history costs nothing.
_READY = sa.text("state = 'ready'")
sa.Index(
    "task_tasks_ready",
    tasks.c.space_id,
    tasks.c.priority.desc(),
    tasks.c.ready_at,
    tasks.c.id,
    sqlite_where=_READY,
    postgresql_where=_READY,
)
sa.Index("task_tasks_project", tasks.c.project_id, tasks.c.id)
sa.Index("task_tasks_space_state", tasks.c.space_id, tasks.c.state, tasks.c.id)
#: A space's tasks newest first (the task list) without sorting them all,
#: and a project's in one state (the task list by project and state).
TASKS_BY_SPACE = sa.Index("task_tasks_space", tasks.c.space_id, tasks.c.id)
TASKS_BY_PROJECT_STATE = sa.Index(
    "task_tasks_project_state", tasks.c.project_id, tasks.c.state, tasks.c.id
)
#: One task per source record in a space (migration tasks 6).
TASKS_BY_SOURCE = sa.Index(
    "task_tasks_source",
    tasks.c.space_id,
    tasks.c.source_system,
    tasks.c.source_id,
    unique=True,
)
_LINKED = sa.text("subject_submission_id IS NOT NULL")
#: Stage work is created exactly once per submission, stage and slot.
sa.Index(
    "task_tasks_linked_work",
    tasks.c.subject_submission_id,
    tasks.c.stage,
    tasks.c.slot,
    unique=True,
    sqlite_where=_LINKED,
    postgresql_where=_LINKED,
)
sa.Index("task_tasks_subject", tasks.c.subject_task_id)

task_revisions = sa.Table(
    "task_revisions",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("task_id", Id, sa.ForeignKey("task_tasks.id"), nullable=False),
    sa.Column("number", sa.Integer, nullable=False),
    sa.Column("title", sa.Text, nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("criteria", sa.Text, nullable=False),
    sa.Column("created_at", Millis, nullable=False),
    sa.Column("created_by", Id, sa.ForeignKey("principals.id"), nullable=True),
    sa.UniqueConstraint("task_id", "number", name="task_revision_number"),
)

dependencies = sa.Table(
    "task_dependencies",
    metadata,
    sa.Column("task_id", Id, sa.ForeignKey("task_tasks.id"), primary_key=True),
    sa.Column("prerequisite_id", Id, sa.ForeignKey("task_tasks.id"), primary_key=True),
    sa.Column("created_at", Millis, nullable=False),
    sa.CheckConstraint("task_id <> prerequisite_id", name="task_dependency_not_self"),
)
sa.Index("task_dependencies_prerequisite", dependencies.c.prerequisite_id)

attempts = sa.Table(
    "task_attempts",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("public_id", sa.Text, nullable=False, unique=True),
    sa.Column("task_id", Id, sa.ForeignKey("task_tasks.id"), nullable=False),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    sa.Column("generation", sa.Integer, nullable=False),
    sa.Column("claimant_id", Id, sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("agent_revision_id", Id, sa.ForeignKey("task_agent_revisions.id"), nullable=True),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("lease_expires_at", Millis, nullable=False),
    # JSON: what buildmax_run_environment returned at claim.
    sa.Column("run_environment", sa.Text, nullable=False, server_default="{}"),
    # JSON: the last progress report of a renewal.
    sa.Column("progress", sa.Text, nullable=True),
    # The scoped token issued at claim (tokens.public_id).
    sa.Column("token_id", sa.Text, nullable=True),
    # Set when a stopped hold refused a renewal: the lapse is not charged.
    sa.Column("hold_refused_at", Millis, nullable=True),
    sa.Column("charged", sa.Integer, nullable=False, server_default="0"),
    sa.Column("end_reason", sa.Text, nullable=True),
    sa.Column("created_at", Millis, nullable=False),
    sa.Column("renewed_at", Millis, nullable=True),
    sa.Column("ended_at", Millis, nullable=True),
    sa.UniqueConstraint("task_id", "generation", name="task_attempt_generation"),
    sa.CheckConstraint(one_of("state", ATTEMPT_STATES), name="task_attempt_state"),
)
_ACTIVE = sa.text("state = 'active'")
#: At most one active attempt per task, whatever the code above it does.
sa.Index(
    "task_attempts_one_active",
    attempts.c.task_id,
    unique=True,
    sqlite_where=_ACTIVE,
    postgresql_where=_ACTIVE,
)
#: The reaper's scan: active attempts by lease end.
sa.Index(
    "task_attempts_lease",
    attempts.c.lease_expires_at,
    sqlite_where=_ACTIVE,
    postgresql_where=_ACTIVE,
)
sa.Index("task_attempts_task", attempts.c.task_id, attempts.c.generation)

checkpoints = sa.Table(
    "task_checkpoints",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("attempt_id", Id, sa.ForeignKey("task_attempts.id"), nullable=False),
    sa.Column("data", sa.Text, nullable=False),
    sa.Column("created_at", Millis, nullable=False),
)
sa.Index("task_checkpoints_attempt", checkpoints.c.attempt_id, checkpoints.c.id)

submissions = sa.Table(
    "task_submissions",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("public_id", sa.Text, nullable=False, unique=True),
    sa.Column("task_id", Id, sa.ForeignKey("task_tasks.id"), nullable=False),
    sa.Column("attempt_id", Id, sa.ForeignKey("task_attempts.id"), nullable=False, unique=True),
    sa.Column("generation", sa.Integer, nullable=False),
    sa.Column("task_revision", sa.Integer, nullable=False),
    sa.Column("submitted_by", Id, sa.ForeignKey("principals.id"), nullable=False),
    sa.Column("summary", sa.Text, nullable=False),
    sa.Column("candidate", sa.Text, nullable=False),
    sa.Column("evidence", sa.Text, nullable=False),
    sa.Column("verdict", sa.Text, nullable=True),
    sa.Column("created_at", Millis, nullable=False),
)
sa.Index("task_submissions_task", submissions.c.task_id, submissions.c.id)

#: Live reservations only: a row exists while its attempt holds the resource.
reservations = sa.Table(
    "task_reservations",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    sa.Column("resource", sa.Text, nullable=False),
    # The holding attempt's public id (known before its row is written).
    sa.Column("attempt_public_id", sa.Text, nullable=False),
    sa.Column("created_at", Millis, nullable=False),
    sa.UniqueConstraint("space_id", "resource", name="task_reservation_resource"),
)
sa.Index("task_reservations_attempt", reservations.c.attempt_public_id)

holds = sa.Table(
    "task_holds",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("public_id", sa.Text, nullable=False, unique=True),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    sa.Column("scope_type", sa.Text, nullable=False),
    # task_projects.id or task_tasks.id; NULL for the whole space.
    sa.Column("scope_pk", Id, nullable=True),
    sa.Column("strength", sa.Text, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("created_by", Id, sa.ForeignKey("principals.id"), nullable=True),
    sa.Column("created_at", Millis, nullable=False),
    sa.Column("lifted_by", Id, sa.ForeignKey("principals.id"), nullable=True),
    sa.Column("lifted_at", Millis, nullable=True),
    sa.CheckConstraint(one_of("strength", HOLD_STRENGTHS), name="task_hold_strength"),
    sa.CheckConstraint(one_of("scope_type", HOLD_SCOPES), name="task_hold_scope"),
)
_LIVE = sa.text("lifted_at IS NULL")
sa.Index(
    "task_holds_live",
    holds.c.space_id,
    holds.c.scope_type,
    holds.c.scope_pk,
    sqlite_where=_LIVE,
    postgresql_where=_LIVE,
)

decisions = sa.Table(
    "task_decisions",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("public_id", sa.Text, nullable=False, unique=True),
    sa.Column("space_id", Id, sa.ForeignKey("spaces.id"), nullable=False),
    sa.Column("task_id", Id, sa.ForeignKey("task_tasks.id"), nullable=False),
    sa.Column("question", sa.Text, nullable=False),
    # JSON array of the allowed answers.
    sa.Column("options", sa.Text, nullable=False),
    sa.Column("answerable_by", sa.Text, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
    sa.Column("answer", sa.Text, nullable=True),
    sa.Column("comment", sa.Text, nullable=True),
    sa.Column("opened_by", Id, sa.ForeignKey("principals.id"), nullable=True),
    sa.Column("answered_by", Id, sa.ForeignKey("principals.id"), nullable=True),
    sa.Column("created_at", Millis, nullable=False),
    sa.Column("expires_at", Millis, nullable=True),
    sa.Column("answered_at", Millis, nullable=True),
    sa.CheckConstraint("state IN ('pending', 'answered', 'canceled')", name="task_decision_state"),
    sa.CheckConstraint("answerable_by IN ('human', 'member')", name="task_decision_answerer"),
)
_PENDING = sa.text("state = 'pending'")
sa.Index(
    "task_decisions_pending",
    decisions.c.space_id,
    decisions.c.task_id,
    sqlite_where=_PENDING,
    postgresql_where=_PENDING,
)
sa.Index("task_decisions_task", decisions.c.task_id)

#: The artifacts a submission names (only for submissions naming any).
submission_artifacts = sa.Table(
    "task_submission_artifacts",
    metadata,
    sa.Column("submission_id", Id, sa.ForeignKey("task_submissions.id"), primary_key=True),
    # JSON array of artifact public ids, in the order handed in.
    sa.Column("artifact_ids", sa.Text, nullable=False),
)

#: Created by migration 1, in dependency order.
TABLES = [
    projects,
    policies,
    agents,
    agent_revisions,
    agent_plugins,
    tasks,
    task_revisions,
    dependencies,
    attempts,
    checkpoints,
    submissions,
    reservations,
    holds,
    decisions,
]
#: Created by migration 2.
TABLES_2 = [submission_artifacts]
