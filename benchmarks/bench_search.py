"""Search at 100,000 lessons and 100,000 tasks in one space, on SQLite and
PostgreSQL: lesson search and task search through their routes, a list
without a query as the peer, and what the full-text index costs task
create and submit, in one run.

    python benchmarks/bench_search.py [--engine sqlite|postgresql|both]
                                      [--lessons 100000] [--tasks 100000]
                                      [--requests 200] [--writes 200] [--quick]
                                      [--explain] [--json] [--keep]

**Servers.** Like ``bench_dashboard.py`` (the closest benchmark: pages read
one at a time, timed by the server's own request log): a real ``buildmax
serve`` with no configuration file and no ``BUILDMAX_*`` variables, every
installed plugin. A first server makes the space ``bench``, 20 projects and
4 member agents with their own tokens over HTTP; it stops, the data is
seeded, and the measured server starts on it. PostgreSQL gets a fresh
database ``bench_search_<pid>_<random>`` on ``--pg-url`` (dropped at the
end), migrated with ``buildmax db migrate``.

**Seeding** (the HTTP API would take hours): bulk inserts of the rows the
routes write (``buildmax_lessons.lessons.create``, the tasks plugin's
``create_task``), in transactions of 10,000 records: ``lesson_lessons`` and
their ``lesson_revisions`` (5% corrected once, so two revisions; 1%
superseded; usefulness votes on some), ``task_tasks`` and their first
``task_revisions`` (done, canceled, failed and ready; code and general; 0-3
labels). No audit events are seeded. Then both indexes are filled through
the plugins' own ``TextIndex.fill`` in batches of 10,000 records, in a
BuildMax app opened in this process on the same database; on PostgreSQL a
``VACUUM (ANALYZE)`` of the seeded tables follows (what autovacuum does
after that many inserts; it also flushes the GIN indexes' pending lists).

**Corpus.** Text drawn from a vocabulary of about 4,000 units: some 300
real technical words (no two sharing a stem), 150 two-word collocations of them (``"race
condition"`` as one unit) and English-ish made-up words, ranked with
Zipf-Mandelbrot weights (``1 / (rank + 2.7) ** 1.07``), plus English
function words for 30% of the text (PostgreSQL leaves them out of its
index, SQLite keeps them). A lesson has a 3-8 word title and 30-150 words of
text; a task a 3-8 word title, 8-40 words of acceptance criteria (indexed)
and 10-40 words of body (not).

**Queries**, picked from the corpus by how many records hold each word
(the matches each query really has are counted with SQL and printed): a
*rare word* (0.03-0.2% of the records), a *common word* (8-30%), *two
common words* (3-12% each, both required), a *phrase* (a collocation in
quotes, 0.3-3%) and a *word + filter* (1-5%, with ``kind``, ``tag`` or
``project`` on lessons; ``state``, ``kind``, ``project`` or ``label`` on
tasks); 20 different queries per class, used in turn; ``limit=20``. The
peer: the same list without ``q`` (newest first).

**Measured**, with an agent's token:

1. One request at a time, the classes interleaved (``--requests`` of each
   after one warm-up pass over every query): the server's own time per
   request (its request log, each request carrying a known ``X-Request-Id``)
   and the client's; the target is judged on the server's p95.
2. Throughput: ``--connections`` keep-alive connections in a closed loop for
   ``--duration`` seconds per class, then all search classes mixed.
3. The index's statements alone, as both routes use them, through
   BuildMax's database layer in this process (no HTTP, no route), so the
   route's share shows: the ranking (``TextIndex.search`` of the 1,000 most
   relevant keys without snippets) and the snippets of the best 20.
4. Writes, on a server with one change: every ``TextIndex.put`` of a
   request carrying ``X-Bench-Index: off`` does nothing (this script wraps
   ``buildmax serve`` and patches that method; both variants go through the
   wrapper, and alternate on the same server, so nothing else differs).
   Task create (``POST /tasks``) with the index and without it, ABBA; submit
   (claim-next first, not counted) with no lessons, with 2 lessons carried
   in ``extensions.lessons``, and with 2 lessons and the index off, in
   rotating order. Afterwards the index is checked: what was written with
   the index off is not in it, the rest is.

Target (issue 24, acceptance item 2): search p95 under 20 ms on both
engines, judged per class and pooled (all five search classes, and the
issue's four: a common word alone is this benchmark's addition).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import json
import math
import os
import random
import re
import secrets
import sqlite3
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import httpx
from bench_claims import (
    SETUP_TIMEOUT_S,
    HttpConn,
    Setup,
    _admin,
    admin_token_of,
    latency_summary,
    run_async,
    serve_args,
    server_env,
    setup_space,
    start_server,
    versions,
)
from bench_read import (
    HOST,
    BenchError,
    Server,
    buildmax_command,
    db_url,
    free_port,
    proc_status,
    run_in_scratch,
    spawn,
    wait_ready,
)

TARGET_P95_MS = 20.0
#: The header that turns every ``TextIndex.put`` of a request off (wrapped server only).
INDEX_SWITCH = "X-Bench-Index"
SERVE_SWITCHABLE = "--serve-with-index-switch"
REQUEST_LINE = re.compile(r"buildmax\.requests: (\S+) (\S+) (\S+) (\d{3}) ([0-9.]+)ms")
BATCH = 10_000
PROJECTS = 20
AGENTS = 4
QUERIES_PER_CLASS = 20
PAGE = 20
#: How many matches both search routes rank at most (the newest).
MAX_HITS = 1000
DAY_MS = 86_400_000

SEARCH_CLASSES = ("rare word", "common word", "two common words", "phrase", "word + filter")
PEER = "list (no q)"
#: The issue's mix (a common word alone is the extra, hardest class).
ISSUE_CLASSES = ("rare word", "two common words", "phrase", "word + filter")
ALL_SEARCHES = "all searches"
ISSUE_MIX = "the issue's mix (no common word)"
CLASSES = (*SEARCH_CLASSES, PEER)
TARGETS = ("lessons", "tasks")


def progress(message: str) -> None:
    print(f"[bench_search] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- corpus

# fmt: off
FUNCTION_WORDS = [
    "the", "a", "an", "to", "of", "in", "on", "for", "with", "when", "and", "or", "is", "it",
    "this", "that", "be", "by", "from", "at", "as", "not", "after", "before", "if", "then",
    "but", "are", "was", "can", "should", "must", "into", "only",
]
# fmt: on

#: No two of them share a stem (SQLite's Porter or PostgreSQL's English
#: stemmer), so a word's matches are its own.
TECH_WORDS = sorted(
    set(
        """
    cache timeout migration deadlock retry queue worker lease token schema index cursor
    commit rollback transaction replica shard partition checksum snapshot backup restore
    kernel plugin hook contract route handler request response header payload buffer socket
    thread process signal mutex semaphore latch barrier scheduler cron daemon service
    cluster node leader follower quorum consensus heartbeat failover gossip raft paxos
    linker parser lexer grammar syntax bytecode interpreter runtime garbage
    allocator pointer reference closure iterator coroutine callback promise future
    async await event loop poll epoll select reactor executor pool connection session cookie
    auth login password hash salt cipher encryption certificate tls handshake proxy gateway
    balancer ingress egress firewall subnet dns resolver hostname port endpoint webhook
    artifact package wheel dependency lockfile version semver release changelog tag branch
    merge rebase conflict diff patch review approval integration pipeline build
    compile deploy rollout canary flag toggle config setting environment variable secret
    vault credential permission role policy scope audit trail ledger journal log metric
    trace span histogram counter gauge alert dashboard panel query filter predicate join
    aggregate window subquery view trigger constraint foreign primary unique nullable
    column table row tuple record field attribute property struct enum union variant trait
    interface abstract method function module namespace import export bundle minify
    transpile polyfill browser render layout paint reflow viewport widget component state
    store reducer action selector hydration template stylesheet font glyph unicode encoding
    utf locale timezone clock drift skew epoch timestamp duration interval deadline budget
    quota limit throttle backoff jitter circuit breaker bulkhead fallback cascade outage
    incident postmortem runbook oncall pager escalation ticket backlog sprint estimate
    benchmark profile flamegraph sampling latency throughput percentile regression baseline
    fixture mock stub spy assertion coverage mutation fuzzing property invariant contract
    flaky nondeterministic race condition ordering fence generation epoch stale
    idempotency dedupe replay offset watermark checkpoint compaction vacuum tombstone
    bloom sketch hyperloglog trie btree heap stack deque graph vertex edge topology sort
    hashmap bitmap bitset vector matrix tensor gradient optimizer epoch batch shuffle
    stemmer lexeme ranking relevance snippet highlight phrase corpus vocabulary
    docker container image layer volume mount registry manifest digest orchestrator pod
    sidecar probe readiness liveness autoscaler replica daemonset operator controller
    terraform ansible playbook inventory provision bootstrap teardown cleanup garbage
    """.split()  # noqa: SIM905 - a block of prose-like text reads best as words
    )
)

COLLOCATION_SEEDS = (
    "race condition",
    "connection pool",
    "flaky test",
    "memory leak",
    "null pointer",
    "cache invalidation",
    "schema migration",
    "deadlock detection",
    "retry budget",
    "circuit breaker",
    "event loop",
    "garbage collector",
    "lock contention",
    "query planner",
    "index scan",
    "stale read",
    "write amplification",
    "clock skew",
    "token refresh",
    "feature flag",
)

# fmt: off
LABELS = [
    "backend", "frontend", "db", "auth", "infra", "docs", "flaky", "perf", "security", "ui",
    "api", "ci", "build", "deps", "migration", "search", "queue", "storage", "network",
    "release",
]
# fmt: on

LESSON_KINDS = ("gotcha", "convention", "how-to", "decision", "note")
LESSON_KIND_WEIGHTS = (35, 20, 25, 10, 10)


def _made_up_words(rng: random.Random, count: int, taken: set[str]) -> list[str]:
    """English-ish words no stemmer shortens: consonant-vowel-consonant
    syllables, the last one never ending in a suffix either stemmer strips."""
    onsets = [*"bcdfghjklmnprstvwz", "br", "cr", "dr", "fl", "gr", "pl", "pr", "sk", "st", "tr"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou"]
    codas = [*"bdgklmnprtxz"]
    last_vowels = [*"aiou"]
    last_codas = [*"bgkpxz"]
    found: list[str] = []
    while len(found) < count:
        syllables = [
            rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas)
            for _ in range(rng.choice((1, 1, 2)))
        ]
        syllables.append(rng.choice(onsets) + rng.choice(last_vowels) + rng.choice(last_codas))
        word = "".join(syllables)
        if word not in taken and 5 <= len(word) <= 12:
            taken.add(word)
            found.append(word)
    return found


@dataclasses.dataclass
class Corpus:
    """What text is drawn from: ``items`` (function words, words and
    collocations) with cumulative Zipf-Mandelbrot weights for text, and
    ``title_weights`` for titles (no function words)."""

    words: list[str]
    collocations: list[str]
    items: list[str]
    weights: list[float]
    title_items: list[str]
    title_weights: list[float]

    @classmethod
    def build(cls, seed: int, size: int = 4000) -> Corpus:
        rng = random.Random(seed)
        real = list(TECH_WORDS)
        rng.shuffle(real)
        pairs = set(COLLOCATION_SEEDS)
        while len(pairs) < 150:
            a, b = rng.sample(TECH_WORDS, 2)
            pairs.add(f"{a} {b}")
        collocations = sorted(pairs)
        rng.shuffle(collocations)
        made_up = _made_up_words(rng, size - len(real) - len(collocations), set(real))
        # Real words head the ranking, collocations among them, made-up words the tail.
        ranked: list[str] = list(real)
        for number, phrase in enumerate(collocations):
            ranked.insert(min(len(ranked), 15 + number * 3), phrase)
        ranked += made_up
        content = [1 / (rank + 2.7) ** 1.07 for rank in range(1, len(ranked) + 1)]
        function = [1 / (rank + 1) for rank in range(1, len(FUNCTION_WORDS) + 1)]
        share_content, share_function = 0.7 / sum(content), 0.3 / sum(function)
        items = FUNCTION_WORDS + ranked
        weights = [w * share_function for w in function] + [w * share_content for w in content]
        return cls(
            words=real + made_up,
            collocations=collocations,
            items=items,
            weights=list(_cumulative(weights)),
            title_items=ranked,
            title_weights=list(_cumulative(content)),
        )

    def text(self, rng: random.Random, count: int) -> tuple[str, list[str]]:
        """``count`` words or collocations as sentences; and the units drawn."""
        units = rng.choices(self.items, cum_weights=self.weights, k=count)
        sentences = [" ".join(units[i : i + 12]) for i in range(0, count, 12)]
        return ". ".join(s[:1].upper() + s[1:] for s in sentences) + ".", units

    def title(self, rng: random.Random) -> tuple[str, list[str]]:
        units = rng.choices(self.title_items, cum_weights=self.title_weights, k=rng.randint(3, 8))
        text = " ".join(units)
        return text[:1].upper() + text[1:], units


def _cumulative(values: list[float]) -> Iterator[float]:
    total = 0.0
    for value in values:
        total += value
        yield total


@dataclasses.dataclass
class Case:
    """One query of a class: its path (with the query string) and the
    query's text (``None`` for the peer)."""

    target: str
    cls: str
    path: str
    text: str | None
    matches: int | None = None


def choose_queries(
    corpus: Corpus, counts: collections.Counter[str], records: int, rng: random.Random
) -> dict[str, list[str]]:
    """The query texts of each search class, from how many records hold each unit."""
    singles = [(w, counts[w]) for w in corpus.words if counts[w] > 0]
    phrases = [(c, counts[c]) for c in corpus.collocations if counts[c] > 0]

    def near(found: list[tuple[str, int]], low: float, high: float, k: int) -> list[str]:
        inside = [c for c in found if low <= c[1] <= high]
        if len(inside) < k:
            middle = math.sqrt(max(low, 1) * max(high, 1))
            inside = sorted(found, key=lambda c: abs(math.log(c[1] / middle)))[:k]
        inside.sort(key=lambda c: (c[1], c[0]))
        step = len(inside) / k
        return [inside[min(len(inside) - 1, int(i * step))][0] for i in range(k)]

    k = QUERIES_PER_CLASS
    n = records
    pairs = near(singles, 0.03 * n, 0.12 * n, 2 * k)
    rng.shuffle(pairs)
    return {
        "rare word": near(singles, max(3, 0.0003 * n), max(10, 0.002 * n), k),
        "common word": near(singles, 0.08 * n, 0.3 * n, k),
        "two common words": [f"{pairs[2 * i]} {pairs[2 * i + 1]}" for i in range(k)],
        "phrase": [f'"{p}"' for p in near(phrases, 0.003 * n, 0.03 * n, k)],
        "word + filter": near(singles, 0.01 * n, 0.05 * n, k),
    }


# --------------------------------------------------------------------------- seeding

# fmt: off
LESSON_COLUMNS = [
    "id", "public_id", "space_id", "project_id", "kind", "revision", "task_kinds", "tags",
    "helpful", "not_helpful", "wrong", "score", "superseded_by", "superseded_at",
    "superseded_reason", "author_id", "created_at", "updated_at",
]
# fmt: on
# fmt: off
LESSON_REVISION_COLUMNS = [
    "lesson_id", "number", "kind", "title", "text", "applies_to", "sources", "author_id",
    "author_kind", "reason", "created_at",
]
# fmt: on
# fmt: off
TASK_COLUMNS = [
    "id", "public_id", "space_id", "project_id", "kind", "title", "priority", "labels",
    "resources", "state", "human_only", "max_attempts", "attempts_used", "generation",
    "revision", "finding_ids", "ready_at", "created_at", "created_by", "updated_at",
]
# fmt: on
# fmt: off
TASK_REVISION_COLUMNS = [
    "task_id", "number", "title", "body", "criteria", "created_at", "created_by",
]
# fmt: on


@dataclasses.dataclass
class Space:
    """What the seeding writes under: the space, its projects, its principals."""

    pk: int
    public_id: str
    admin_pk: int
    admin_id: str
    project_pks: list[int]
    project_ids: list[str]
    agent_ids: list[str]


def _listed(values: list[str]) -> str:
    return "," + ",".join(values) + "," if values else ""


def _canonical(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def lesson_rows(
    corpus: Corpus,
    space: Space,
    first_pk: int,
    start: int,
    count: int,
    rng: random.Random,
    counts: collections.Counter[str],
    now: int,
    total: int,
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """``count`` lessons from number ``start`` and their revisions, as
    ``lessons.create`` (and, for 5%, ``lessons.correct``) writes them."""
    from buildmax.ids import new_id

    public_ids = [new_id("ls") for _ in range(count)]
    lessons, revisions = [], []
    for i in range(count):
        number = start + i
        created = now - 180 * DAY_MS + number * (180 * DAY_MS // max(1, total))
        kind = rng.choices(LESSON_KINDS, LESSON_KIND_WEIGHTS)[0]
        project = None if rng.random() < 0.3 else rng.choice(space.project_ids)
        task_kinds = rng.choice(([], [], ["code"], ["code", "general"], ["general"]))
        tags = sorted(rng.sample(LABELS, rng.choice((0, 1, 1, 2, 3))))
        applies = {"task_kinds": task_kinds, "paths": [], "tags": tags}
        agent = rng.random() < 0.6
        author = rng.choice(space.agent_ids) if agent else space.admin_id
        author_kind = "agent" if agent else "human"
        helpful = rng.choice((0, 0, 0, 1, 2, 5))
        not_helpful = rng.choice((0, 0, 0, 0, 1))
        wrong = 1 if rng.random() < 0.02 else 0
        superseded = i + 1 < count and rng.random() < 0.01
        title, title_units = corpus.title(rng)
        text, text_units = corpus.text(rng, rng.randint(30, 150))
        counts.update(set(title_units) | set(text_units))
        revision = 2 if rng.random() < 0.05 else 1
        lessons.append(
            (
                first_pk + number,
                public_ids[i],
                space.pk,
                project,
                kind,
                revision,
                _listed(task_kinds),
                _listed(tags),
                helpful,
                not_helpful,
                wrong,
                helpful - not_helpful - 2 * wrong,
                public_ids[i + 1] if superseded else None,
                created + DAY_MS if superseded else None,
                "Replaced by a better lesson." if superseded else None,
                author,
                created,
                created + (DAY_MS if revision == 2 else 0),
            )
        )
        common = (json.dumps(applies, separators=(",", ":"), sort_keys=True), "[]", author)
        if revision == 2:
            old, _ = corpus.text(rng, rng.randint(30, 150))
            revisions.append(
                (first_pk + number, 1, kind, title, old, *common, author_kind, "", created)
            )
        reason = "Corrected." if revision == 2 else ""
        revisions.append(
            (first_pk + number, revision, kind, title, text, *common, author_kind, reason, created)
        )
    return lessons, revisions


def task_rows(
    corpus: Corpus,
    space: Space,
    first_pk: int,
    states: list[tuple[str, str]],
    start: int,
    count: int,
    rng: random.Random,
    counts: collections.Counter[str],
    now: int,
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """``count`` tasks from number ``start`` and their first revisions, as
    ``create_task`` writes them (then moved to their state)."""
    from buildmax.ids import new_id

    total = len(states)
    tasks, revisions = [], []
    for i in range(count):
        number = start + i
        state, kind = states[number]
        created = now - 180 * DAY_MS + number * (180 * DAY_MS // max(1, total))
        title, title_units = corpus.title(rng)
        criteria, criteria_units = corpus.text(rng, rng.randint(8, 40))
        body, _ = corpus.text(rng, rng.randint(10, 40))
        counts.update(set(title_units) | set(criteria_units))
        labels = json.dumps(sorted(rng.sample(LABELS, rng.choice((0, 1, 1, 2, 3)))))
        used = 0 if state == "ready" else 1
        tasks.append(
            (
                first_pk + number,
                new_id("ta"),
                space.pk,
                rng.choice(space.project_pks),
                kind,
                title,
                rng.randint(0, 2),
                labels,
                "[]",
                state,
                0,
                3,
                used,
                used,
                1,
                "[]",
                created,
                created,
                space.admin_pk,
                created + (0 if state == "ready" else DAY_MS // 24),
            )
        )
        revisions.append((first_pk + number, 1, title, body, criteria, created, space.admin_pk))
    return tasks, revisions


def task_states(total: int, ready: int, rng: random.Random) -> list[tuple[str, str]]:
    """Each task's state and kind: ``ready`` ready ones (4 in 5 of kind
    code), the rest done (88%), canceled (7%) or failed (5%), shuffled."""
    found = [("ready", "general" if i % 5 == 4 else "code") for i in range(ready)]
    for _ in range(total - ready):
        roll = rng.random()
        state = "done" if roll < 0.88 else "canceled" if roll < 0.95 else "failed"
        found.append((state, "general" if rng.random() < 0.3 else "code"))
    rng.shuffle(found)
    return found


class Sink:
    """Bulk inserts into one engine's database, a transaction per batch."""

    dialect: str

    async def value(self, sql: str, *args: Any) -> Any:
        raise NotImplementedError

    async def insert(self, table: str, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        raise NotImplementedError

    def transaction(self) -> contextlib.AbstractAsyncContextManager[None]:
        raise NotImplementedError

    async def finish(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError


class SqliteSink(Sink):
    dialect = "sqlite"

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA synchronous = OFF")

    async def value(self, sql: str, *args: Any) -> Any:
        row = self.conn.execute(sql, args).fetchone()
        return row[0] if row else None

    async def insert(self, table: str, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        marks = ", ".join("?" for _ in columns)
        self.conn.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)

    @contextlib.asynccontextmanager
    async def transaction(self) -> Any:
        self.conn.execute("BEGIN")
        yield
        self.conn.execute("COMMIT")

    async def finish(self) -> None:
        self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    async def close(self) -> None:
        self.conn.close()


class PostgresSink(Sink):
    dialect = "postgresql"

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    @classmethod
    async def open(cls, url: str) -> PostgresSink:
        import asyncpg

        return cls(await asyncpg.connect(url))

    async def value(self, sql: str, *args: Any) -> Any:
        number = iter(range(1, len(args) + 1))
        return await self.conn.fetchval(re.sub(r"\?", lambda _: f"${next(number)}", sql), *args)

    async def insert(self, table: str, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        await self.conn.copy_records_to_table(table, records=rows, columns=columns)

    @contextlib.asynccontextmanager
    async def transaction(self) -> Any:
        async with self.conn.transaction():
            yield

    async def finish(self) -> None:
        for table in ("lesson_lessons", "task_tasks"):
            await self.conn.execute(
                f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                f"(SELECT max(id) FROM {table}))"
            )

    async def close(self) -> None:
        await self.conn.close()


def bar(length: int, label: str) -> Any:
    return click.progressbar(length=length, label=label, file=sys.stderr, show_pos=True)


async def space_of(sink: Sink, setup: Setup) -> Space:
    pk = await sink.value("SELECT id FROM spaces WHERE public_id = ?", setup.space_id)
    admin_pk = await sink.value("SELECT created_by FROM spaces WHERE id = ?", pk)
    admin_id = await sink.value("SELECT public_id FROM principals WHERE id = ?", admin_pk)
    project_pks = [
        await sink.value("SELECT id FROM task_projects WHERE public_id = ?", p)
        for p in setup.project_ids
    ]
    return Space(
        pk,
        setup.space_id,
        admin_pk,
        admin_id,
        project_pks,
        setup.project_ids,
        [a[1] for a in setup.agents],
    )


@dataclasses.dataclass
class Seeded:
    space: Space
    queries: dict[str, dict[str, list[str]]]
    figures: dict[str, Any]


async def seed(sink: Sink, setup: Setup, opts: argparse.Namespace) -> Seeded:
    """The lessons and tasks, in batches; the queries chosen from their text."""
    rng = random.Random(opts.seed)
    corpus = Corpus.build(opts.seed)
    space = await space_of(sink, setup)
    now = int(time.time() * 1000)
    figures: dict[str, Any] = {}
    queries: dict[str, dict[str, list[str]]] = {}

    started = time.perf_counter()
    first = int(await sink.value("SELECT coalesce(max(id), 0) + 1 FROM lesson_lessons"))
    counts: collections.Counter[str] = collections.Counter()
    written = 0
    with bar(opts.lessons, f"{sink.dialect}: lessons") as shown:
        for start in range(0, opts.lessons, BATCH):
            count = min(BATCH, opts.lessons - start)
            rows, revisions = lesson_rows(
                corpus, space, first, start, count, rng, counts, now, opts.lessons
            )
            async with sink.transaction():
                await sink.insert("lesson_lessons", LESSON_COLUMNS, rows)
                await sink.insert("lesson_revisions", LESSON_REVISION_COLUMNS, revisions)
            written += len(revisions)
            shown.update(count)
    figures["lessons"] = {
        "records": opts.lessons,
        "revisions": written,
        "seconds": round(time.perf_counter() - started, 1),
    }
    queries["lessons"] = choose_queries(corpus, counts, opts.lessons, rng)

    started = time.perf_counter()
    first = int(await sink.value("SELECT coalesce(max(id), 0) + 1 FROM task_tasks"))
    ready = min(
        opts.tasks, max(opts.tasks // 5, 3 * (opts.writes + opts.write_warmup) * 5 // 4 + 50)
    )
    states = task_states(opts.tasks, ready, rng)
    counts = collections.Counter()
    with bar(opts.tasks, f"{sink.dialect}: tasks") as shown:
        for start in range(0, opts.tasks, BATCH):
            count = min(BATCH, opts.tasks - start)
            rows, revisions = task_rows(
                corpus, space, first, states, start, count, rng, counts, now
            )
            async with sink.transaction():
                await sink.insert("task_tasks", TASK_COLUMNS, rows)
                await sink.insert("task_revisions", TASK_REVISION_COLUMNS, revisions)
            shown.update(count)
    figures["tasks"] = {
        "records": opts.tasks,
        "by_state": dict(collections.Counter(s for s, _ in states)),
        "seconds": round(time.perf_counter() - started, 1),
    }
    queries["tasks"] = choose_queries(corpus, counts, opts.tasks, rng)
    await sink.finish()
    return Seeded(space, queries, figures)


# --------------------------------------------------------------------------- in process


@contextlib.asynccontextmanager
async def opened_app(data_dir: Path, url: str | None) -> Any:
    """A BuildMax app (every installed plugin) connected to the database, not serving."""
    from buildmax.app import close_blob_store, create_app
    from buildmax.config import load_config

    overrides: dict[str, Any] = {"data_dir": str(data_dir)}
    if url:
        overrides["database_url"] = url
    app = create_app(load_config(None, environ={}, **overrides))
    await app.db.connect()
    try:
        yield app
    finally:
        await close_blob_store(app)
        await app.db.close()


def indexes() -> dict[str, Any]:
    """Each target's index and the select its records are indexed from (as
    the plugins fill and rebuild them), keyed by record id."""
    import sqlalchemy as sa
    from buildmax_lessons.tables import SEARCH, lessons, revisions
    from buildmax_tasks.search import TASK_SEARCH
    from buildmax_tasks.tables import task_revisions, tasks

    lesson_rows_ = sa.select(
        lessons.c.id, lessons.c.space_id, revisions.c.title, revisions.c.text
    ).select_from(
        lessons.join(
            revisions,
            sa.and_(
                revisions.c.lesson_id == lessons.c.id, revisions.c.number == lessons.c.revision
            ),
        )
    )
    task_rows_ = (
        sa.select(tasks.c.id, tasks.c.space_id, tasks.c.title, task_revisions.c.criteria)
        .select_from(
            tasks.join(
                task_revisions,
                sa.and_(
                    task_revisions.c.task_id == tasks.c.id,
                    task_revisions.c.number == tasks.c.revision,
                ),
            )
        )
        .where(tasks.c.subject_task_id.is_(None))
    )
    return {
        "lessons": (SEARCH, lesson_rows_, lessons.c.id, "lesson_lessons"),
        "tasks": (TASK_SEARCH, task_rows_, tasks.c.id, "task_tasks"),
    }


async def fill_indexes(app: Any, figures: dict[str, Any]) -> None:
    """Both indexes through ``TextIndex.fill``, a transaction per 10,000 records."""
    import sqlalchemy as sa

    for target, (index, rows, key, table) in indexes().items():
        started = time.perf_counter()
        async with app.db.read(background=True) as conn:
            low = await conn.fetch_val(sa.text(f"SELECT min(id) FROM {table}"))
            high = await conn.fetch_val(sa.text(f"SELECT max(id) FROM {table}"))
        low, high = int(low or 0), int(high or 0)
        with bar(high - low + 1, f"{app.db.dialect}: {index.name}") as shown:
            for start in range(low, high + 1, BATCH):
                end = min(high, start + BATCH - 1)
                async with app.db.write() as tx:
                    await index.fill(tx, rows.where(key.between(start, end)))
                shown.update(end - start + 1)
        figures[target]["index_fill_seconds"] = round(time.perf_counter() - started, 1)


async def vacuum_postgres(url: str) -> float:
    """``VACUUM (ANALYZE)`` of the seeded tables (flushes GIN pending lists)."""
    import asyncpg

    started = time.perf_counter()
    conn = await asyncpg.connect(url)
    try:
        for table in (
            "lesson_lessons",
            "lesson_revisions",
            "lesson_search",
            "task_tasks",
            "task_revisions",
            "task_search",
        ):
            await conn.execute(f"VACUUM (ANALYZE) {table}")
    finally:
        await conn.close()
    return round(time.perf_counter() - started, 1)


async def statements_alone(
    app: Any, space_pk: int, cases: list[Case], runs: int, explain: bool
) -> dict[str, Any]:
    """Per class: the matches of each query (SQL count); the index's
    statements alone, as both search routes use them, through BuildMax's
    database layer (no HTTP, no route): the ranking (the best ``PAGE`` of
    the ``MAX_HITS`` = 1,000 newest matches, as the task search orders them,
    no snippets) and the snippets of that page;
    with ``explain`` the plan of the class's first ranking."""
    import sqlalchemy as sa

    from buildmax.fulltext import parse_query

    found: dict[str, Any] = {}
    table = indexes()
    for case in cases:
        if case.text is None:
            continue
        index = table[case.target][0]
        parsed = parse_query(case.text)
        async with app.db.read(background=True) as conn:
            if conn.dialect == "sqlite":
                count_sql = (
                    f"SELECT count(*) FROM {index.name} WHERE {index.name} MATCH :q "
                    "AND scope = :scope"
                )
                q = parsed.fts5()
            else:
                count_sql = (
                    f"SELECT count(*) FROM {index.name} WHERE document @@ "
                    "websearch_to_tsquery('english', :q) AND scope = :scope"
                )
                q = parsed.websearch()
            case.matches = int(
                await conn.fetch_val(sa.text(count_sql), {"q": q, "scope": space_pk})
            )
    for target in TARGETS:
        index = table[target][0]
        for cls in SEARCH_CLASSES:
            mine = [c for c in cases if c.target == target and c.cls == cls]
            parsed_all = [parse_query(c.text or "") for c in mine]
            ranking: list[float] = []
            snippets: list[float] = []
            for n in range(runs + len(parsed_all)):
                parsed = parsed_all[n % len(parsed_all)]
                started = time.perf_counter()
                async with app.db.read(background=True) as conn:
                    hits = await conn.fetch_all(
                        _best(index, conn.dialect, target, space_pk, parsed)
                    )
                ranked = time.perf_counter()
                keys = [hit["key"] for hit in hits]
                async with app.db.read(background=True) as conn:
                    await index.snippets(conn, space_pk, parsed, keys)
                if n >= len(parsed_all):  # a first pass over every query warms up
                    ranking.append(ranked - started)
                    snippets.append(time.perf_counter() - ranked)
            matches = sorted(c.matches or 0 for c in mine)
            entry: dict[str, Any] = {
                "ranking": latency_summary(ranking),
                "snippets": latency_summary(snippets),
                "matches": {
                    "min": matches[0],
                    "median": matches[len(matches) // 2],
                    "max": matches[-1],
                },
                "hits_last": len(hits),
            }
            if explain:
                entry["plan"] = await _plan(app, index, target, space_pk, parsed_all[0])
            found[f"{target}: {cls}"] = entry
    return found


def _best(index: Any, dialect: str, target: str, space_pk: int, parsed: Any) -> Any:
    """The ranking statement as the task search runs it: the best ``PAGE``
    of the newest ``MAX_HITS`` matches (no filter but the space)."""
    import sqlalchemy as sa

    records = indexes()[target][2].table
    matches = index.matches(
        dialect, space_pk, parsed, key=records.c.id, space=records.c.space_id, limit=MAX_HITS
    )
    return (
        sa.select(matches.c.key).order_by(matches.c.rank.desc(), matches.c.key.desc()).limit(PAGE)
    )


async def _plan(app: Any, index: Any, target: str, space_pk: int, parsed: Any) -> list[str]:
    import sqlalchemy as sa
    from sqlalchemy.dialects import sqlite

    from buildmax.database.postgres import _postgres_dialect
    from buildmax.database.statements import StatementCompiler

    statement = _best(index, app.db.dialect, target, space_pk, parsed)
    prefix = "EXPLAIN QUERY PLAN " if app.db.dialect == "sqlite" else "EXPLAIN (ANALYZE, BUFFERS) "
    if app.db.dialect == "sqlite":
        sql, params = StatementCompiler(sqlite.dialect(paramstyle="named")).compile(statement)
    else:
        sql = str(
            statement.compile(dialect=_postgres_dialect(), compile_kwargs={"literal_binds": True})
        )
        params = {}
    async with app.db.read(background=True) as conn:
        rows = await conn.fetch_all(sa.text(prefix + sql), params)
    if app.db.dialect == "sqlite":
        return [f"{r['id']}<-{r['parent']} {r['detail']}" for r in rows]
    return [next(iter(r.values())) for r in rows]


async def index_check(app: Any, space_pk: int) -> dict[str, int]:
    """Records of the space missing from their index (tasks: not stage work)."""
    import sqlalchemy as sa

    key = "rowid" if app.db.dialect == "sqlite" else "key"
    found = {}
    async with app.db.read(background=True) as conn:
        for target, (index, _, _, table) in indexes().items():
            stage = " AND r.subject_task_id IS NULL" if target == "tasks" else ""
            found[target] = int(
                await conn.fetch_val(
                    sa.text(
                        f"SELECT count(*) FROM {table} r WHERE r.space_id = :s{stage} AND NOT "
                        f"EXISTS (SELECT 1 FROM {index.name} i WHERE i.{key} = r.id)"
                    ),
                    {"s": space_pk},
                )
            )
    return found


# --------------------------------------------------------------------------- queries


def cases_of(seeded: Seeded, setup: Setup) -> list[Case]:
    """Every query the benchmark sends, by target and class."""
    found: list[Case] = []
    projects = setup.project_ids
    for target in TARGETS:
        base = f"/v1/spaces/{setup.space_id}/{target}"
        for cls, texts in seeded.queries[target].items():
            for n, text in enumerate(texts):
                args: dict[str, Any] = {"q": text, "limit": PAGE}
                if cls == "word + filter":
                    args.update(_filter(target, n, projects))
                path = f"{base}?{urllib.parse.urlencode(args)}"
                found.append(Case(target, cls, path, text))
        for n in range(QUERIES_PER_CLASS):
            args = {"limit": PAGE}
            if n % 2:
                args["project"] = projects[n % len(projects)]
            found.append(Case(target, PEER, f"{base}?{urllib.parse.urlencode(args)}", None))
    return found


def _filter(target: str, n: int, projects: list[str]) -> dict[str, str]:
    if target == "lessons":
        return [
            {"kind": "gotcha"},
            {"tag": LABELS[n % len(LABELS)]},
            {"project": projects[n % len(projects)]},
        ][n % 3]
    return [
        {"state": "ready"},
        {"kind": "general"},
        {"project": projects[n % len(projects)]},
        {"label": LABELS[n % len(LABELS)]},
    ][n % 4]


def by_class(cases: list[Case]) -> dict[str, list[Case]]:
    found: dict[str, list[Case]] = collections.defaultdict(list)
    for case in cases:
        found[f"{case.target}: {case.cls}"].append(case)
    return dict(found)


# --------------------------------------------------------------------------- measuring


def server_times(server: Server) -> dict[str, tuple[int, float]]:
    """Status and duration (s) of each request in the server's log, by request id."""
    found = {}
    for line in server.log().splitlines():
        m = REQUEST_LINE.search(line)
        if m:
            found[m.group(1)] = (int(m.group(4)), float(m.group(5)) / 1000)
    return found


def sequential(server: Server, token: str, cases: list[Case], requests: int) -> dict[str, Any]:
    """``requests`` of each class one at a time, the classes interleaved,
    after one pass over every query (not counted)."""
    classes = by_class(cases)
    ids: dict[str, list[str]] = collections.defaultdict(list)
    client_s: dict[str, list[float]] = collections.defaultdict(list)
    items: dict[str, list[int]] = collections.defaultdict(list)
    statuses: dict[str, collections.Counter[int]] = collections.defaultdict(collections.Counter)
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=server.url, timeout=30, headers=headers) as client:
        for case in cases:
            client.get(case.path)
        started = time.perf_counter()
        for n in range(requests):
            for name, mine in classes.items():
                case = mine[n % len(mine)]
                rid = f"rq_bsearch_{len(ids[name])}_{secrets.token_hex(6)}"
                t0 = time.perf_counter()
                answer = client.get(case.path, headers={"X-Request-Id": rid})
                client_s[name].append(time.perf_counter() - t0)
                statuses[name][answer.status_code] += 1
                if answer.status_code == 200:
                    items[name].append(len(answer.json()["items"]))
                ids[name].append(rid)
        wall = time.perf_counter() - started
    time.sleep(0.5)  # the last request's log line
    logged = server_times(server)
    found: dict[str, Any] = {}
    pooled: dict[str, list[float]] = {ALL_SEARCHES: [], ISSUE_MIX: []}
    for name in classes:
        times = [logged[i][1] for i in ids[name] if i in logged]
        cls = name.split(": ", 1)[1]
        if cls != PEER:
            pooled[ALL_SEARCHES] += times
        if cls in ISSUE_CLASSES:
            pooled[ISSUE_MIX] += times
        counted = sorted(items[name]) or [0]
        found[name] = {
            "server": latency_summary(times),
            "client": latency_summary(client_s[name]),
            "per_second": round(len(client_s[name]) / sum(client_s[name]), 1),
            "items_median": counted[len(counted) // 2],
            "statuses": dict(statuses[name]),
        }
    for name, times in pooled.items():
        found[name] = {"server": latency_summary(times)}
    found["_wall_s"] = round(wall, 1)
    return found


async def _closed_loop(
    port: int, token: str, paths: list[str], connections: int, seconds: float
) -> tuple[list[float], collections.Counter[str], float]:
    latencies: list[float] = []
    errors: collections.Counter[str] = collections.Counter()
    end = time.perf_counter() + seconds

    async def worker(offset: int) -> None:
        conn = HttpConn(port)
        n = offset
        try:
            while time.perf_counter() < end:
                path = paths[n % len(paths)]
                n += connections
                t0 = time.perf_counter()
                try:
                    status, _ = await asyncio.wait_for(conn.request("GET", path, token), 30)
                except (TimeoutError, OSError, asyncio.IncompleteReadError) as exc:
                    errors[type(exc).__name__] += 1
                    await conn.close()
                    continue
                if status == 200:
                    latencies.append(time.perf_counter() - t0)
                else:
                    errors[f"HTTP {status}"] += 1
        finally:
            await conn.close()

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(connections)))
    return latencies, errors, time.perf_counter() - started


def under_load(
    server: Server, token: str, cases: list[Case], connections: int, seconds: float
) -> dict[str, Any]:
    """Each class alone, then every search class mixed, ``connections``
    keep-alive connections in a closed loop for ``seconds`` each."""
    port = int(urllib.parse.urlsplit(server.url).port or 0)
    windows = {name: [c.path for c in mine] for name, mine in by_class(cases).items()}
    mixed = [c.path for c in cases if c.cls != PEER]
    random.Random(3).shuffle(mixed)
    windows["all searches (mixed)"] = mixed
    found = {}
    for name, paths in windows.items():
        latencies, errors, wall = run_async(_closed_loop(port, token, paths, connections, seconds))
        found[name] = {
            "per_second": round(len(latencies) / wall, 1),
            "client": latency_summary(latencies),
            "errors": dict(errors),
        }
    return found


def _lesson_body(corpus: Corpus, rng: random.Random) -> dict[str, Any]:
    title, _ = corpus.title(rng)
    text, _ = corpus.text(rng, rng.randint(30, 150))
    return {
        "kind": "gotcha",
        "title": title,
        "text": text,
        "applies_to": {"task_kinds": ["code"], "tags": [rng.choice(LABELS)]},
    }


def measure_writes(server: Server, setup: Setup, opts: argparse.Namespace) -> dict[str, Any]:
    """Task create with and without the index (ABBA), and submit with no
    lessons, 2 lessons, 2 lessons without the index (rotating)."""
    rng = random.Random(opts.seed + 1)
    corpus = Corpus.build(opts.seed)
    base = f"/v1/spaces/{setup.space_id}"
    ids: dict[str, list[str]] = collections.defaultdict(list)
    client_s: dict[str, list[float]] = collections.defaultdict(list)
    rounds = opts.write_warmup + opts.writes

    def send(
        client: httpx.Client, name: str, path: str, token: str, body: Any, off: bool, n: int
    ) -> Any:
        rid = f"rq_bsearchw_{secrets.token_hex(8)}"
        headers = {"Authorization": f"Bearer {token}", "X-Request-Id": rid}
        if off:
            headers[INDEX_SWITCH] = "off"
        t0 = time.perf_counter()
        answer = client.post(path, json=body, headers=headers)
        elapsed = time.perf_counter() - t0
        if answer.status_code != 201:
            raise BenchError(f"{name}: {answer.status_code} {answer.text[:300]}")
        if n >= opts.write_warmup:
            ids[name].append(rid)
            client_s[name].append(elapsed)
        return answer.json()

    agents = setup.agents
    with httpx.Client(base_url=server.url, timeout=30) as client:
        creates = ("task create, index", "task create, no index")
        for n in range(rounds):
            for name in creates if n % 4 in (0, 3) else creates[::-1]:
                title, _ = corpus.title(rng)
                criteria, _ = corpus.text(rng, rng.randint(8, 40))
                body, _ = corpus.text(rng, rng.randint(10, 40))
                task = {
                    "project": rng.choice(setup.project_ids),
                    "kind": "general",
                    "title": title,
                    "criteria": criteria,
                    "body": body,
                    "labels": sorted(rng.sample(LABELS, 2)),
                }
                send(client, name, f"{base}/tasks", agents[0][2], task, "no index" in name, n)
        submits = ("submit, no lessons", "submit, 2 lessons", "submit, 2 lessons, no index")
        for n in range(rounds):
            for k in range(3):
                name = submits[(n + k) % 3]
                token = agents[(n * 3 + k) % len(agents)][2]
                claimed = client.post(
                    f"{base}/claims",
                    json={"kind": "code"},
                    headers={"Authorization": f"Bearer {token}"},
                )
                if claimed.status_code != 201:
                    raise BenchError(f"claim: {claimed.status_code} {claimed.text[:300]}")
                answer = claimed.json()
                attempt = answer["attempt"]
                submit: dict[str, Any] = {
                    "generation": attempt["generation"],
                    "summary": "Done; see the lessons.",
                }
                if name.startswith("submit, 2 lessons"):
                    submit["extensions"] = {
                        "lessons": [_lesson_body(corpus, rng), _lesson_body(corpus, rng)]
                    }
                path = f"{base}/attempts/{attempt['id']}/submit"
                send(client, name, path, answer["token"], submit, "no index" in name, n)
    time.sleep(0.5)
    logged = server_times(server)
    found: dict[str, Any] = {}
    for name in (*creates, *submits):
        times = [logged[i][1] for i in ids[name] if i in logged]
        found[name] = {"server": latency_summary(times), "client": latency_summary(client_s[name])}
    return found


# --------------------------------------------------------------------------- servers


def start_switchable(workdir: Path, data_dir: Path, url: str | None) -> Server:
    """``buildmax serve`` through this script's wrapper (``INDEX_SWITCH``)."""
    port = free_port()
    args = [
        sys.executable,
        str(Path(__file__).resolve()),
        SERVE_SWITCHABLE,
        *serve_args(data_dir, port, url)[len(buildmax_command()) :],
    ]
    progress(f"starting buildmax (index switch): {' '.join(args)}")
    log = workdir / "buildmax-switch.log"
    server = spawn("buildmax-switch", args, log, f"http://{HOST}:{port}", server_env())
    wait_ready(server, "/readyz", timeout=SETUP_TIMEOUT_S)
    return server


def serve_with_index_switch(argv: list[str]) -> None:
    """Run ``buildmax <argv>`` with ``TextIndex.put`` doing nothing in a
    request that carries ``X-Bench-Index: off``."""
    from quart import has_request_context, request

    from buildmax.cli import main as buildmax_main
    from buildmax.fulltext import TextIndex

    original = TextIndex.put

    async def put(self: Any, tx: Any, key: int, scope: int, values: Any) -> None:
        if has_request_context() and request.headers.get(INDEX_SWITCH) == "off":
            return
        await original(self, tx, key, scope, values)

    TextIndex.put = put  # type: ignore[method-assign]
    sys.argv = ["buildmax", *argv]
    buildmax_main()


def _peak_rss_mib(server: Server) -> float | None:
    hwm = proc_status(server.pid).get("VmHWM")
    return round(hwm / 1024, 1) if hwm else None


@contextlib.contextmanager
def database(engine: str, opts: argparse.Namespace, workdir: Path) -> Iterator[str | None]:
    """``None`` for SQLite; on PostgreSQL a fresh migrated database's URL
    (dropped after, unless ``--keep``)."""
    if engine == "sqlite":
        yield None
        return
    name = f"bench_search_{os.getpid()}_{secrets.token_hex(4)}"
    admin_url, url = db_url(opts.pg_url, "postgres"), db_url(opts.pg_url, name)
    try:
        run_async(_admin(admin_url, f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        raise BenchError(f"PostgreSQL at {opts.pg_url}: {exc}") from None
    try:
        migrate = [*buildmax_command(), "db", "migrate", "--database-url", url]
        done = subprocess.run(
            migrate, capture_output=True, text=True, env=server_env(), timeout=SETUP_TIMEOUT_S
        )
        if done.returncode != 0:
            raise BenchError(f"buildmax db migrate failed:\n{done.stdout}\n{done.stderr}")
        yield url
    finally:
        if opts.keep:
            progress(f"kept database {name}: {url}")
        else:
            _drop(admin_url, name)


def _drop(admin_url: str, name: str) -> None:
    try:
        run_async(_admin(admin_url, f'DROP DATABASE "{name}" WITH (FORCE)'))
        progress(f"dropped database {name}")
    except Exception as exc:
        progress(f"could not drop database {name}: {exc}")


def run_engine(engine: str, opts: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Seed, fill, measure reads, then writes, on one engine."""
    here = workdir / engine
    here.mkdir()
    data_dir = here / "data"
    result: dict[str, Any] = {"load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    with database(engine, opts, here) as url:
        first = start_server("buildmax-setup", here, data_dir, url)
        try:
            token = admin_token_of(first)
            setup = setup_space(first, token, argparse.Namespace(projects=PROJECTS, agents=AGENTS))
        finally:
            first.stop()
        started = time.perf_counter()

        async def seed_all() -> Seeded:
            sink: Sink = (
                SqliteSink(data_dir / "buildmax.db")
                if url is None
                else await PostgresSink.open(url)
            )
            try:
                return await seed(sink, setup, opts)
            finally:
                await sink.close()

        seeded = run_async(seed_all())
        cases = cases_of(seeded, setup)

        async def fill() -> None:
            async with opened_app(data_dir, url) as app:
                await fill_indexes(app, seeded.figures)
            if url is not None:
                seeded.figures["vacuum_analyze_seconds"] = await vacuum_postgres(url)

        run_async(fill())
        seeded.figures["whole_seed_seconds"] = round(time.perf_counter() - started, 1)

        async def in_process() -> dict[str, Any]:
            async with opened_app(data_dir, url) as app:
                return await statements_alone(
                    app, seeded.space.pk, cases, opts.statement_runs, opts.explain
                )

        progress(f"{engine}: the index statements alone, in process")
        alone = run_async(in_process())
        seeded.figures["database_mib"] = _database_mib(data_dir, url)
        result["seed"] = seeded.figures
        result["queries"] = {t: {c: q[:3] for c, q in seeded.queries[t].items()} for t in TARGETS}
        result["alone"] = alone

        agent_token = setup.agents[0][2]
        server = start_server("buildmax", here, data_dir, url)
        progress(f"{engine}: server pid {server.pid}; {opts.requests} of each class, one at a time")
        try:
            result["sequential"] = sequential(server, agent_token, cases, opts.requests)
            progress(f"{engine}: {opts.connections} connections, {opts.duration:g} s per class")
            result["load"] = under_load(server, agent_token, cases, opts.connections, opts.duration)
            result["server_vmhwm_mib"] = _peak_rss_mib(server)
        finally:
            server.stop()

        server = start_switchable(here, data_dir, url)
        progress(f"{engine}: writes, {opts.writes} of each (pid {server.pid})")
        try:
            result["writes"] = measure_writes(server, setup, opts)
            result["writes_server_vmhwm_mib"] = _peak_rss_mib(server)
        finally:
            server.stop()

        async def check() -> dict[str, int]:
            async with opened_app(data_dir, url) as app:
                return await index_check(app, seeded.space.pk)

        missing = run_async(check())
        rounds = opts.writes + opts.write_warmup
        result["index_check"] = {
            "tasks missing": missing["tasks"],
            "tasks expected missing": rounds,
            "lessons missing": missing["lessons"],
            "lessons expected missing": 2 * rounds,
        }
    result["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return result


def _database_mib(data_dir: Path, url: str | None) -> float | None:
    if url is None:
        files = [data_dir / n for n in ("buildmax.db", "buildmax.db-wal")]
        return round(sum(f.stat().st_size for f in files if f.exists()) / 2**20, 1)

    async def size() -> int:
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            return int(await conn.fetchval("SELECT pg_database_size(current_database())"))
        finally:
            await conn.close()

    return round(run_async(size()) / 2**20, 1)


# --------------------------------------------------------------------------- report


def verdicts(report: dict[str, Any]) -> list[str]:
    found = []
    for engine, result in report["engines"].items():
        for name, m in result["sequential"].items():
            if name.startswith("_") or name.endswith(PEER):
                continue
            p95 = m["server"]["p95"]
            mark = "PASS" if p95 is not None and p95 < TARGET_P95_MS else "MISS"
            found.append(
                f"{mark}  {engine}: {name}: server p95 {p95} ms (target < {TARGET_P95_MS:g})"
            )
    return found


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value:g}"


def print_report(report: dict[str, Any]) -> None:
    print(
        f"Search at {report['lessons']:,} lessons and {report['tasks']:,} tasks in one space "
        f"(page of {PAGE}; {QUERIES_PER_CLASS} queries per class)"
    )
    print(f"  versions: {report['versions']}")
    for engine, r in report["engines"].items():
        s = r["seed"]
        print(
            f"\n{engine} (load average {r['load_average_at_start']} at its start, "
            f"{r['load_average_at_end']} at its end; {report['cpus']} CPUs)"
        )
        print(
            f"  seed: lessons {s['lessons']['seconds']} s ({s['lessons']['records']:,} + "
            f"{s['lessons']['revisions']:,} revisions), index fill "
            f"{s['lessons'].get('index_fill_seconds')} s; tasks {s['tasks']['seconds']} s "
            f"({s['tasks']['by_state']}), index fill {s['tasks'].get('index_fill_seconds')} s"
            + (
                f"; VACUUM (ANALYZE) {s['vacuum_analyze_seconds']} s"
                if "vacuum_analyze_seconds" in s
                else ""
            )
            + f"; whole seed {s['whole_seed_seconds']} s; database {s['database_mib']} MiB"
        )
        for target, classes in r["queries"].items():
            for cls, texts in classes.items():
                print(f"  {target}: {cls}: e.g. {' | '.join(texts)}")
        seq = r["sequential"]
        print(
            f"\n  one request at a time ({report['requests']} of each, interleaved; "
            f"{seq['_wall_s']} s); ms"
        )
        print(
            f"  {'class':<33} {'server p50':>10} {'p95':>7} {'p99':>7} {'max':>7}  "
            f"{'client p50':>10} {'p95':>7}  {'req/s':>6}  {'items':>5}  statuses"
        )
        for name, m in seq.items():
            if name.startswith("_"):
                continue
            sv, cl = m["server"], m.get("client")
            row = (
                f"  {name:<33} {_ms(sv['p50']):>10} {_ms(sv['p95']):>7} {_ms(sv['p99']):>7} "
                f"{_ms(sv['max']):>7}"
            )
            if cl is not None:
                row += (
                    f"  {_ms(cl['p50']):>10} {_ms(cl['p95']):>7}  {m['per_second']:>6}  "
                    f"{m['items_median']:>5}  {m['statuses']}"
                )
            print(row)
        print(
            "  (server: the request's duration in the server's log; client: around the call; "
            "req/s: one at a time; items: median of a page)"
        )
        print(
            f"\n  the index's statements alone, in process ({report['statement_runs']} of each "
            "class); ms"
        )
        print(
            f"  {'class':<33} {'matches min/median/max':>22}  {'ranking p50':>11} {'p95':>7}  "
            f"{'snippets p50':>12} {'p95':>7}"
        )
        for name, a in r["alone"].items():
            mt, rk, sn = a["matches"], a["ranking"], a["snippets"]
            matches = f"{mt['min']}/{mt['median']}/{mt['max']}"
            print(
                f"  {name:<33} {matches:>22}  {_ms(rk['p50']):>11} {_ms(rk['p95']):>7}  "
                f"{_ms(sn['p50']):>12} {_ms(sn['p95']):>7}"
            )
        print(
            f"  (matches: records holding every word of the query, before filters; ranking: "
            f"the best {PAGE} of the {MAX_HITS:,} newest matches, no snippets; "
            f"snippets: of those {PAGE})"
        )
        print(
            f"\n  under load ({report['connections']} connections, "
            f"{report['duration']:g} s each); client ms"
        )
        print(f"  {'class':<28} {'req/s':>7} {'p50':>7} {'p95':>7} {'p99':>7}  errors")
        for name, m in r["load"].items():
            c = m["client"]
            print(
                f"  {name:<28} {m['per_second']:>7} {_ms(c['p50']):>7} {_ms(c['p95']):>7} "
                f"{_ms(c['p99']):>7}  {m['errors'] or ''}"
            )
        w = r["writes"]
        print(f"\n  writes ({report['writes']} of each after {report['write_warmup']}); ms")
        print(f"  {'operation':<28} {'server p50':>10} {'p95':>7} {'p99':>7}  {'client p50':>10}")
        for name, m in w.items():
            sv = m["server"]
            print(
                f"  {name:<28} {_ms(sv['p50']):>10} {_ms(sv['p95']):>7} {_ms(sv['p99']):>7}  "
                f"{_ms(m['client']['p50']):>10}"
            )
        for label, with_, without in (
            ("the task index on create", "task create, index", "task create, no index"),
            ("2 carried lessons on submit", "submit, 2 lessons", "submit, no lessons"),
            (
                "their index on submit",
                "submit, 2 lessons",
                "submit, 2 lessons, no index",
            ),
        ):
            a, b = w[with_]["server"], w[without]["server"]
            print(
                f"  cost of {label}: p50 {_diff(a['p50'], b['p50'])}, "
                f"p95 {_diff(a['p95'], b['p95'])}"
            )
        print(f"  index check after the writes: {r['index_check']}")
        print(
            f"  server VmHWM: reads {r['server_vmhwm_mib']} MiB, "
            f"writes {r['writes_server_vmhwm_mib']} MiB"
        )
        if report["explain"]:
            print("\n  plans of each class's first query (the index's statement):")
            for name, a in r["alone"].items():
                print(f"  {name}:")
                for line in a.get("plan", []):
                    print(f"      {line}")
    print(f"\nTarget (issue 24, item 2): search p95 < {TARGET_P95_MS:g} ms, server time")
    for verdict in report["verdicts"]:
        print(f"  {verdict}")


def _diff(a: float | None, b: float | None) -> str:
    if a is None or b is None:
        return "-"
    ratio = f" ({a / b:.2f}x)" if b else ""
    return f"{a - b:+.1f} ms{ratio}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="lesson and task search at 100,000 records each, and the index's write cost"
    )
    p.add_argument("--lessons", type=int, default=None, help="lessons seeded (100,000)")
    p.add_argument("--tasks", type=int, default=None, help="tasks seeded (100,000)")
    p.add_argument("--requests", type=int, default=None, help="of each class, one at a time (200)")
    p.add_argument("--writes", type=int, default=None, help="of each write variant (200)")
    p.add_argument("--write-warmup", type=int, default=10, help="write rounds not counted (10)")
    p.add_argument("--connections", type=int, default=4, help="under load (4)")
    p.add_argument("--duration", type=float, default=None, help="seconds per load window (5)")
    p.add_argument(
        "--statement-runs", type=int, default=None, help="in-process statement runs per class (50)"
    )
    p.add_argument(
        "--quick", action="store_true", help="2,000 of each, fewer requests: a smoke run"
    )
    p.add_argument(
        "--engine",
        default="both",
        choices=("sqlite", "postgresql", "postgres", "both"),
        help="which engine(s) (both)",
    )
    p.add_argument(
        "--pg-url",
        default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432"),
        help="the PostgreSQL server a fresh database is made on, and dropped after "
        "(default $BENCH_PG_URL or postgresql://postgres@127.0.0.1:5432)",
    )
    p.add_argument("--seed", type=int, default=24, help="of the corpus and the choices (24)")
    p.add_argument("--explain", action="store_true", help="print each class's query plan")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep the temp directory (logs, SQLite) and the PostgreSQL database",
    )
    opts = p.parse_args(argv)
    quick = opts.quick
    for name, full, small in (
        ("lessons", 100_000, 2_000),
        ("tasks", 100_000, 2_000),
        ("requests", 200, 40),
        ("writes", 200, 30),
        ("duration", 5.0, 2.0),
        ("statement_runs", 50, 20),
    ):
        if getattr(opts, name) is None:
            setattr(opts, name, small if quick else full)
    if not 100 <= opts.lessons <= 2_000_000 or not 100 <= opts.tasks <= 2_000_000:
        p.error("--lessons and --tasks: 100..2,000,000")
    if not 1 <= opts.requests <= 10_000 or not 1 <= opts.writes <= 10_000:
        p.error("--requests and --writes: 1..10,000")
    if not 1 <= opts.connections <= 64 or not 0.5 <= opts.duration <= 600:
        p.error("--connections 1..64, --duration 0.5..600")
    if not 0 <= opts.write_warmup <= 1000 or not 1 <= opts.statement_runs <= 10_000:
        p.error("--write-warmup 0..1000, --statement-runs 1..10,000")
    return opts


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == [SERVE_SWITCHABLE]:
        serve_with_index_switch(argv[1:])
        return 0
    opts = parse_args(argv)
    engines = {"both": ["sqlite", "postgresql"], "postgres": ["postgresql"]}.get(
        opts.engine, [opts.engine]
    )
    started = time.perf_counter()

    def work(workdir: Path) -> dict[str, Any]:
        report: dict[str, Any] = {
            "lessons": opts.lessons,
            "tasks": opts.tasks,
            "requests": opts.requests,
            "writes": opts.writes,
            "write_warmup": opts.write_warmup,
            "connections": opts.connections,
            "duration": opts.duration,
            "explain": opts.explain,
            "statement_runs": opts.statement_runs,
            "versions": versions(),
            "cpus": os.cpu_count(),
            "load_average_at_start": os.getloadavg(),
            "engines": {},
        }
        for engine in engines:
            report["engines"][engine] = run_engine(engine, opts, workdir)
        report["verdicts"] = verdicts(report)
        return report

    report = run_in_scratch("bench_search", opts.keep, work)
    if report is None:
        return 1
    report["whole_run_s"] = round(time.perf_counter() - started, 1)
    if opts.json:
        print(json.dumps(report, indent=2, default=str))
    else:
        print_report(report)
        print(f"Whole run: {report['whole_run_s']} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
