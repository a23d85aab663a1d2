"""Previewing a file and applying it chunk by chunk.

A **preview** reads the file with its importer, asks the space what earlier
imports left (:func:`earlier_of`), plans (:mod:`.plan`) and keeps the
file's bytes in the blob store with a row naming the plan's identity and
what it assumed. Nothing else is written.

A **chunk** is applied in one transaction, one chunk of a space at a time:
the plan is made again from the kept bytes and the assumptions (it must
have the same identity: the same file, server revision and chunk size),
every record of the chunk is checked against the space as it is now
(:class:`~.problems.ImportStale` when an earlier import or an edit here
moved since the preview), then each becomes its task through the tasks
plugin (``TaskQueue.import_record``), asking only for the prerequisites,
links and hold new since the record was last applied (its mapping keeps
what was), its mapping is written, and the chunk's report is kept with the
count of applied chunks. A chunk is applied once: asked again it answers
its kept report, so a client that died mid-request resumes by asking
again. Chunks go in order, so each record's prerequisites already have
tasks; a link to a record later in the file is made once that record has
its task.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import IO, Any, BinaryIO

import sqlalchemy as sa
from buildmax_hookspecs import Actor, BlobNotFound, BlobStore, Importer, TaskQueue, Transaction

from buildmax.app import BuildMax, blob_store
from buildmax.conflicts import insert_ignoring_conflict
from buildmax.database.locks import lock
from buildmax.ids import new_id
from buildmax.problems import BlobMissing, NotFound, Problem

from .plan import UNAPPLIED, Earlier, Item, Plan, plan
from .problems import ChunkOutOfOrder, FileRefused, ImportStale
from .sources import Reading, importers, read
from .tables import chunks, imports, mappings

#: Where the blob store keeps an import's file: ``imports/space/<space id>/``.
KEY_PREFIX = "imports"
#: The most records one read of the space asks for at once.
_BATCH = 500
#: Problems a refusal of a file with no record names.
SHOWN_PROBLEMS = 20
#: Plans kept in memory between the chunks of an import (each is made
#: again from the kept file when it is not).
_PLANS_KEPT = 4


def _version(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "0"


#: What a preview's identity holds of the server: the code that reads and plans.
SERVICE_REVISION = (
    f"buildmax {_version('buildmax')}; buildmax-imports {_version('buildmax-imports')}"
)


@dataclass(frozen=True)
class Known:
    """What an earlier import left of a record, as a preview saw it: the
    plan's :class:`~.plan.Earlier`, the task's revision then, and what of
    the record was applied (its state, prerequisites and links by source
    id; empty for a task no import made)."""

    earlier: Earlier
    revision: int
    applied: Mapping[str, Any] = field(default_factory=dict, compare=False)


def importer_named(app: BuildMax, name: str) -> Importer:
    """The loaded importer ``name`` (``KeyError`` when none is)."""
    return importers(app.hooks)[name]


def read_file(importer: Importer, file: BinaryIO) -> Reading:
    """``file`` read from its start with ``importer``, refused (422 naming
    the line) when it cannot be read as a whole."""
    file.seek(0)
    reading = read(importer, file)
    if reading.refused is not None:
        raise FileRefused(
            f"line {reading.refused.line}: {reading.refused.reason}",
            line=reading.refused.line,
            reason=reading.refused.reason,
        )
    if not reading.records:
        first = reading.problems[:SHOWN_PROBLEMS]
        raise FileRefused(
            "the file holds no record to import"
            + (
                f" ({len(reading.problems)} problems; the first on line {first[0].line})"
                if first
                else ""
            ),
            problems=[
                {"line": p.line, "reason": p.reason, "source_id": p.source_id} for p in first
            ],
        )
    return reading


async def earlier_of(
    conn: Transaction,
    queue: TaskQueue,
    space: tuple[int, str],
    system: str,
    source_ids: Iterable[str],
) -> dict[str, Known]:
    """What earlier imports of the space (pk, public id) from ``system``
    left of each of ``source_ids`` that one left: its task, the digest
    applied, the task's state and revision now, and whether it was revised
    here since. A task that names a record no import applied (made through
    the API with its source) is there too, with no digest applied."""
    found: dict[str, Known] = {}
    wanted = sorted(set(source_ids))
    for start in range(0, len(wanted), _BATCH):
        part = wanted[start : start + _BATCH]
        rows = await conn.fetch_all(
            sa.select(
                mappings.c.source_id,
                mappings.c.task_id,
                mappings.c.digest,
                mappings.c.revision,
                mappings.c.applied,
            ).where(
                mappings.c.space_id == space[0],
                mappings.c.system == system,
                mappings.c.source_id.in_(sa.bindparam("ids", expanding=True)),
            ),
            {"ids": part},
        )
        tasks = await queue.tasks(conn, [row["task_id"] for row in rows])
        for row in rows:
            task = tasks.get(row["task_id"])
            if task is None:
                continue  # not a task any more (a restore to before it): made again
            found[row["source_id"]] = Known(
                Earlier(
                    row["task_id"], row["digest"], task.state, task.revision != row["revision"]
                ),
                task.revision,
                json.loads(row["applied"]),
            )
        unmapped = [key for key in part if key not in found]
        for key, task in (await queue.sourced(conn, space[1], system, unmapped)).items():
            found[key] = Known(Earlier(task.id, UNAPPLIED, task.state), task.revision)
    return found


def assumed(known: Mapping[str, Known]) -> str:
    """``known`` as the import row keeps it (JSON)."""
    return json.dumps(
        {key: [*asdict(k.earlier).values(), k.revision] for key, k in sorted(known.items())},
        separators=(",", ":"),
    )


def _known(text: str) -> dict[str, Known]:
    return {
        key: Known(Earlier(task_id, digest, state, changed), revision)
        for key, (task_id, digest, state, changed, revision) in json.loads(text).items()
    }


def make_plan(reading: Reading, known: Mapping[str, Known], sha256: str, chunk_size: int) -> Plan:
    """The plan of ``reading`` over what earlier imports left (``known``)."""
    return plan(
        reading.records,
        reading.problems,
        {key: k.earlier for key, k in known.items()},
        file_digest=sha256,
        service_revision=SERVICE_REVISION,
        chunk_size=chunk_size,
    )


def summary(made: Plan) -> str:
    """What the preview found, as the import row keeps it (JSON): each
    chunk's first and last record and size, the problems, the edges left out."""
    sizes = Counter(item.chunk for item in made.items)
    return json.dumps(
        {
            "chunks": [
                {"number": number, "first": first, "last": last, "records": sizes[number]}
                for number, (first, last) in enumerate(made.chunks, start=1)
            ],
            "problems": [
                {"line": p.line, "reason": p.reason, "source_id": p.source_id}
                for p in made.problems
            ],
            "refused": [
                {"source_id": e.source, "kind": e.kind, "target": e.target, "reason": e.reason}
                for e in made.refused
            ],
        },
        separators=(",", ":"),
    )


def counts(made: Plan) -> dict[str, int]:
    """How many records the plan gives each action, and its problems and refused edges."""
    return {
        "records": len(made.items),
        "create": made.count("create"),
        "update": made.count("update"),
        "unchanged": made.count("unchanged"),
        "conflict": made.count("conflict"),
        "problems": len(made.problems),
        "refused": len(made.refused),
    }


async def spool(stream: AsyncIterator[bytes], file: IO[bytes]) -> None:
    """Write ``stream`` to ``file`` (a temporary file: a file is never held in memory)."""
    async for part in stream:
        await asyncio.to_thread(file.write, part)
    await asyncio.to_thread(file.flush)


async def keep_file(store: BlobStore, space_id: str, file: IO[bytes], sha256: str) -> str:
    """Put ``file`` in the blob store under the space's prefix; its key."""

    async def parts() -> AsyncIterator[bytes]:
        file.seek(0)
        while part := await asyncio.to_thread(file.read, 1 << 20):
            yield part

    ref = await store.put(f"{KEY_PREFIX}/space/{space_id}", parts(), expected_sha256=sha256)
    return ref.key


# -- the plan of a kept import ---------------------------------------------------

_plans: OrderedDict[tuple[int, str], Plan] = OrderedDict()


async def plan_of(app: BuildMax, row: Mapping[str, Any]) -> Plan:
    """The plan of the import ``row`` made again from its kept file and
    assumptions (kept in memory between chunks); 409 stale when it is not
    the plan previewed."""
    key = (row["id"], row["identity"])
    if key in _plans:
        _plans.move_to_end(key)
        return _plans[key]
    importer = importer_named(app, row["format"])
    with tempfile.TemporaryFile() as file:
        try:
            await spool(blob_store(app).open(row["blob_key"]), file)
        except BlobNotFound:
            raise BlobMissing(
                "the import's file is gone from the blob store: preview the file again"
            ) from None
        reading = await asyncio.to_thread(read_file, importer, file)
    made = await asyncio.to_thread(
        make_plan, reading, _known(row["earlier"]), row["file_sha256"], row["chunk_size"]
    )
    if made.identity != row["identity"]:
        raise ImportStale(
            "the server reads or plans this file differently since it was previewed "
            "(it was upgraded): preview the file again"
        )
    remember(row, made)
    return made


def remember(row: Mapping[str, Any], made: Plan) -> None:
    """Keep the plan of the import ``row`` for its chunks."""
    _plans[(row["id"], row["identity"])] = made
    while len(_plans) > _PLANS_KEPT:
        _plans.popitem(last=False)


# -- applying a chunk ------------------------------------------------------------


async def find(conn: Transaction, space_pk: int, import_id: str) -> Mapping[str, Any]:
    """The import ``import_id`` of the space (404 otherwise)."""
    row = await conn.fetch_one(
        sa.select(imports).where(imports.c.public_id == import_id, imports.c.space_id == space_pk)
    )
    if row is None:
        raise NotFound("no such import in this space")
    return row


async def applied_report(conn: Transaction, import_pk: int, number: int) -> dict[str, Any]:
    """The kept report of an applied chunk."""
    row = await conn.fetch_one(
        sa.select(chunks).where(chunks.c.import_id == import_pk, chunks.c.number == number)
    )
    assert row is not None, "an applied chunk keeps its report"
    return {"number": number, "applied_at": row["applied_at"], **json.loads(row["report"])}


@dataclass
class Applying:
    """One chunk being applied: who, where, and the tasks' plugin."""

    app: BuildMax
    tx: Transaction
    actor: Actor
    principal_pk: int
    space: tuple[int, str]
    row: Mapping[str, Any]
    made: Plan
    number: int
    #: An admin acting in a space it is no member of (audited so).
    admin_override: bool = False

    @property
    def space_pk(self) -> int:
        return self.space[0]

    @property
    def space_id(self) -> str:
        return self.space[1]

    @property
    def queue(self) -> TaskQueue:
        return self.app.services.get(TaskQueue)


async def apply_chunk(job: Applying) -> dict[str, Any] | None:
    """Apply chunk ``job.number`` (module docstring); its report, or
    ``None`` when it was applied already (the caller answers the kept one)."""
    row, number = job.row, job.number
    if not 1 <= number <= row["chunk_count"]:
        raise NotFound(f"the import has chunks 1 to {row['chunk_count']}")
    now = job.app.clock.now_ms()
    # One chunk at a time in a space: two imports over the same records
    # would otherwise wait on each other's new tasks (a deadlock on
    # PostgreSQL); the second finds the first's mappings, and is stale.
    await lock(job.tx, "import_apply", job.space_pk)
    claimed = await job.tx.fetch_val(
        sa.update(imports)
        .where(imports.c.id == row["id"], imports.c.chunks_applied == number - 1)
        .values(
            chunks_applied=number,
            state="applied" if number == row["chunk_count"] else "applying",
            updated_at=now,
        )
        .returning(imports.c.id)
    )
    if claimed is None:
        applied = await job.tx.fetch_val(
            sa.select(imports.c.chunks_applied).where(imports.c.id == row["id"])
        )
        if applied >= number:
            return None
        raise ChunkOutOfOrder(
            f"chunk {number} comes after chunk {applied + 1}, which is not applied",
            next_chunk=applied + 1,
        )
    items = [item for item in job.made.items if item.chunk == number]
    system = row["format"]
    known = await _check_unmoved(job, system, items)
    resolved = await _tasks_of(job, system, _targets(items))
    report = []
    for item in items:
        before = known.get(item.record.source_id)
        report.append(await _apply_item(job, system, item, before, resolved, now))
    created = {entry["source_id"] for entry in report if "created" in entry["changes"]}
    relinked = await _relink(job, system, created)
    summary = {
        action: sum(1 for entry in report if entry["action"] == action)
        for action in ("create", "update", "unchanged", "conflict")
    }
    body = {"counts": summary, "items": report, "relinked": relinked}
    await job.tx.execute(
        chunks.insert().values(
            import_id=row["id"],
            number=number,
            applied_at=now,
            applied_by=job.principal_pk,
            report=json.dumps(body, separators=(",", ":")),
        )
    )
    await job.app.audit.record(
        job.tx,
        job.actor,
        "import.chunk.applied",
        space_id=job.space_id,
        target_type="import",
        target_id=row["public_id"],
        details={"chunk": number, "of": row["chunk_count"], **summary},
        admin_override=job.admin_override,
    )
    await job.app.events.publish_many(
        job.tx,
        job.space_pk,
        [
            (
                "import.chunk.applied",
                {"import_id": row["public_id"], "chunk": number, "of": row["chunk_count"]},
            )
        ],
    )
    return {"number": number, "applied_at": now, **body}


def _targets(items: Sequence[Item]) -> set[str]:
    return {
        target
        for item in items
        for target in (*item.prerequisites, *(link.target for link in item.links))
    }


async def _check_unmoved(job: Applying, system: str, items: Sequence[Item]) -> dict[str, Known]:
    """What earlier imports left of the chunk's records now; 409 stale when
    a record of the chunk was imported, or its task edited, since the
    preview (what it assumed is not so now)."""
    then = _known(job.row["earlier"])
    now = await earlier_of(
        job.tx, job.queue, job.space, system, [item.record.source_id for item in items]
    )
    moved = [
        item.record.source_id
        for item in items
        if _marks(now.get(item.record.source_id)) != _marks(then.get(item.record.source_id))
    ]
    if moved:
        shown = ", ".join(moved[:10]) + (f" and {len(moved) - 10} more" if len(moved) > 10 else "")
        raise ImportStale(
            f"records {shown} were imported, or their tasks changed, since the preview: "
            "preview the file again",
            records=moved[:100],
        )
    return now


def _marks(known: Known | None) -> tuple[str, str, int] | None:
    """What must not move between a preview and its apply: the task, the
    digest applied and the task's revision (its state moves with the work)."""
    return None if known is None else (known.earlier.task_id, known.earlier.digest, known.revision)


async def _tasks_of(job: Applying, system: str, source_ids: Iterable[str]) -> dict[str, str]:
    """The task of each of ``source_ids`` that has one: an import made it
    (this one's earlier chunks too), or it was made naming the record."""
    found: dict[str, str] = {}
    wanted = sorted(set(source_ids))
    for start in range(0, len(wanted), _BATCH):
        part = wanted[start : start + _BATCH]
        rows = await job.tx.fetch_all(
            sa.select(mappings.c.source_id, mappings.c.task_id).where(
                mappings.c.space_id == job.space_pk,
                mappings.c.system == system,
                mappings.c.source_id.in_(sa.bindparam("ids", expanding=True)),
            ),
            {"ids": part},
        )
        found.update((row["source_id"], row["task_id"]) for row in rows)
        unmapped = [key for key in part if key not in found]
        sourced = await job.queue.sourced(job.tx, job.space_id, system, unmapped)
        found.update((key, task.id) for key, task in sourced.items())
    return found


async def _apply_item(
    job: Applying,
    system: str,
    item: Item,
    before: Known | None,
    resolved: dict[str, str],
    now: int,
) -> dict[str, Any]:
    """One record of the chunk become its task (at the revision the preview
    saw, given what was applied of it ``before``), and its mapping written
    once the record is applied. Of its prerequisites, links and hold, only
    what is new since it was last applied is asked for."""
    entry: dict[str, Any] = {
        "source_id": item.record.source_id,
        "action": item.action,
        "task_id": item.task_id,
        "changes": [],
        "notes": list(item.notes),
    }
    if item.action in ("unchanged", "conflict"):
        return entry
    since = {} if before is None else before.applied
    done_before = set(since.get("prerequisites", ()))
    linked_before = {tuple(link) for link in since.get("links", ())}
    new_links = [
        (link.kind, resolved[link.target])
        for link in item.links
        if (link.kind, link.target) not in linked_before and link.target in resolved
    ]
    try:
        outcome = await job.queue.import_record(
            job.tx,
            item.record,
            system=system,
            space_id=job.space_id,
            project_id=job.row["project_id"],
            actor=job.actor,
            task_id=item.task_id,
            revision=None if before is None else before.revision,
            prerequisites=[
                resolved[target] for target in item.prerequisites if target not in done_before
            ],
            links=new_links,
            hold=since.get("state") != "held",
            admin_override=job.admin_override,
        )
    except Problem as refused:
        # The whole chunk is refused: say which record refused it.
        refused.detail = (
            f"record {item.record.source_id} (line {item.record.line}): {refused.detail}"
        )
        refused.extra.setdefault("source_id", item.record.source_id)
        raise
    resolved[item.record.source_id] = outcome.task_id
    entry.update(
        task_id=outcome.task_id,
        changes=list(outcome.changes),
        notes=[*item.notes, *outcome.notes],
        state=outcome.state,
    )
    if not outcome.applied:
        return entry  # the mapping keeps what was applied: a later import tries again
    applied = {
        "state": item.record.state,
        "prerequisites": list(item.prerequisites),
        "links": [[link.kind, link.target] for link in item.links],
    }
    values = {
        "task_id": outcome.task_id,
        "digest": item.digest,
        "revision": outcome.revision,
        "applied": json.dumps(applied, separators=(",", ":")),
        "import_id": job.row["id"],
        "updated_at": now,
    }
    # A record an import applied before has its mapping; one created now,
    # or made outside an import, gets its first (or, when a restore took
    # its task away, the one it had is written over).
    keyed = (
        mappings.c.space_id == job.space_pk,
        mappings.c.system == system,
        mappings.c.source_id == item.record.source_id,
    )
    mapped = before is not None and before.earlier.digest != UNAPPLIED
    if not mapped:
        inserted = await job.tx.fetch_val(
            insert_ignoring_conflict(job.tx.dialect, mappings)
            .values(space_id=job.space_pk, system=system, source_id=item.record.source_id, **values)
            .returning(mappings.c.id)
        )
        mapped = inserted is None
    if mapped:
        await job.tx.execute(sa.update(mappings).where(*keyed).values(**values))
    return entry


async def _relink(job: Applying, system: str, arrived: set[str]) -> list[str]:
    """Give the tasks of this import's chunks so far (this one's too) their
    links to the records ``arrived``, that only now have tasks (none of
    those links can be one a person took away); the tasks relinked."""
    waiting = [
        item
        for item in job.made.items
        if item.chunk <= job.number and any(link.target in arrived for link in item.links)
    ]
    if not waiting:
        return []
    resolved = await _tasks_of(
        job, system, {item.record.source_id for item in waiting} | _targets(waiting)
    )
    relinked = []
    for item in waiting:
        links = [
            (link.kind, resolved[link.target])
            for link in item.links
            if link.target in arrived and link.target in resolved
        ]
        task_id = resolved.get(item.record.source_id)
        if task_id is None:
            continue  # not applied (someone holds its task): a later import links it
        relinked_now = await job.queue.relink(
            job.tx, task_id, links, actor=job.actor, admin_override=job.admin_override
        )
        if relinked_now:
            relinked.append(task_id)
    return relinked


def new_import_id() -> str:
    """A new import's public id."""
    return new_id("im")
