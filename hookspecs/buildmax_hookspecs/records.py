"""Small frozen records that cross the plugin boundary.

Hooks pass these instead of a plugin's own row objects, so a plugin can
change its tables without breaking another plugin. Every id here is a public
id (an opaque string); numeric database keys never cross the boundary.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .protocols import Transaction

PrincipalKind = Literal["human", "agent", "service"]
SystemRole = Literal["admin", "operator"]


@dataclass(frozen=True)
class Actor:
    """Who is acting: an authenticated principal, or the system itself.

    ``scope_type``/``scope_id`` are set when the request came with a scoped
    token (for example a token scoped to one attempt); ``acting_through``
    then names that resource for the audit trail.
    """

    principal_id: str | None
    kind: PrincipalKind | Literal["system"]
    name: str
    system_role: SystemRole | None = None
    token_id: str | None = None
    scope_type: str | None = None
    scope_id: str | None = None

    @property
    def is_system(self) -> bool:
        """True for work the server does on its own (reapers, bootstrap)."""
        return self.kind == "system"

    @property
    def acting_through(self) -> str | None:
        """``"<scope_type>:<scope_id>"`` for a scoped token, else ``None``."""
        if self.scope_type is None:
            return None
        return f"{self.scope_type}:{self.scope_id}"


SYSTEM_ACTOR = Actor(principal_id=None, kind="system", name="system")


@dataclass(frozen=True)
class ResourceRef:
    """A thing a permission is asked about: its type, public id and space."""

    type: str
    id: str | None = None
    space_id: str | None = None


@dataclass(frozen=True)
class Verdict:
    """A plugin's judgement, with a reason a person can read.

    ``outcome`` is one of ``allow``/``deny`` (claim checks, activation
    policy) or ``pending``/``pass``/``changes``/``reject`` (stage verdicts).
    """

    outcome: str
    reason: str = ""
    finding_ids: tuple[str, ...] = ()

    @property
    def allowed(self) -> bool:
        """True when the verdict lets the action go ahead."""
        return self.outcome in ("allow", "pass")


@dataclass(frozen=True)
class Grade:
    """A grader's outcome: pass or fail, one line saying why, and what it
    looked at (a small JSON-able mapping kept in the evidence bundle)."""

    passed: bool
    reason: str
    evidence: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AuditAction:
    """An audit action a plugin emits and the detail keys it may carry.

    The kernel refuses an audit event whose action was not declared or whose
    details carry a key outside ``detail_keys``: that allow-list is what keeps
    secrets and configuration values out of the trail.
    """

    name: str
    description: str
    detail_keys: frozenset[str] = frozenset()
    target_type: str | None = None


@dataclass(frozen=True)
class AuditEvent:
    """One audit event, handed to ``buildmax_audit_record`` in the transaction
    of the change it describes. ``time`` is UTC epoch milliseconds."""

    time: int
    action: str
    actor_id: str | None
    actor_kind: str
    space_id: str | None
    target_type: str | None
    target_id: str | None
    details: Mapping[str, Any] = field(default_factory=dict)
    acting_through: str | None = None
    request_id: str | None = None
    admin_override: bool = False


@dataclass(frozen=True)
class Migration:
    """One schema migration of one plugin.

    ``plugin`` is the migration namespace (normally the plugin's name); the
    kernel records applied ``(plugin, version)`` pairs and applies pending
    ones in ``version`` order, each in its own write transaction.
    ``apply(tx)`` runs SQLAlchemy DDL or Core statements through ``tx``.
    """

    plugin: str
    version: int
    name: str
    apply: Callable[[Transaction], Awaitable[None]]


@dataclass(frozen=True)
class BlobRef:
    """Where a blob lives in a store, its size in bytes and its sha256 (hex);
    from ``head`` and ``list``, also when it was last written (UTC epoch
    milliseconds), so a collector can leave young blobs of uploads in flight
    alone."""

    key: str
    size: int
    sha256: str
    modified_at: int | None = None


@dataclass(frozen=True)
class StageSpec:
    """A workflow stage a plugin supplies to the tasks plugin's stage engine.

    When a submission enters the stage, the engine creates ``slots`` linked
    work items of kind ``work_kind`` for it (each a task linked to the
    subject task and the submission). ``slots`` is a fixed count, or the
    name of an integer field of the project's workflow policy (e.g.
    ``"approvals_required"``). ``human_slot`` names a boolean policy field:
    when it is true, slot 0 is claimable by human principals only. A stage
    whose slot count comes out as 0 is skipped. With ``reserves_target``,
    each work item names the subject project's integration target as its
    resource (``repo:<repository_url>@<target_branch>``, or
    ``project:<project id>`` for a project without a repository), so the
    tasks plugin's reservations serialise that work per target.
    """

    name: str
    order: int
    work_kind: str
    slots: int | str = 1
    human_slot: str | None = None
    description: str = ""
    reserves_target: bool = False


@dataclass(frozen=True)
class ProjectRef:
    """A project as plugins see it: its public id, its space's and its name."""

    id: str
    space_id: str
    name: str


@dataclass(frozen=True)
class TaskRef:
    """A task as plugins see it. ``stage``, ``slot``, ``subject_task_id``
    and ``submission_id`` are set on linked stage work. ``criteria_sha256``
    is the sha256 (hex) of the current revision's acceptance criteria, so a
    plugin can tell whether they changed (``revision`` moves on every edit)."""

    id: str
    space_id: str
    project_id: str
    kind: str
    title: str
    state: str
    priority: int
    generation: int
    revision: int
    labels: tuple[str, ...] = ()
    agent_id: str | None = None
    stage: str | None = None
    slot: int | None = None
    human_only: bool = False
    subject_task_id: str | None = None
    submission_id: str | None = None
    resources: tuple[str, ...] = ()
    criteria_sha256: str = ""


@dataclass(frozen=True)
class AttemptRef:
    """One attempt at a task. ``claimant_kind`` is ``human``/``agent``/``service``;
    ``run_environment`` is what ``buildmax_run_environment`` resolved at its
    claim (empty while the claim is being made)."""

    id: str
    task_id: str
    space_id: str
    generation: int
    claimant_id: str
    claimant_kind: str
    state: str
    lease_expires_at: int
    agent_revision_id: str | None = None
    run_environment: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SubmissionRef:
    """The immutable candidate an attempt handed in. ``artifacts`` are the
    public ids of the artifacts it names, in the order given (the artifacts
    plugin checks them through ``buildmax_submission_check``); ``evidence``
    is free-form and checked by nobody. ``extensions`` is the data handed in
    for other plugins, by the name each declared
    (``buildmax_submission_extensions``): present only while the hand-in's
    hooks run, never kept by the tasks plugin."""

    id: str
    task_id: str
    attempt_id: str
    generation: int
    task_revision: int
    submitted_by: str
    summary: str
    candidate: Mapping[str, Any] = field(default_factory=dict)
    evidence: Mapping[str, Any] = field(default_factory=dict)
    artifacts: tuple[str, ...] = ()
    extensions: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AgentRevisionRef:
    """One immutable revision of an agent definition; ``plugins`` names the
    catalog plugins the agent selects (never versions)."""

    id: str
    agent_id: str
    space_id: str
    agent_name: str
    number: int
    instructions: str
    plugins: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReleaseRef:
    """A catalog release as activation policies see it: what it is, what
    it starts (``executable``: hooks or MCP servers) and whether a system
    admin marked it eligible for unattended use."""

    name: str
    version: str
    sha256: str
    executable: bool
    eligible: bool
    yanked: bool = False


@dataclass(frozen=True)
class Restoration:
    """What ``buildmax backup restore`` tells each plugin once the backup's
    database is in place, inside the restore's one write transaction.

    ``lost_blobs`` are the keys of blobs the backup referenced but could not
    put back (absent from the backup and from the blob store). Unless
    ``keep_tokens``, every credential issued before the restore is void (the
    kernel revokes its tokens; a plugin ends its own leases). A plugin that
    hands out fencing generations raises them by ``generation_stride``, so
    none handed out between the backup and the restore is handed out again.
    ``replay`` holds the audit events recorded after the backup (from an
    audit export, oldest first): a plugin re-applies those of its actions
    that took something away (a yanked release, a withdrawn eligibility), so
    the restore does not give it back.
    """

    manifest_sha256: str
    now: int
    lost_blobs: frozenset[str] = frozenset()
    keep_tokens: bool = False
    generation_stride: int = 0
    replay: tuple[AuditEvent, ...] = ()


#: The least space role that sees an :class:`Attention` item (``role``).
ATTENTION_ROLES = ("viewer", "member", "admin")


@dataclass(frozen=True)
class Gauge:
    """One number of a plugin's state (``buildmax_gauges``).

    ``name`` is the Prometheus metric name (``buildmax_...``), ``help`` its
    one-line description, ``labels`` its label values (fixed sets or space
    slugs: see the hook)."""

    name: str
    help: str
    value: float
    labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class Attention:
    """One thing a person should look at (``buildmax_attention``).

    ``kind`` is a stable dotted code (``lease.lapsed``); ``summary`` one
    line for a person, naming ids, never task text or a secret; ``since``
    when it began (epoch ms); ``role`` the least space role that sees it
    (one of :data:`ATTENTION_ROLES`); ``space_pk`` its space, or ``None``
    for the whole server (system admins and operators only); ``target`` a
    ``(type, public id)`` pair when it is about one record."""

    kind: str
    summary: str
    since: int | None
    space_pk: int | None
    role: str = "viewer"
    severity: str = "warning"
    target: tuple[str, str] | None = None


@dataclass(frozen=True)
class AgentTool:
    """One operation of the HTTP API offered to agents as a tool
    (``buildmax_agent_tools``; the MCP plugin serves them).

    A tool is a route, never a second implementation: calling it makes the
    request ``method path`` in-process as the caller, so the route's role
    and scope checks, validation, idempotency, fencing and audit apply
    unchanged. ``path`` is the route in OpenAPI form
    (``/v1/spaces/{space}/claims``); the tool's arguments are the path's
    parameters, then the route's query parameters (a read) or the fields of
    its JSON body (a change), with the schemas the route declares, plus
    ``idempotency_key`` where the route honours one. ``fixed`` sets
    arguments the tool does not take (``{"kind": "review"}`` makes "claim
    the next review" of "claim the next task").

    ``body = "bytes"`` is for a route whose body is raw bytes (an upload):
    the tool takes ``content`` (text) or ``content_base64`` (up to the
    serving plugin's limit, decoded) and ``media_type``, plus the route's
    query parameters.

    ``name`` is short snake case, unique across plugins; ``description`` is
    written for a model choosing among tools: when to use it, what it
    returns and which of its values later calls need. ``arguments``
    describes the path's parameters (and any argument whose schema says
    nothing), by name. A read whose arguments are all in its path may also
    be offered as a resource: ``resource`` is its URI template, with those
    parameters (``buildmax://spaces/{space}/tasks/{task}``).
    """

    name: str
    description: str
    method: str
    path: str
    title: str | None = None
    arguments: Mapping[str, str] = field(default_factory=dict)
    fixed: Mapping[str, Any] = field(default_factory=dict)
    body: Literal["json", "bytes"] = "json"
    resource: str | None = None


#: The longest title, and the longest body or criteria, a task holds, the
#: longest id of its source record and how many labels it carries: the
#: tasks plugin refuses more, and an importer's record must fit them.
TASK_TITLE_CHARS = 500
TASK_TEXT_CHARS = 100_000
SOURCE_ID_CHARS = 200
#: The most labels a task carries.
TASK_LABELS = 20
#: A task's kinds.
TASK_KINDS = ("code", "review", "integration", "general")
#: The lowest and highest priority of a task.
TASK_PRIORITIES = (-1000, 1000)
#: The most prerequisites, and the most links, a task is given at once.
TASK_LINKS = 100
#: A short lowercase word: a source's name (an importer's) and a link's kind.
WORD_PATTERN = r"^[a-z][a-z0-9-]{0,31}$"
#: The shape of a task's label (the tasks plugin refuses any other; an
#: importer makes a source's labels into it).
LABEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,63}$"
#: What an imported record becomes in the queue: ``ready`` (claimable once
#: its prerequisites are done), ``held`` (ready, under a hold a person
#: lifts: work that may still be going on elsewhere), ``done`` or
#: ``canceled`` (closed, and never reopened by an import).
IMPORT_STATES = ("ready", "held", "done", "canceled")
#: The kinds of link an imported record may carry besides a prerequisite
#: (``prerequisite`` links become the task's prerequisites; these are kept
#: on the task as they are). An importer may use a kind of its source's own.
IMPORT_LINK_KINDS = ("parent", "related", "discovered-from")


@dataclass(frozen=True)
class SourceLink:
    """A link from an imported record to another record of the same
    source, named by its source id: ``prerequisite`` (the other must be
    done first) or a link kept as it is (``parent``, ``related``,
    ``discovered-from``, or the source's own word)."""

    kind: str
    target: str


@dataclass(frozen=True)
class SourceRecord:
    """One record of a backlog as an importer read it, in BuildMax's terms
    (``buildmax_importers``): what the task it becomes holds.

    ``source_id`` is the record's id in its source, stable across exports
    (what a re-import matches on); ``line`` is where it starts in the file
    (1-based). ``state`` is one of :data:`IMPORT_STATES`, ``source_state``
    the source's own word for it and ``state_reason`` why the one became the
    other when that is not obvious (``in progress in the source: held until
    a person releases it``). ``priority`` is BuildMax's (-1000..1000, 0 the
    default), ``kind`` one of the task kinds (``code``, ``review``,
    ``integration``, ``general``), ``labels`` task labels. ``warnings`` says
    what was read and not kept, or kept changed (an unknown field, a label
    rewritten), so that a preview shows it: an importer drops nothing
    silently."""

    source_id: str
    line: int
    title: str
    body: str = ""
    criteria: str = ""
    state: str = "ready"
    source_state: str = ""
    state_reason: str = ""
    priority: int = 0
    kind: str = "general"
    labels: tuple[str, ...] = ()
    assignee: str | None = None
    created_at: str | None = None
    closed_at: str | None = None
    close_reason: str | None = None
    url: str | None = None
    links: tuple[SourceLink, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class SourceProblem:
    """A part of a source file an importer could not read as a record:
    ``line`` (1-based) and the reason, in words a person can act on, with
    the record's ``source_id`` when it was read. The rest of the file is
    still read."""

    line: int
    reason: str
    source_id: str | None = None


@dataclass(frozen=True)
class ImportedTask:
    """What importing one record did to its task (``TaskQueue.import_record``):
    the task, its revision and state after, what changed (``created``,
    ``revised``, ``held``, ``closed``, ``prerequisites``, ``links``; none
    when it already said what the record says), what was not applied, and
    why (``notes``), and whether the record is applied (false while someone
    holds the task: a later import applies it then)."""

    task_id: str
    revision: int
    state: str
    changes: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    applied: bool = True
