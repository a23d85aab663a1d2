"""Protocols that services implement and plugins consume.

A provider registers an implementation through ``buildmax_services``; a
consumer asks the app for it with ``app.services.get(Protocol)``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Protocol, runtime_checkable

from .records import (
    Actor,
    AgentRevisionRef,
    AttemptRef,
    BlobRef,
    Grade,
    ImportedTask,
    ProjectRef,
    SourceProblem,
    SourceRecord,
    SubmissionRef,
    TaskRef,
)

Row = Mapping[str, Any]


@runtime_checkable
class Transaction(Protocol):
    """A database transaction (or read connection) given to plugins.

    Every method takes a SQLAlchemy Core statement, so one query serves both
    SQLite and PostgreSQL. ``params`` fills ``sqlalchemy.bindparam``
    placeholders: a statement built once at import time with bindparams is
    compiled once and reused, which matters on hot paths. ``dialect`` is
    ``"sqlite"`` or ``"postgresql"`` for the rare statement that must differ.
    """

    dialect: str

    async def execute(self, statement: Any, params: Mapping[str, Any] | None = None) -> None:
        """Run a statement that returns no rows (use RETURNING + fetch_* for values)."""

    async def fetch_one(
        self, statement: Any, params: Mapping[str, Any] | None = None
    ) -> Row | None:
        """The first row as a mapping of column name to value, or ``None``."""

    async def fetch_all(
        self, statement: Any, params: Mapping[str, Any] | None = None
    ) -> Sequence[Row]:
        """Every row, each a mapping of column name to value."""

    async def fetch_val(self, statement: Any, params: Mapping[str, Any] | None = None) -> Any:
        """The first column of the first row, or ``None``."""

    def after_commit(self, callback: Callable[[], Any]) -> None:
        """Run ``callback`` (sync, or returning an awaitable) once this
        transaction has committed; never when it rolls back."""

    def after_rollback(self, callback: Callable[[], Awaitable[None]]) -> None:
        """Await ``callback()`` once this write transaction has rolled back,
        before the exception that rolled it back goes on; never when it
        commits. For what a refusal must still record: the callback opens a
        write transaction of its own."""

    def before_commit(self, callback: Callable[[], Awaitable[None]], *, last: bool = False) -> None:
        """Await ``callback()`` inside this write transaction just before it
        commits, in registration order; an exception rolls the transaction
        back. (Batch work that holds a lock until commit, such as publishing
        events, goes here.) ``last=True`` callbacks run after every other
        one, even one registered meanwhile: for a lock that many transactions
        contend on (an audit chain's head), taken last so it is held only
        until COMMIT and always after any other lock."""


#: The first key segment stores keep their temporary bytes under.
BLOB_TMP_DIR = ".tmp"


class BlobKeyError(ValueError):
    """A blob key or prefix that is not a plain relative path (it could leave
    a store's root or reach its temporary bytes)."""


def check_blob_key(key: str) -> str:
    """``key`` if it is a valid blob key or prefix: ``/``-separated segments,
    none empty, ``.`` or ``..``, no backslash or NUL, not under
    :data:`BLOB_TMP_DIR`; else :class:`BlobKeyError`. Every store applies it
    to every key it is given."""
    parts = key.split("/")
    if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise BlobKeyError(f"invalid blob key {key!r}")
    if parts[0] == BLOB_TMP_DIR or "\\" in key or "\x00" in key:
        raise BlobKeyError(f"invalid blob key {key!r}")
    return key


class BlobStoreUnavailable(Exception):
    """Raised by a :class:`BlobStore` that cannot reach its backend or whose
    backend failed (an outage, a timeout, refused credentials). The kernel
    answers such a request with a 503 ``blob-store-unavailable`` problem; a
    failed put has left nothing visible, as with any other failure."""


class BlobTooLarge(Exception):
    """Raised by :meth:`BlobStore.put` when a stream exceeds ``max_bytes``.

    Nothing is left behind: the temporary object is removed first."""

    def __init__(self, max_bytes: int) -> None:
        super().__init__(f"blob exceeds the limit of {max_bytes} bytes")
        self.max_bytes = max_bytes


class BlobNotFound(Exception):
    """Raised when a key names no blob in the store."""


class BlobDigestMismatch(Exception):
    """Raised by :meth:`BlobStore.put` when the bytes' sha256 is not the one
    expected. Nothing is left behind: the temporary object is removed first."""

    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(f"the bytes' sha256 is {actual}, not the expected {expected}")
        self.expected, self.actual = expected, actual


@runtime_checkable
class BlobStore(Protocol):
    """Content-addressed blob storage (filesystem, S3, ...)."""

    async def put(
        self,
        prefix: str,
        stream: AsyncIterator[bytes],
        *,
        max_bytes: int | None = None,
        expected_sha256: str | None = None,
    ) -> BlobRef:
        """Store a stream under ``<prefix>/sha256/<digest>``.

        The bytes are written to a temporary object and moved into place only
        once complete, so a failed, oversized or mismatched upload leaves
        nothing under the prefix. Raises :class:`BlobTooLarge` past
        ``max_bytes`` and :class:`BlobDigestMismatch` when the digest is not
        ``expected_sha256`` (lowercase hex)."""

    def open(self, key: str, byte_range: tuple[int, int] | None = None) -> AsyncIterator[bytes]:
        """Stream a blob's bytes; ``byte_range`` is ``(start, end)`` inclusive.
        Raises :class:`BlobNotFound` when the key is absent."""

    async def head(self, key: str) -> BlobRef | None:
        """The blob's reference, or ``None`` when absent."""

    async def delete(self, key: str) -> bool:
        """Remove a blob; ``True`` if it existed."""

    def list(self, prefix: str) -> AsyncIterator[BlobRef]:
        """Every blob whose key starts with ``prefix``."""

    async def aclose(self) -> None:
        """Release connections and clients; the kernel calls it once when
        the app stops (server or command). A later call may reopen them."""

    async def sweep_temporary(self, older_than: int) -> int:
        """Remove the temporary bytes of puts that never finished (their
        server died) begun or last written before ``older_than`` (UTC epoch
        milliseconds); how many things were removed. A put in flight is
        younger than any sane cut-off."""


@runtime_checkable
class TaskQueue(Protocol):
    """The tasks plugin's capability, for stage plugins and the marketplace.

    Reads take any :class:`Transaction` (a read connection, or the caller's
    write transaction to see its own writes). Task state is written only by
    the tasks plugin: a stage plugin steers it by returning a ``Verdict``
    from ``buildmax_attempt_submitted``.
    """

    async def task(self, conn: Transaction, task_id: str) -> TaskRef | None:
        """A task by public id, or ``None``."""

    async def attempt(self, conn: Transaction, attempt_id: str) -> AttemptRef | None:
        """An attempt by public id, or ``None``."""

    async def submission(self, conn: Transaction, submission_id: str) -> SubmissionRef | None:
        """A submission by public id, or ``None``."""

    async def submissions(self, conn: Transaction, task_id: str) -> Sequence[SubmissionRef]:
        """Every submission of a task, oldest first."""

    async def project(self, conn: Transaction, space_id: str, ref: str) -> ProjectRef | None:
        """A project of the space ``space_id`` by public id or name, or ``None``."""

    async def policy(self, conn: Transaction, project_id: str) -> Mapping[str, Any]:
        """The project's current workflow policy: ``revision``,
        ``approvals_required``, ``human_review_required``, ``integration``."""

    async def agent_revision(self, conn: Transaction, revision_id: str) -> AgentRevisionRef | None:
        """An agent revision by public id, or ``None``."""

    async def agents_naming(
        self, conn: Transaction, space_id: str, plugin: str
    ) -> Sequence[AgentRevisionRef]:
        """The current revisions of the space's agents whose selection names ``plugin``."""

    async def agents(self, conn: Transaction, space_id: str) -> Sequence[AgentRevisionRef]:
        """The current revisions of the space's agents, by name."""

    async def tasks(self, conn: Transaction, task_ids: Sequence[str]) -> Mapping[str, TaskRef]:
        """Tasks by public id, in one read (ids not found are left out)."""

    async def attempts(self, conn: Transaction, task_id: str) -> Sequence[AttemptRef]:
        """Every attempt at a task, by generation."""

    async def sourced(
        self, conn: Transaction, space_id: str, system: str, source_ids: Sequence[str]
    ) -> Mapping[str, TaskRef]:
        """The tasks of the space made from records of the source ``system``,
        by the record's id (ids no task names are left out)."""

    async def linked_work(self, conn: Transaction, submission_id: str) -> Sequence[TaskRef]:
        """The stage work items created for a submission, by stage order and slot."""

    async def fence(
        self,
        tx: Transaction,
        attempt_id: str,
        generation: int,
        *,
        actor: Actor,
        space_id: str,
        override_reason: str | None = None,
    ) -> AttemptRef:
        """The attempt ``attempt_id`` of space ``space_id``, if ``actor`` may
        write on its behalf now; else the tasks plugin's problem, exactly as
        its own attempt routes answer a stale write: 404 ``not-found`` (no
        such attempt in that space), 403 ``not-attempt-owner`` (another
        principal's attempt, or a token scoped to another attempt), 409
        ``stale-generation``, ``attempt-ended`` or ``lease-lapsed``.

        ``actor`` may write when it is the attempt's claimant (its own token
        or the attempt's token). A space admin or owner of the attempt's
        space, or a system admin, may write on someone else's attempt by
        giving ``override_reason``; the caller then records the reason, as
        an admin override, in the audit event of its write (the returned
        attempt's ``claimant_id`` is not ``actor``'s). Nobody else may.

        Call it in the write transaction that records what depends on the
        attempt: the attempt's task row stays locked until that transaction
        ends, so the attempt cannot end between this check and the write.
        On a read connection it answers the same but holds nothing (an early
        refusal before costly work, to be repeated in the write).
        """

    async def hand_in(
        self,
        tx: Transaction,
        task_id: str,
        *,
        actor: Actor,
        summary: str,
        candidate: Mapping[str, Any],
        generation: int | None = None,
        extensions: Mapping[str, Any] | None = None,
    ) -> Mapping[str, Any]:
        """Hand in work on ``task_id`` for ``actor``, exactly as the submit
        route does (``buildmax_attempt_submitted`` judges it, the stage
        engine applies the verdict); ``extensions`` carries other plugins'
        data under the names they declared, as a submit body's does.

        When ``actor`` holds the task's active attempt, that attempt is
        handed in (fenced at ``generation`` when given). When the task is
        unheld and ``actor`` is a human, it is claimed and handed in at once,
        under every claim check, with no lease or token left behind. Raises
        the tasks plugin's problems (403/404/409) otherwise. The caller
        checks first that ``actor`` is a member of the task's space. Returns
        ``{"submission_id", "attempt_id", "generation", "task_state"}``.
        """

    async def open_decision(
        self,
        tx: Transaction,
        task_id: str,
        *,
        question: str,
        options: Sequence[str],
        actor: Actor,
        answerable_by: str = "human",
        expires_at: int | None = None,
    ) -> str:
        """Open a human-required decision on a task (it parks the task until
        answered or expired); audited; returns the decision's public id.
        ``answerable_by`` is ``human`` (human members) or ``member`` (any member)."""

    async def import_record(
        self,
        tx: Transaction,
        record: SourceRecord,
        *,
        system: str,
        space_id: str,
        project_id: str,
        actor: Actor,
        task_id: str | None,
        revision: int | None,
        prerequisites: Sequence[str],
        links: Sequence[tuple[str, str]],
        hold: bool = True,
        admin_override: bool = False,
    ) -> ImportedTask:
        """Make the task of ``record`` (of the source ``system``) say what
        the record says, in ``tx``, audited and announced as ``actor``'s
        own edits are.

        Without ``task_id``, a task of ``project_id`` is created with the
        source identity ``(system, record.source_id)``: ``ready`` (or
        ``open`` until its prerequisites are done), ``held`` as ``ready``
        under a hold on the task, or closed (``done``, ``canceled``) with
        the record's close reason. With ``task_id``, that task is updated,
        409 ``revision-conflict`` unless it is at ``revision`` (what the
        caller last saw): what differs of its title, body, criteria,
        priority and labels is its next revision; missing
        ``prerequisites`` and ``links`` are added (an import removes none;
        pass only those new in the source, so that one a person took away
        stays away); a record ``held`` puts a hold on a task that has none
        when ``hold`` (false: it was held when last applied); a record
        closed in the source closes the task when nobody holds it (its
        dependents go ready). A task closed here is never reopened or
        revised, and a task someone holds is not revised or closed: the
        outcome's notes say so, and ``applied`` is false. ``prerequisites``
        name tasks of the space; ``links`` are ``(kind, task id)``.
        ``admin_override`` marks the audit events as an admin acting in a
        space it is no member of. Raises the tasks plugin's problems (404,
        409 ``task-source-taken``, 422) for what it cannot do; the caller
        checks ``actor``'s role."""

    async def relink(
        self,
        tx: Transaction,
        task_id: str,
        links: Sequence[tuple[str, str]],
        *,
        actor: Actor,
        admin_override: bool = False,
    ) -> bool:
        """Add to the links of ``task_id`` those of ``links`` (``(kind, task
        id)``) it lacks, audited as ``actor``'s; whether any was added."""


@runtime_checkable
class GradingContext(Protocol):
    """What a grader may look at: one journey's run against a real server.

    Everything here is an outcome anyone could observe independently: the
    saved HTTP answers, the durable state, the audit trail, the server's log
    and the files in the journey's directory.
    """

    #: The journey's scratch directory (files a step wrote, materialized plugins).
    workdir: Path

    def value(self, ref: str) -> Any:
        """A value a step saved, by dotted path (``"claim.status"``,
        ``"task.body.id"``); ``KeyError`` naming the path when it is missing."""

    def render(self, template: Any) -> Any:
        """``template`` with every ``{ref}`` placeholder replaced by
        :meth:`value` (a string that is one placeholder keeps the value's type)."""

    async def scalar(self, sql: str, params: Mapping[str, Any] | None = None) -> Any:
        """The first column of the first row of a read-only SQL query over the
        server's database (``:name`` parameters)."""

    async def audit_events(self) -> Sequence[Mapping[str, Any]]:
        """Every audit event the server recorded, by chain and sequence
        number, as the audit API returns them (read with the bootstrap
        admin's token)."""

    def server_log(self) -> str:
        """Everything the journey's server processes wrote so far."""

    def secrets(self) -> Sequence[str]:
        """Every secret the journey minted through the API (tokens, passwords)."""

    def environment(self) -> Mapping[str, str]:
        """Environment variables that point the ``buildmax`` CLI at the
        journey's server and database (for command graders)."""


@runtime_checkable
class Grader(Protocol):
    """One check of a journey, built from its table in the journey file."""

    async def grade(self, context: GradingContext) -> Grade:
        """Pass or fail, with a one-line reason and the evidence looked at.
        Raise only for a fault of the harness; a failed expectation is a
        failing :class:`Grade`."""


GraderFactory = Callable[[Mapping[str, Any]], Grader]


@runtime_checkable
class Importer(Protocol):
    """A source a backlog is imported from (``buildmax_importers``): reads
    a file of it into :class:`SourceRecord` records."""

    #: Short, unique across plugins: what ``buildmax import --format`` names.
    name: str
    #: One line saying which file it reads (``beads JSONL export``).
    title: str

    def read(self, source: BinaryIO) -> Iterator[SourceRecord | SourceProblem]:
        """Every record of the file ``source`` (bytes, read from its start),
        in file order, and a :class:`SourceProblem` for each part that is
        not one (a line that is not JSON, a record without an id, an
        encoding error), reading on after it. Raise :class:`SourceRefused`
        when the file as a whole is not of this source (another format):
        the import stops there, naming the line and the reason."""


class SourceRefused(ValueError):
    """A file an importer does not read at all (another format, nothing in
    it): ``line`` is where that showed (1-based), ``reason`` why."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(f"line {line}: {reason}")
        self.line = line
        self.reason = reason
