"""A preview of an import: what each record of a file becomes, in which
chunk, and every edge and link that cannot be kept, with the reason.

The plan is made from what was read (:class:`~.sources.Reading`) and what
earlier imports left in the space (:class:`Earlier`, by source id), and
touches nothing. Its parts:

- **Actions.** A record no task came from is created; one whose task came
  from it is ``unchanged`` when its content is what was applied last,
  ``updated`` when the source changed it, and a ``conflict`` when the task
  was also changed here since (left alone, and said so). A task closed here
  is never reopened or revised: the item says so.
- **Prerequisites.** A ``prerequisite`` link to a record of the file, or to
  one an earlier import made a task of, is kept. One to neither is a broken
  link: listed, and the task imported without it. An edge that would close
  a cycle is refused and listed (the first edge found to close it, reading
  the file in order); the rest of the cycle is kept.
- **Other links** (``parent``, ``related``, ...) are kept when their target
  is in the file or was imported before, else listed as broken.
- **Chunks.** Records are ordered so that every prerequisite comes before
  the records that wait for it, then cut into chunks of ``chunk_size``:
  each chunk can be applied on its own, after the ones before it.
- **Identity.** The digest of the file's bytes, the service revision and
  what the plan assumed of the space (the earlier tasks' states and
  digests): a plan applied after any of them changed is stale.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass, field, fields

from buildmax_hookspecs import SourceLink, SourceProblem, SourceRecord

#: Records in one chunk unless asked otherwise.
CHUNK_SIZE = 100
#: What happens to each record.
ACTIONS = ("create", "update", "unchanged", "conflict")
#: States a task is closed in: an import never reopens it.
CLOSED = ("done", "canceled", "failed")


#: The digest of a record no import applied, whose task names it all the
#: same (made through the API with its source): imported as an update.
UNAPPLIED = ""


@dataclass(frozen=True)
class Earlier:
    """What an earlier import of a record left: its task, the digest of
    the record as last applied, the task's state now and whether the task
    was changed here since."""

    task_id: str
    digest: str
    state: str
    changed_here: bool = False


@dataclass(frozen=True)
class Item:
    """One record of the plan: what it becomes (``action``), the task it
    became before (``task_id``), the prerequisites and links kept (by
    source id), why anything differs from the file (``notes``) and its
    chunk (from 1)."""

    record: SourceRecord
    action: str
    digest: str
    chunk: int
    task_id: str | None = None
    prerequisites: tuple[str, ...] = ()
    links: tuple[SourceLink, ...] = ()
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Edge:
    """A prerequisite or link of record ``source`` to ``target`` left out,
    and why."""

    source: str
    kind: str
    target: str
    reason: str


@dataclass
class Plan:
    """The preview of an import (module docstring)."""

    identity: str
    items: list[Item] = field(default_factory=list)
    problems: list[SourceProblem] = field(default_factory=list)
    refused: list[Edge] = field(default_factory=list)
    chunks: list[tuple[str, str]] = field(default_factory=list)

    def count(self, action: str) -> int:
        """How many records the plan gives ``action``."""
        return sum(1 for item in self.items if item.action == action)


#: What a record says, as its digest reads it: all but where it is in its
#: file and what its importer warned of.
_SAID = tuple(f.name for f in fields(SourceRecord) if f.name not in ("line", "warnings"))


def digest(record: SourceRecord) -> str:
    """The digest of what ``record`` says (not where it is in its file):
    equal for a record exported again unchanged."""
    said = [getattr(record, name) for name in _SAID]
    text = json.dumps(said, ensure_ascii=False, separators=(",", ":"), default=astuple)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def plan(
    records: Sequence[SourceRecord],
    problems: Sequence[SourceProblem],
    earlier: Mapping[str, Earlier],
    *,
    file_digest: str,
    service_revision: str,
    chunk_size: int = CHUNK_SIZE,
) -> Plan:
    """The plan of importing ``records`` (each id once, as
    :func:`~.sources.read` gives them) into a space where ``earlier``
    imports left tasks; ``problems`` are carried into it as read."""
    if chunk_size < 1:
        raise ValueError("a chunk holds at least one record")
    known = {record.source_id for record in records}
    refused: list[Edge] = []
    prerequisites: dict[str, list[str]] = {}
    links: dict[str, list[SourceLink]] = {}
    for record in records:
        mine = prerequisites.setdefault(record.source_id, [])
        others = links.setdefault(record.source_id, [])
        for link in record.links:
            if link.target not in known and link.target not in earlier:
                refused.append(
                    Edge(
                        record.source_id,
                        link.kind,
                        link.target,
                        "no such record in the file or imported before: a broken link",
                    )
                )
            elif link.kind == "prerequisite":
                mine.append(link.target)
            elif link.target == record.source_id:
                refused.append(Edge(record.source_id, link.kind, link.target, "a link to itself"))
            else:
                others.append(link)
    refused += _break_cycles(records, prerequisites, known)
    order = _ordered(records, prerequisites, known)
    result = Plan(
        identity=_identity(file_digest, service_revision, chunk_size, earlier),
        problems=list(problems),
        refused=refused,
    )
    for number, record in enumerate(order):
        chunk = number // chunk_size + 1
        result.items.append(
            _item(record, earlier.get(record.source_id), chunk, prerequisites, links)
        )
    for start in range(0, len(result.items), chunk_size):
        part = result.items[start : start + chunk_size]
        result.chunks.append((part[0].record.source_id, part[-1].record.source_id))
    return result


def _item(
    record: SourceRecord,
    before: Earlier | None,
    chunk: int,
    prerequisites: Mapping[str, list[str]],
    links: Mapping[str, list[SourceLink]],
) -> Item:
    kept_prerequisites = tuple(dict.fromkeys(prerequisites[record.source_id]))
    kept_links = tuple(dict.fromkeys(links[record.source_id]))
    mark = _applied(digest(record), kept_prerequisites, kept_links)
    if before is None:
        return Item(record, "create", mark, chunk, None, kept_prerequisites, kept_links)
    if before.digest == mark:
        return Item(
            record, "unchanged", mark, chunk, before.task_id, kept_prerequisites, kept_links
        )
    if before.changed_here:
        note = "changed here since it was imported: the source's change is not applied"
        return Item(
            record, "conflict", mark, chunk, before.task_id, kept_prerequisites, kept_links, (note,)
        )
    notes: tuple[str, ...] = ()
    if before.digest == UNAPPLIED:
        notes = ("its task was made outside an import, naming this record: it is updated",)
    if before.state in CLOSED:
        now = record.source_state or record.state
        notes += (
            f"{before.state} here: it stays closed and its text is not revised "
            f"(the source has it {now})",
        )
    return Item(
        record, "update", mark, chunk, before.task_id, kept_prerequisites, kept_links, notes
    )


def _applied(said: str, prerequisites: tuple[str, ...], links: tuple[SourceLink, ...]) -> str:
    """The digest of what applying a record gives its task: what the record
    says and which of its prerequisites and links can be kept. A record
    exported again unchanged whose broken link now has a record to name
    is applied again, so its task gets it."""
    kept = json.dumps([said, prerequisites, [astuple(link) for link in links]])
    return hashlib.sha256(kept.encode("utf-8", "surrogatepass")).hexdigest()


def _break_cycles(
    records: Sequence[SourceRecord], prerequisites: dict[str, list[str]], known: set[str]
) -> list[Edge]:
    """Refuse, and take out of ``prerequisites``, each edge that closes a
    cycle among the file's records (depth first, in file order)."""
    refused: list[Edge] = []
    done: set[str] = set()
    for record in records:
        if record.source_id in done:
            continue
        # An explicit stack: an export may chain thousands of records.
        path: list[str] = [record.source_id]
        on_path = {record.source_id: 0}  # where each id of the path is in it
        pending = [iter(list(prerequisites[record.source_id]))]
        while pending:
            node = path[-1]
            target = next(pending[-1], None)
            if target is None:
                pending.pop()
                del on_path[path.pop()]
                done.add(node)
                continue
            if target not in known or target in done:
                continue
            if target in on_path:
                prerequisites[node].remove(target)
                cycle = _shown(path, on_path[target], target)
                refused.append(
                    Edge(node, "prerequisite", target, f"it would close a cycle: {cycle}")
                )
                continue
            on_path[target] = len(path)
            path.append(target)
            pending.append(iter(list(prerequisites[target])))
    return refused


def _shown(path: list[str], start: int, target: str, ends: int = 4) -> str:
    """The cycle ``path[start:]`` closed by ``target``: its first and last
    few ids only when it is long (never a copy of a long path)."""
    length = len(path) - start
    if length <= 2 * ends:
        return " -> ".join([*path[start:], target])
    hidden = length - 2 * ends + 1
    return " -> ".join(
        [*path[start : start + ends], f"({hidden:,} more)", *path[-ends + 1 :], target]
    )


def _ordered(
    records: Sequence[SourceRecord], prerequisites: Mapping[str, list[str]], known: set[str]
) -> list[SourceRecord]:
    """``records`` with every prerequisite in the file before the records
    that wait for it, otherwise in file order (the graph has no cycle)."""
    by_id = {record.source_id: record for record in records}
    placed: set[str] = set()
    order: list[SourceRecord] = []
    for record in records:
        stack = [(record.source_id, iter(prerequisites[record.source_id]))]
        if record.source_id in placed:
            continue
        while stack:
            node, waiting = stack[-1]
            target = next(waiting, None)
            if target is None:
                stack.pop()
                if node not in placed:
                    placed.add(node)
                    order.append(by_id[node])
            elif target in known and target not in placed:
                stack.append((target, iter(prerequisites[target])))
    return order


def _identity(
    file_digest: str, service_revision: str, chunk_size: int, earlier: Mapping[str, Earlier]
) -> str:
    assumed = sorted(
        (key, e.task_id, e.digest, e.state, e.changed_here) for key, e in earlier.items()
    )
    text = json.dumps([file_digest, service_revision, chunk_size, assumed], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
