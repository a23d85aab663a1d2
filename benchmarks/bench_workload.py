"""The acceptance workload, open loop, on SQLite and on PostgreSQL (1 and 2 processes).

    python benchmarks/bench_workload.py                       # factor search, a few minutes
    python benchmarks/bench_workload.py --factor 20           # one window at 1,000 requests/s
    python benchmarks/bench_workload.py --engines sqlite --soak 1800   # 30 min at factor 1
    python benchmarks/bench_workload.py --historical 20000 --duration 5 --warmup 2   # quick

The design record's acceptance workload is factor 1: 20 projects, 100,000
historical tasks, 50 agent sessions, 50 API requests/s (40 reads and 10
writes), a burst of 100 simultaneous claims, a concurrent artifact upload
and a backup; p95 under 500 ms for ordinary metadata operations, no
unexpected server error, no incorrect ownership, bounded memory. Our own
goal is factor 20 (1,000 requests/s) with p95 under 50 ms.

**Servers.** Started as ``bench_claims.py`` starts them: ``buildmax serve``
with no configuration file and no ``BUILDMAX_*`` variables. SQLite: one
process on a fresh data directory. PostgreSQL: a fresh database on
``--pg-url`` per configuration, ``buildmax db migrate``, then 1 and 2
``buildmax serve`` processes (``--pg-processes``); the database is dropped
at the end. Setup over HTTP (``bench_claims.setup_space``: the space, the
projects, 50 principals of kind ``agent``, members, each with its own
token), then bulk seeding (``bench_claims.seed_sqlite``/``seed_postgres``):
``--historical`` done tasks and ``--ready`` ready ones (by default enough
that the planned run cannot drain the queue: three times the claims its
work loops would make, at least 5,000).

**Open loop.** Requests are sent on a fixed schedule, ``factor x 40`` reads
and ``factor x 10`` writes per second, whether or not earlier ones were
answered; latency runs from the scheduled send time, so a slow server
cannot hide behind a closed loop (no coordinated omission). Reads go over a
pool of keep-alive HTTP/1.1 connections (``--connections``, spread over
the servers, ``bench_claims.HttpConn`` on uvloop); each agent session has
its own connection. A request sent more than 10 ms after its time is
*late*; one that found no free connection (or session) within
``--patience`` seconds is *not sent*. Both are reported.

**The mix.** Reads, per unit of factor (40/s): the ready queue
``GET /ready?limit=20`` 12 (30%), a task ``GET /tasks/{id}`` 10 (25%), the
task list ``GET /tasks?limit=20`` following ``next_cursor`` up to 10 pages
8 (20%), the review work ``GET /reviews?limit=20`` (half with
``pending=true``) 6 (15%), a task's attempts ``GET /tasks/{id}/attempts`` 4
(10%); tasks are the seeded ones and those the sessions worked on. Writes
(10/s): each write tick is the next step of one agent session's work loop
(sessions in the middle of a job first, then idle ones starting a job:
a review waiting for someone other than its author, then an integration,
else new work). One task's whole loop is 9 writes, so each is nominally
1/9 (11.1%) of the writes: *implement* (``POST /claims {"kind": "code"}``,
``renew`` with progress, ``checkpoint``, a 4 KiB JSON artifact uploaded to
the attempt, ``submit`` naming it), *review* (claim the review work item
the submission created, ``POST /tasks/{id}/claim``; record an approval,
``POST /reviews/{id}``), *integrate* (``POST /claims {"kind":
"integration"}``; ``submit`` with ``{"outcome": "merged", ...}``). The
shares measured are printed per window. ``--streams`` event-stream
connections (``GET /events``) stay open for the whole run and count the
events each window delivers and their lag (arrival minus the event's
``time``, whose resolution is 1 ms).

**Once per measured window**: ``--burst`` simultaneous ``POST /claims``
(100, at ``--burst-at`` of the window) on connections of their own, then
each claim released, 4 at a time; a ``--upload-mib`` MiB artifact
streamed with httpx (16 MiB: the default ``max_bytes``); ``buildmax backup
create --output DIR --keep 2`` as an operator runs it. Each is timed. The
ordinary operations scheduled while they run count in the window like any
other; their worst p95 while each ran, and outside all three, is printed.

**Errors.** 409 on a claim (a race lost) is expected; everything else
(5xx, another 4xx, a timeout, a connection error, a failed backup or
upload) is unexpected and reported by kind with a sample. After the run the
database is checked against what the clients were told: attempts, hand-ins
(submissions, reviews, integrations), artifacts, and the active attempts
with their claimants against the attempts the sessions hold.

**Factor search** (default): windows of ``--warmup`` + ``--duration``
seconds at factors 1, 2, 3, 5, 7, 10, 15, 20, 30, 40, 60, 80, 100 (up to
``--max-factor``), stopping at the first window not sustained. Sustained:
p95 under 50 ms for every ordinary operation (the reads and the 9 loop
writes above; not the burst, the big upload, the backup or the event
streams) scheduled outside the burst, the upload and the backup, no
unexpected error, nothing not sent. (A window runs those three once in
seconds, the seed once in 30 minutes; what they do to the ordinary
requests meanwhile is printed beside, and the seed's bar counts every
ordinary request.) A p95 needs samples: each loop write gets about one
request per second at factor 1, so judge a factor with ``--duration 60``
or more; the 10-second default is for a quick look. Printed per configuration:
the highest factor sustained, the seed's bar (factor 1, p95 under 500 ms,
no unexpected error) and the 20x goal as PASS/MISS. ``--factor F`` runs one
window at F instead. ``--soak SECONDS`` runs one long window at
``--factor`` (default 1), sampling each server's RSS and the database size
every 10 s, printed per minute with the first and last 10 minutes compared.

Per window: per-operation count, share, p50/p95/p99/max (every answer,
errors and timeouts included); achieved against scheduled rate; late and
not-sent requests; errors; server CPU (user+sys of the server processes
over the window) and PostgreSQL's; peak RSS of each server (VmHWM and the
largest VmRSS sampled every 0.1 s); the database's growth (SQLite file and
WAL, or ``pg_database_size``); the event streams.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import dataclasses
import json
import math
import os
import platform
import random
import resource
import secrets
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import httpx
from bench_backup import measured
from bench_claims import (
    Agent,
    CpuWindow,
    HttpConn,
    Sampler,
    Setup,
    admin_token_of,
    agents_for,
    fmt_ms,
    latency_summary,
    loaded_plugins,
    port_of,
    postgres_counts,
    run_async,
    seed_postgres,
    seed_sqlite,
    serve_args,
    server_env,
    setup_space,
    sqlite_counts,
    start_server,
    versions,
)
from bench_read import (
    HOST,
    BenchError,
    Server,
    buildmax_command,
    db_url,
    proc_status,
    strip_private,
)

READS_PER_UNIT = 40
WRITES_PER_UNIT = 10
READ_MIX = (
    ("ready", 12),
    ("task show", 10),
    ("task list", 8),
    ("reviews list", 6),
    ("attempts list", 4),
)
IMPLEMENT = ("claim-next", "renew", "checkpoint", "artifact upload", "submit")
REVIEW = ("review claim", "review record")
INTEGRATE = ("integration claim-next", "integration submit")
READ_OPS = tuple(op for op, _ in READ_MIX)
WRITE_OPS = (*IMPLEMENT, *REVIEW, *INTEGRATE)
#: What the p95 bars are judged on.
ORDINARY = (*READ_OPS, *WRITE_OPS)
#: Operations besides the ordinary ones, in the order they are printed.
OTHER_OPS = ("burst claim", "burst release", "release after error")
#: A 409 answering one of these is a race lost: expected.
CLAIMS = frozenset({"claim-next", "review claim", "integration claim-next", "burst claim"})
LADDER = (1, 2, 3, 5, 7, 10, 15, 20, 30, 40, 60, 80, 100)
TARGET_P95_MS = 50.0
SEED_P95_MS = 500.0
GOAL_FACTOR = 20
#: A request sent later than this after its scheduled time is late.
LATE_S = 0.010
#: A pooled connection idle longer than this is reopened before use
#: (Hypercorn closes keep-alive connections idle for 5 s).
IDLE_REUSE_S = 4.0
#: Task list pages followed from the first.
MAX_PAGES = 10
SMALL_ARTIFACT_BYTES = 4096
MIB = 2**20
SOAK_SAMPLE_S = 10.0
SOAK_COMPARE_S = 600.0
MIN_READY = 5_000
#: Ready tasks seeded per claim the planned run could make.
READY_MARGIN = 3
#: Integration claims that found nothing claimable wait this long before the next.
INTEGRATION_RETRY_S = 0.2
KNOWN_TASKS = 2_000
#: The burst's claims are released by this many at a time (a trickle, not a second burst).
BURST_RELEASERS = 4
BACKUP_KEEP = 2


def progress(message: str) -> None:
    print(f"[bench_workload] {message}", file=sys.stderr, flush=True)


def as_json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


async def sleep_until(moment: float) -> None:
    delay = moment - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)


# --------------------------------------------------------------------------- HTTP


@dataclasses.dataclass
class Answer:
    status: int | None
    body: Any = None
    raw: bytes = b""
    error: str | None = None
    ok: bool = False


class KeptConn(HttpConn):
    """:class:`HttpConn` that reconnects rather than reuse a connection idle
    long enough for the server's keep-alive timeout to have closed it."""

    def __init__(self, port: int) -> None:
        super().__init__(port)
        self.last_used = 0.0

    async def request(
        self, method: str, path: str, token: str | None, body: bytes | None = None
    ) -> tuple[int, bytes]:
        if self.writer is not None and time.perf_counter() - self.last_used > IDLE_REUSE_S:
            await self.close()
        try:
            return await super().request(method, path, token, body)
        finally:
            self.last_used = time.perf_counter()


async def exchange(
    conn: HttpConn, method: str, path: str, token: str | None, data: bytes | None, limit_s: float
) -> Answer:
    """One request; the status and parsed JSON, or the transport error's kind."""
    try:
        async with asyncio.timeout(limit_s):
            status, raw = await conn.request(method, path, token, data)
    except TimeoutError:
        return Answer(None, error="timeout")
    except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
        return Answer(None, error=type(exc).__name__)
    try:
        parsed = json.loads(raw) if raw else None
    except ValueError:
        parsed = None
    return Answer(status, parsed, raw)


# --------------------------------------------------------------------------- recording


class Recorder:
    """One window's requests. A request counts when it was scheduled inside
    the window; its latency runs from that scheduled time."""

    def __init__(self, w0: float, w1: float) -> None:
        self.w0, self.w1 = w0, w1
        self.samples: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
        self.answered: collections.Counter[str] = collections.Counter()
        self.expected: collections.Counter[str] = collections.Counter()
        self.unexpected: collections.Counter[str] = collections.Counter()
        self.example: dict[str, str] = {}
        self.empty: collections.Counter[str] = collections.Counter()
        self.unsent: collections.Counter[str] = collections.Counter()
        self.ticks = 0
        self.late = 0
        self.worst_delay = 0.0

    def inside(self, t: float) -> bool:
        return self.w0 <= t < self.w1

    def ticked(self, t: float) -> None:
        if self.inside(t):
            self.ticks += 1

    def sent(self, op: str, t: float) -> None:
        """A scheduled request leaves now (the burst's are not scheduled)."""
        if self.inside(t) and op in ORDINARY:
            delay = time.perf_counter() - t
            self.worst_delay = max(self.worst_delay, delay)
            if delay > LATE_S:
                self.late += 1

    def gave_up(self, what: str, t: float) -> None:
        if self.inside(t):
            self.unsent[what] += 1

    def claimed_nothing(self, op: str, t: float) -> None:
        if self.inside(t):
            self.empty[op] += 1

    def failed(self, what: str, example: str) -> None:
        """An unexpected failure outside the request path (backup, upload)."""
        self.unexpected[what] += 1
        self.example.setdefault(what, example[:300])

    def record(self, op: str, t: float, answer: Answer) -> None:
        if not self.inside(t):
            return
        self.answered[op] += 1
        # Every answer counts in the latencies, errors and timeouts included.
        self.samples[op].append((t, time.perf_counter() - t))
        if answer.ok:
            return
        kind = f"{op}: {answer.error or f'HTTP {answer.status}'}"
        if answer.status == 409 and op in CLAIMS:
            self.expected[kind] += 1
        else:
            self.failed(kind, answer.raw.decode(errors="replace"))

    def latencies(self, op: str) -> list[float]:
        return [lat for _, lat in self.samples.get(op, [])]


class Traffic:
    """Sends requests and records their answers in the current window."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.recorder = Recorder(0.0, 0.0)

    async def send(
        self,
        conn: HttpConn,
        op: str,
        t: float,
        method: str,
        path: str,
        token: str | None,
        data: bytes | None,
        expect: tuple[int, ...],
    ) -> Answer:
        self.recorder.sent(op, t)
        answer = await exchange(conn, method, path, token, data, self.limit_s)
        answer.ok = answer.status in expect
        self.recorder.record(op, t, answer)
        return answer


class Ticks:
    """The tasks a schedule started, and the first exception one raised."""

    def __init__(self) -> None:
        self.running: set[asyncio.Task[None]] = set()
        self.failure: BaseException | None = None

    def start(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self.running.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.running.discard(task)
        if not task.cancelled() and task.exception() is not None and self.failure is None:
            self.failure = task.exception()

    async def drain(self, limit_s: float) -> int:
        """Wait for every task (at most ``limit_s``); how many had to be cancelled."""
        pending: set[asyncio.Task[None]] = set()
        if self.running:
            _, pending = await asyncio.wait(set(self.running), timeout=limit_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self.failure is not None:
            raise self.failure
        return len(pending)


async def run_schedule(
    rate: float,
    start: float,
    end: float,
    fire: Callable[[float, int], Coroutine[Any, Any, None]],
    ticks: Ticks,
) -> None:
    """``fire(t, n)`` at ``start + n / rate`` until ``end``, never waiting for an answer."""
    n = 0
    while (t := start + n / rate) < end:
        await sleep_until(t)
        ticks.start(fire(t, n))
        n += 1


# --------------------------------------------------------------------------- agent sessions


@dataclasses.dataclass
class Ledger:
    """What the clients were told over a configuration's whole run, for the
    check against the database at the end."""

    claims: int = 0
    submissions: int = 0
    reviews: int = 0
    integrations: int = 0
    artifacts: int = 0
    unknown: int = 0
    held: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Work:
    """The attempt a session holds."""

    task_id: str
    attempt_id: str
    generation: int
    token: str
    artifact_id: str | None = None


class Session:
    """One agent: its token, its keep-alive connection, its job (a tuple of
    steps) and the attempt it holds."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.conn = KeptConn(agent.port)
        self.steps: tuple[str, ...] = ()
        self.index = 0
        self.work: Work | None = None
        self.review_task: str | None = None

    @property
    def busy(self) -> bool:
        return self.index < len(self.steps)


class SessionPool:
    """Sessions free for a write tick: those in the middle of a job first,
    then idle ones; a tick that finds none waits up to ``patience_s``."""

    def __init__(self, sessions: list[Session]) -> None:
        self.mid: collections.deque[Session] = collections.deque()
        self.idle: collections.deque[Session] = collections.deque(sessions)
        self.waiters: collections.deque[asyncio.Future[Session]] = collections.deque()

    def put(self, session: Session) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(session)
                return
        (self.mid if session.busy else self.idle).append(session)

    async def get(self, patience_s: float) -> Session | None:
        if self.mid:
            return self.mid.popleft()
        if self.idle:
            return self.idle.popleft()
        waiter: asyncio.Future[Session] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            async with asyncio.timeout(patience_s):
                return await asyncio.shield(waiter)
        except TimeoutError:
            if waiter.done():
                return waiter.result()
            waiter.cancel()
            return None


def report_bytes(work: Work) -> bytes:
    """A small JSON test report for ``work``'s attempt."""
    report = {"task": work.task_id, "attempt": work.attempt_id, "passed": 41, "failed": 0}
    padding = SMALL_ARTIFACT_BYTES - len(as_json(report)) - 12
    return as_json(report | {"log": "." * max(0, padding)})


class Crew:
    """The agent sessions and the work between them: each write tick is the
    next step of one session's job."""

    def __init__(
        self,
        agents: list[Agent],
        space_id: str,
        traffic: Traffic,
        ledger: Ledger,
        patience_s: float,
    ) -> None:
        self.sessions = [Session(a) for a in agents]
        self.pool = SessionPool(self.sessions)
        self.base = f"/v1/spaces/{space_id}"
        self.traffic = traffic
        self.ledger = ledger
        self.patience_s = patience_s
        self.reviews: collections.deque[tuple[str, str]] = collections.deque()
        self.integrations = 0
        self.integration_retry_at = 0.0
        self.worked: collections.deque[str] = collections.deque(maxlen=1000)
        self.uploads = 0
        self.steps: dict[str, Callable[[Session, float], Awaitable[bool]]] = {
            "claim-next": self._claim_code,
            "renew": self._renew,
            "checkpoint": self._checkpoint,
            "artifact upload": self._upload,
            "submit": self._submit,
            "review claim": self._claim_review,
            "review record": self._record_review,
            "integration claim-next": self._claim_integration,
            "integration submit": self._submit_integration,
        }

    async def tick(self, t: float, _n: int) -> None:
        self.traffic.recorder.ticked(t)
        session = await self.pool.get(self.patience_s)
        if session is None:
            self.traffic.recorder.gave_up("write (no free session)", t)
            return
        try:
            await self._step(session, t)
        finally:
            self.pool.put(session)

    async def _step(self, session: Session, t: float) -> None:
        if not session.busy:
            self._assign(session)
        if await self.steps[session.steps[session.index]](session, t):
            session.index += 1
        else:
            session.index = len(session.steps)
            await self._abandon(session)
        if not session.busy:
            session.steps, session.index = (), 0

    def _assign(self, session: Session) -> None:
        session.index = 0
        session.review_task = self._review_for(session.agent.principal_id)
        if session.review_task is not None:
            session.steps = REVIEW
        elif self.integrations > 0 and time.perf_counter() >= self.integration_retry_at:
            self.integrations -= 1
            session.steps = INTEGRATE
        else:
            session.steps = IMPLEMENT

    def _review_for(self, principal_id: str) -> str | None:
        """The oldest waiting review work not handed in by ``principal_id``."""
        for i, (task, author) in enumerate(self.reviews):
            if author != principal_id:
                del self.reviews[i]
                return task
        return None

    async def _post(
        self, s: Session, op: str, t: float, path: str, token: str, body: Any, *expect: int
    ) -> Answer:
        answer = await self.traffic.send(
            s.conn, op, t, "POST", self.base + path, token, as_json(body), expect
        )
        if answer.error is not None:
            self.ledger.unknown += 1
        return answer

    def _took(self, s: Session, op: str, t: float, answer: Answer) -> bool:
        """Keep the attempt a claim answered with; False when there is none."""
        if not answer.ok:
            return False
        if not answer.body.get("attempt"):
            self.traffic.recorder.claimed_nothing(op, t)
            return False
        attempt = answer.body["attempt"]
        s.work = Work(
            attempt["task_id"], attempt["id"], attempt["generation"], answer.body["token"]
        )
        self.ledger.claims += 1
        self.ledger.held[attempt["id"]] = s.agent.principal_id
        self.worked.append(attempt["task_id"])
        return True

    def _handed_in(self, s: Session) -> None:
        assert s.work is not None
        self.ledger.held.pop(s.work.attempt_id, None)
        self.ledger.submissions += 1
        s.work = None

    async def _claim_code(self, s: Session, t: float) -> bool:
        body = {"kind": "code"}
        answer = await self._post(s, "claim-next", t, "/claims", s.agent.token, body, 200, 201)
        return self._took(s, "claim-next", t, answer)

    async def _renew(self, s: Session, t: float) -> bool:
        w = s.work
        assert w is not None
        body = {"generation": w.generation, "progress": {"step": "tests", "done": 3, "of": 5}}
        path = f"/attempts/{w.attempt_id}/renew"
        return (await self._post(s, "renew", t, path, w.token, body, 200)).ok

    async def _checkpoint(self, s: Session, t: float) -> bool:
        w = s.work
        assert w is not None
        body = {
            "generation": w.generation,
            "data": {"files": ["src/app.py", "tests/test_app.py"], "note": "tests pass"},
        }
        path = f"/attempts/{w.attempt_id}/checkpoint"
        return (await self._post(s, "checkpoint", t, path, w.token, body, 201)).ok

    async def _upload(self, s: Session, t: float) -> bool:
        w = s.work
        assert w is not None
        self.uploads += 1
        query = urllib.parse.urlencode(
            {
                "name": f"report-{self.uploads}.json",
                "task": w.task_id,
                "attempt": w.attempt_id,
                "generation": w.generation,
            }
        )
        answer = await self.traffic.send(
            s.conn,
            "artifact upload",
            t,
            "POST",
            f"{self.base}/artifacts?{query}",
            w.token,
            report_bytes(w),
            (201,),
        )
        if answer.error is not None:
            self.ledger.unknown += 1
        if answer.ok:
            w.artifact_id = answer.body["id"]
            self.ledger.artifacts += 1
        return answer.ok

    async def _submit(self, s: Session, t: float) -> bool:
        w = s.work
        assert w is not None
        body = {
            "generation": w.generation,
            "summary": "Implemented, with tests.",
            "candidate": {"branch": f"bench/{w.task_id}", "commit": secrets.token_hex(20)},
            "artifacts": [w.artifact_id] if w.artifact_id else [],
        }
        path = f"/attempts/{w.attempt_id}/submit"
        answer = await self._post(s, "submit", t, path, w.token, body, 201)
        if not answer.ok:
            return False
        self._handed_in(s)
        if answer.body.get("stage") == "review":
            for item in answer.body.get("work_ids", []):
                self.reviews.append((item, s.agent.principal_id))
        return True

    async def _claim_review(self, s: Session, t: float) -> bool:
        task, s.review_task = s.review_task, None
        path = f"/tasks/{task}/claim"
        answer = await self._post(s, "review claim", t, path, s.agent.token, {}, 201)
        return self._took(s, "review claim", t, answer)

    async def _record_review(self, s: Session, t: float) -> bool:
        w = s.work
        assert w is not None
        body = {
            "decision": "approve",
            "summary": "Reads well; the tests cover the change.",
            "generation": w.generation,
        }
        answer = await self._post(
            s, "review record", t, f"/reviews/{w.task_id}", w.token, body, 201
        )
        if not answer.ok:
            return False
        self._handed_in(s)
        self.ledger.reviews += 1
        self.integrations += 1
        return True

    async def _claim_integration(self, s: Session, t: float) -> bool:
        body = {"kind": "integration"}
        op = "integration claim-next"
        answer = await self._post(s, op, t, "/claims", s.agent.token, body, 200, 201)
        if answer.ok and not answer.body.get("attempt"):
            # Its project's target is reserved by another integration: later.
            self.integrations += 1
            self.integration_retry_at = time.perf_counter() + INTEGRATION_RETRY_S
        return self._took(s, op, t, answer)

    async def _submit_integration(self, s: Session, t: float) -> bool:
        w = s.work
        assert w is not None
        body = {
            "generation": w.generation,
            "summary": "Merged.",
            "candidate": {
                "outcome": "merged",
                "before": secrets.token_hex(20),
                "after": secrets.token_hex(20),
            },
        }
        path = f"/attempts/{w.attempt_id}/submit"
        answer = await self._post(s, "integration submit", t, path, w.token, body, 201)
        if not answer.ok:
            return False
        self._handed_in(s)
        self.ledger.integrations += 1
        return True

    async def _abandon(self, s: Session) -> None:
        """Release the attempt of a job whose step failed (best effort)."""
        work, s.work = s.work, None
        if work is None:
            return
        body = {"generation": work.generation, "reason": "a step of the benchmark failed"}
        path = f"/attempts/{work.attempt_id}/release"
        answer = await self._post(
            s, "release after error", time.perf_counter(), path, work.token, body, 200
        )
        if answer.ok:
            self.ledger.held.pop(work.attempt_id, None)

    async def burst(self, at: float, size: int) -> dict[str, Any]:
        """``size`` simultaneous claim-next on connections of their own
        (opened a second before), then each claim released, BURST_RELEASERS at a time."""
        agents = [self.sessions[i % len(self.sessions)].agent for i in range(size)]
        conns = [KeptConn(a.port) for a in agents]
        try:
            await sleep_until(at - 1.0)
            limit_s = self.traffic.limit_s
            # A connection that fails to open here opens with its claim instead.
            await asyncio.gather(
                *(exchange(c, "GET", "/livez", None, None, limit_s) for c in conns)
            )
            await sleep_until(at)
            start = time.perf_counter()
            answers = await asyncio.gather(
                *(self._burst_claim(c, a, start) for c, a in zip(conns, agents, strict=True))
            )
            claimed_s = time.perf_counter() - start
            gate = asyncio.Semaphore(BURST_RELEASERS)
            released = await asyncio.gather(
                *(self._burst_release(c, a, gate) for c, a in zip(conns, answers, strict=True))
            )
            end = time.perf_counter()
        finally:
            await asyncio.gather(*(c.close() for c in conns))
        return burst_summary(answers, released, start, claimed_s, end)

    async def _burst_claim(self, conn: KeptConn, agent: Agent, start: float) -> Answer:
        answer = await self.traffic.send(
            conn,
            "burst claim",
            start,
            "POST",
            f"{self.base}/claims",
            agent.token,
            as_json({"kind": "code"}),
            (200, 201),
        )
        if answer.error is not None:
            self.ledger.unknown += 1
        if answer.ok and answer.body.get("attempt"):
            self.ledger.claims += 1
            self.ledger.held[answer.body["attempt"]["id"]] = agent.principal_id
        return answer

    async def _burst_release(
        self, conn: KeptConn, claim: Answer, gate: asyncio.Semaphore
    ) -> bool | None:
        if not claim.ok or not claim.body.get("attempt"):
            return None
        attempt = claim.body["attempt"]
        async with gate:
            answer = await self.traffic.send(
                conn,
                "burst release",
                time.perf_counter(),
                "POST",
                f"{self.base}/attempts/{attempt['id']}/release",
                claim.body["token"],
                as_json({"generation": attempt["generation"], "reason": "burst over"}),
                (200,),
            )
        if answer.ok:
            self.ledger.held.pop(attempt["id"], None)
        return answer.ok

    async def close(self) -> None:
        await asyncio.gather(*(s.conn.close() for s in self.sessions))


def burst_summary(
    answers: list[Answer], released: list[bool | None], start: float, claimed_s: float, end: float
) -> dict[str, Any]:
    claimed = [a for a in answers if a.ok and a.body.get("attempt")]
    tasks = [a.body["attempt"]["task_id"] for a in claimed]
    return {
        "claims": len(answers),
        "claimed": len(claimed),
        "nothing_ready": sum(1 for a in answers if a.ok and not a.body.get("attempt")),
        "races_lost_409": sum(1 for a in answers if a.status == 409),
        "failed": sum(1 for a in answers if not a.ok and a.status != 409),
        "duplicate_tasks": len(tasks) - len(set(tasks)),
        "claims_wall_ms": round(claimed_s * 1000, 1),
        "released": sum(1 for r in released if r),
        "release_failed": sum(1 for r in released if r is False),
        "wall_ms": round((end - start) * 1000, 1),
        "_start": start,
        "_end": end,
    }


# --------------------------------------------------------------------------- reads


def read_cycle(rng: random.Random) -> list[str]:
    """One period of the read mix, shuffled (the same for every run)."""
    cycle = [op for op, weight in READ_MIX for _ in range(weight)]
    rng.shuffle(cycle)
    return cycle


class Reader:
    """Read ticks: the next operation of the read mix, on a pooled keep-alive
    connection to the servers in turn, with a random agent's token."""

    def __init__(
        self,
        ports: list[int],
        space_id: str,
        tokens: list[str],
        known_tasks: list[str],
        crew: Crew,
        traffic: Traffic,
        opts: argparse.Namespace,
    ) -> None:
        self.rng = random.Random(opts.seed)
        self.cycle = read_cycle(self.rng)
        self.base = f"/v1/spaces/{space_id}"
        self.tokens = tokens
        self.known_tasks = known_tasks
        self.crew = crew
        self.traffic = traffic
        self.patience_s = opts.patience
        self.cursors: collections.deque[tuple[str, int]] = collections.deque(maxlen=64)
        self.conns: list[KeptConn] = []
        self.pools: list[asyncio.LifoQueue[KeptConn]] = []
        for port in ports:
            pool: asyncio.LifoQueue[KeptConn] = asyncio.LifoQueue()
            for _ in range(max(1, opts.connections // len(ports))):
                conn = KeptConn(port)
                self.conns.append(conn)
                pool.put_nowait(conn)
            self.pools.append(pool)
        self.handlers: dict[str, Callable[[KeptConn, float], Awaitable[None]]] = {
            "ready": self._ready,
            "task show": self._show,
            "task list": self._list,
            "reviews list": self._reviews,
            "attempts list": self._attempts,
        }

    async def tick(self, t: float, n: int) -> None:
        self.traffic.recorder.ticked(t)
        op = self.cycle[n % len(self.cycle)]
        pool = self.pools[n % len(self.pools)]
        try:
            async with asyncio.timeout(self.patience_s):
                conn = await pool.get()
        except TimeoutError:
            self.traffic.recorder.gave_up("read (no free connection)", t)
            return
        try:
            await self.handlers[op](conn, t)
        finally:
            pool.put_nowait(conn)

    async def _get(self, conn: KeptConn, op: str, t: float, path: str) -> Answer:
        token = self.rng.choice(self.tokens)
        return await self.traffic.send(conn, op, t, "GET", self.base + path, token, None, (200,))

    def _some_task(self) -> str:
        if self.crew.worked and self.rng.random() < 0.5:
            return self.rng.choice(self.crew.worked)
        return self.rng.choice(self.known_tasks)

    async def _ready(self, conn: KeptConn, t: float) -> None:
        await self._get(conn, "ready", t, "/ready?limit=20")

    async def _show(self, conn: KeptConn, t: float) -> None:
        await self._get(conn, "task show", t, f"/tasks/{self._some_task()}")

    async def _list(self, conn: KeptConn, t: float) -> None:
        cursor, depth = ("", 0)
        if self.cursors and self.rng.random() < 0.8:
            cursor, depth = self.cursors.popleft()
        path = "/tasks?limit=20"
        if cursor:
            path += "&cursor=" + urllib.parse.quote(cursor, safe="")
        answer = await self._get(conn, "task list", t, path)
        following = answer.body.get("next_cursor") if answer.ok else None
        if following and depth + 1 < MAX_PAGES:
            self.cursors.append((following, depth + 1))

    async def _reviews(self, conn: KeptConn, t: float) -> None:
        pending = "&pending=true" if self.rng.random() < 0.5 else ""
        await self._get(conn, "reviews list", t, f"/reviews?limit=20{pending}")

    async def _attempts(self, conn: KeptConn, t: float) -> None:
        task = self.rng.choice(self.crew.worked) if self.crew.worked else self._some_task()
        await self._get(conn, "attempts list", t, f"/tasks/{task}/attempts")

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self.conns))


# --------------------------------------------------------------------------- event streams


async def body_pieces(reader: asyncio.StreamReader, chunked: bool) -> AsyncIterator[bytes]:
    """A streamed response body as it arrives (chunked or until EOF)."""
    while True:
        if not chunked:
            piece = await reader.read(65536)
            if not piece:
                return
            yield piece
            continue
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            return
        yield await reader.readexactly(size)
        await reader.readexactly(2)


class EventStream:
    """A long-lived ``GET /events`` connection: when each event arrived and
    its lag (arrival minus the event's ``time``); reconnects from the last id."""

    def __init__(self, name: str, port: int, path: str, token: str) -> None:
        self.name, self.port, self.path, self.token = name, port, path, token
        self.arrivals: list[tuple[float, float]] = []
        self.last_id = 0
        self.connects = 0
        self.errors: collections.Counter[str] = collections.Counter()

    async def run(self) -> None:
        while True:
            try:
                await self._follow()
            except (OSError, asyncio.IncompleteReadError, ValueError) as exc:
                self.errors[type(exc).__name__] += 1
            await asyncio.sleep(0.2)

    async def _follow(self) -> None:
        from buildmax.clock import from_rfc3339

        reader, writer = await asyncio.open_connection(HOST, self.port)
        self.connects += 1
        try:
            writer.write(
                (
                    f"GET {self.path}?after={self.last_id} HTTP/1.1\r\nHost: {HOST}:{self.port}\r\n"
                    f"Authorization: Bearer {self.token}\r\nAccept: text/event-stream\r\n\r\n"
                ).encode()
            )
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            if status != 200:
                self.errors[f"HTTP {status}"] += 1
                return
            buffer = b""
            async for piece in body_pieces(reader, b"chunked" in head.lower()):
                *frames, buffer = (buffer + piece).split(b"\n\n")
                for frame in frames:
                    self._take(frame, from_rfc3339)
        finally:
            writer.close()

    def _take(self, frame: bytes, from_rfc3339: Callable[[str], int]) -> None:
        fields = dict(
            line.split(": ", 1) for line in frame.decode().splitlines() if ": " in line[:8]
        )
        if "id" in fields:
            self.last_id = int(fields["id"])
        if "data" in fields and fields.get("event") not in ("access-ended", "server-closing"):
            sent = from_rfc3339(json.loads(fields["data"])["time"]) / 1000
            self.arrivals.append((time.perf_counter(), time.time() - sent))

    def window(self, w0: float, w1: float) -> dict[str, Any]:
        lags = [lag for t, lag in self.arrivals if w0 <= t < w1]
        return {
            "events": len(lags),
            "lag_ms": latency_summary([max(0.0, lag) for lag in lags]),
            "connects": self.connects,
            "errors": dict(self.errors),
        }


# --------------------------------------------------------------------------- deployments


@dataclasses.dataclass
class Deployment:
    """One configuration's servers on their seeded database."""

    key: str
    label: str
    engine: str
    data_dir: Path
    database_url: str | None
    servers: list[Server]
    setup: Setup | None = None
    seed: dict[str, Any] = dataclasses.field(default_factory=dict)
    known_tasks: list[str] = dataclasses.field(default_factory=list)

    @property
    def db_path(self) -> Path:
        return self.data_dir / "buildmax.db"

    def backup_argv(self, target: Path) -> list[str]:
        argv = [*buildmax_command(), "backup", "create", "--data-dir", str(self.data_dir)]
        if self.database_url:
            argv += ["--database-url", self.database_url]
        return [*argv, "--output", str(target), "--keep", str(BACKUP_KEEP)]


def configure(server: Server, opts: argparse.Namespace) -> Setup:
    """The admin's token from ``server``'s log, then the space, projects and agents."""
    return setup_space(server, admin_token_of(server), opts)


def prepare_sqlite(dep: Deployment, opts: argparse.Namespace, workdir: Path) -> None:
    first = start_server(f"{dep.key}-setup", workdir, dep.data_dir)
    try:
        dep.setup = configure(first, opts)
    finally:
        first.stop()
    progress(f"seeding SQLite: {opts.historical:,} historical + {opts.ready:,} ready tasks")
    dep.seed = seed_sqlite(dep.db_path, dep.setup, opts.historical, opts.ready)
    conn = sqlite3.connect(f"file:{dep.db_path}?mode=ro", uri=True)
    try:
        dep.known_tasks = [
            row[0]
            for row in conn.execute(
                "SELECT public_id FROM task_tasks WHERE space_id = ? ORDER BY random() LIMIT ?",
                (dep.seed["space_pk"], KNOWN_TASKS),
            )
        ]
    finally:
        conn.close()
    dep.servers.append(start_server(dep.key, workdir, dep.data_dir))


async def pg_known_tasks(url: str, space_pk: int) -> list[str]:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT public_id FROM task_tasks WHERE space_id = $1 ORDER BY random() LIMIT $2",
            space_pk,
            KNOWN_TASKS,
        )
    finally:
        await conn.close()
    return [r[0] for r in rows]


def prepare_postgres(
    dep: Deployment, opts: argparse.Namespace, workdir: Path, processes: int
) -> None:
    assert dep.database_url is not None
    migrate = [*buildmax_command(), "db", "migrate", "--database-url", dep.database_url]
    progress(f"migrating: {' '.join(migrate)}")
    done = subprocess.run(migrate, capture_output=True, text=True, env=server_env(), timeout=300)
    if done.returncode != 0:
        raise BenchError(f"buildmax db migrate failed:\n{done.stdout}\n{done.stderr}")
    first = start_server(f"{dep.key}-setup", workdir, dep.data_dir, dep.database_url)
    try:
        dep.setup = configure(first, opts)
    finally:
        first.stop()
    progress(f"seeding PostgreSQL: {opts.historical:,} historical + {opts.ready:,} ready tasks")
    dep.seed = run_async(seed_postgres(dep.database_url, dep.setup, opts.historical, opts.ready))
    dep.known_tasks = run_async(pg_known_tasks(dep.database_url, dep.seed["space_pk"]))
    for i in range(processes):
        name = f"{dep.key}-{chr(ord('a') + i)}"
        dep.servers.append(start_server(name, workdir, dep.data_dir, dep.database_url))


async def database_size(dep: Deployment) -> dict[str, int]:
    """The SQLite file and its WAL, or ``pg_database_size``, in bytes."""
    if dep.database_url is None:
        wal = dep.db_path.with_name(dep.db_path.name + "-wal")
        return {
            "db": dep.db_path.stat().st_size,
            "wal": wal.stat().st_size if wal.exists() else 0,
        }
    import asyncpg

    conn = await asyncpg.connect(dep.database_url)
    try:
        return {"db": int(await conn.fetchval("SELECT pg_database_size(current_database())"))}
    finally:
        await conn.close()


# --------------------------------------------------------------------------- consistency

EXTRA_COUNTS = (
    ("reviews", "SELECT count(*) FROM review_reviews WHERE space_id = ?"),
    ("integrations", "SELECT count(*) FROM review_integrations WHERE space_id = ?"),
    ("artifacts", "SELECT count(*) FROM artifact_artifacts WHERE space_id = ?"),
)
ACTIVE_ATTEMPTS = (
    "SELECT task_attempts.public_id, principals.public_id FROM task_attempts "
    "JOIN principals ON principals.id = task_attempts.claimant_id "
    "WHERE task_attempts.space_id = ? AND task_attempts.state = 'active'"
)


def sqlite_state(dep: Deployment) -> tuple[dict[str, Any], dict[str, str]]:
    space_pk = dep.seed["space_pk"]
    counts = sqlite_counts(dep.db_path, space_pk)
    conn = sqlite3.connect(f"file:{dep.db_path}?mode=ro", uri=True)
    try:
        for key, query in EXTRA_COUNTS:
            counts[key] = conn.execute(query, (space_pk,)).fetchone()[0]
        active = dict(conn.execute(ACTIVE_ATTEMPTS, (space_pk,)).fetchall())
    finally:
        conn.close()
    return counts, active


async def postgres_state(dep: Deployment) -> tuple[dict[str, Any], dict[str, str]]:
    import asyncpg

    assert dep.database_url is not None
    space_pk = dep.seed["space_pk"]
    counts = await postgres_counts(dep.database_url, space_pk)
    conn = await asyncpg.connect(dep.database_url)
    try:
        for key, query in EXTRA_COUNTS:
            counts[key] = await conn.fetchval(query.replace("?", "$1"), space_pk)
        rows = await conn.fetch(ACTIVE_ATTEMPTS.replace("?", "$1"), space_pk)
    finally:
        await conn.close()
    return counts, {r[0]: r[1] for r in rows}


def consistency(counts: dict[str, Any], active: dict[str, str], ledger: Ledger) -> dict[str, Any]:
    """What the database holds against what the clients were told. A
    difference a write with an unknown outcome (a timeout, a lost
    connection) could have made is *explained*: a row more than the answers
    said, an attempt no client knows of, a held attempt since ended. Fewer
    rows than answered, an attempt held by someone else than the clients
    know, a claimed task without its active attempt are not."""
    explained: list[str] = []
    unexplained: list[str] = []
    told = {
        "attempts": ledger.claims,
        "submissions": ledger.submissions,
        "reviews": ledger.reviews,
        "integrations": ledger.integrations,
        "artifacts": ledger.artifacts,
    }
    for key, mine in told.items():
        if counts[key] != mine:
            text = f"{counts[key]} {key} in the database, {mine} answered"
            (explained if counts[key] > mine else unexplained).append(text)
    if counts["claimed"] != len(active):
        unexplained.append(f"{counts['claimed']} tasks claimed, {len(active)} active attempts")
    wrong = sorted(a for a, who in active.items() if a in ledger.held and ledger.held[a] != who)
    if wrong:
        unexplained.append(
            f"{len(wrong)} active attempts held by another claimant (e.g. {wrong[0]})"
        )
    unknown = sorted(set(active) - set(ledger.held))
    if unknown:
        explained.append(f"{len(unknown)} active attempts no client knows of (e.g. {unknown[0]})")
    gone = sorted(set(ledger.held) - set(active))
    if gone:
        explained.append(f"{len(gone)} attempts the sessions hold are not active (e.g. {gone[0]})")
    if not explained and not unexplained:
        verdict = "consistent"
    elif not unexplained and ledger.unknown:
        verdict = f"consistent but for {ledger.unknown} writes whose outcome is unknown"
    else:
        verdict = "INCONSISTENT"
    return {"verdict": verdict, "problems": unexplained + explained}


# --------------------------------------------------------------------------- windows


class Workload:
    """One configuration under load: its agent sessions, readers and event
    streams, run for one window after another."""

    def __init__(self, dep: Deployment, opts: argparse.Namespace, workdir: Path) -> None:
        assert dep.setup is not None
        self.dep = dep
        self.opts = opts
        self.backups = workdir / f"backups-{dep.key}"
        self.traffic = Traffic(opts.request_timeout)
        self.ledger = Ledger()
        agents = agents_for(dep.setup, dep.servers)
        self.crew = Crew(agents, dep.setup.space_id, self.traffic, self.ledger, opts.patience)
        ports = [port_of(s) for s in dep.servers]
        tokens = [a.token for a in agents]
        self.reader = Reader(
            ports, dep.setup.space_id, tokens, dep.known_tasks, self.crew, self.traffic, opts
        )
        path = f"/v1/spaces/{dep.setup.space_id}/events"
        self.streams = [
            EventStream(
                f"stream {i + 1} ({dep.servers[i % len(ports)].name})",
                ports[i % len(ports)],
                path,
                tokens[-1 - i],
            )
            for i in range(opts.streams)
        ]
        self.stream_tasks: list[asyncio.Task[None]] = []
        self.http: httpx.AsyncClient | None = None
        self.uploads = 0

    async def open(self) -> None:
        # Built and used once before any window: an httpx client's first
        # request takes a moment (SSL context, anyio's backend).
        self.http = httpx.AsyncClient(timeout=300)
        await self.http.get(f"{self.dep.servers[0].url}/livez")
        self.stream_tasks = [asyncio.create_task(s.run()) for s in self.streams]

    async def close(self) -> None:
        for task in self.stream_tasks:
            task.cancel()
        await asyncio.gather(*self.stream_tasks, return_exceptions=True)
        await self.crew.close()
        await self.reader.close()
        if self.http is not None:
            await self.http.aclose()

    async def window(self, factor: float, warmup: float, duration: float) -> dict[str, Any]:
        opts = self.opts
        t0 = time.perf_counter() + 0.2
        w0, w1 = t0 + warmup, t0 + warmup + duration
        recorder = self.traffic.recorder = Recorder(w0, w1)
        progress(
            f"{self.dep.label}: factor {factor:g} ({factor * 50:g} requests/s), "
            f"warm-up {warmup:g}s, measured {duration:g}s"
        )
        ticks = Ticks()
        specials = {
            "burst": asyncio.create_task(
                self.crew.burst(w0 + opts.burst_at * duration, opts.burst)
            ),
            "big_upload": asyncio.create_task(self._big_upload(w0 + opts.upload_at * duration)),
            "backup": asyncio.create_task(self._backup(w0 + opts.backup_at * duration)),
        }
        marks = asyncio.create_task(self._marks(w0, w1))
        series = asyncio.create_task(self._series(w0, w1)) if opts.soak else None
        with Sampler([s.pid for s in self.dep.servers]) as sampler:
            await asyncio.gather(
                run_schedule(READS_PER_UNIT * factor, t0, w1, self.reader.tick, ticks),
                run_schedule(WRITES_PER_UNIT * factor, t0, w1, self.crew.tick, ticks),
            )
            unfinished = await ticks.drain(opts.request_timeout + opts.patience + 5)
            done = {name: await self._special(name, task) for name, task in specials.items()}
            marked = await marks
        report = window_report(factor, duration, recorder, done, marked, unfinished)
        report["rss"] = {
            s.name: {
                "hwm_kib": proc_status(s.pid).get("VmHWM", 0),
                "sampled_kib": sampler.peak.get(s.pid, 0),
            }
            for s in self.dep.servers
        }
        report["events"] = {s.name: s.window(w0, w1) for s in self.streams}
        if series is not None:
            report["soak"] = soak_summary(await series, recorder, w0)
        for server in self.dep.servers:
            if not server.alive():
                raise BenchError(f"{server.name} died during the run:\n{server.log_tail()}")
        return report

    async def _special(self, name: str, task: asyncio.Task[dict[str, Any]]) -> dict[str, Any]:
        try:
            return await task
        except (OSError, httpx.HTTPError, subprocess.SubprocessError) as exc:
            self.traffic.recorder.failed(f"{name}: {type(exc).__name__}", str(exc))
            return {"error": f"{type(exc).__name__}: {exc}"}

    async def _marks(self, w0: float, w1: float) -> dict[str, Any]:
        """CPU and database size at the window's start and end."""
        await sleep_until(w0)
        cpu = CpuWindow([s.pid for s in self.dep.servers], self.dep.engine == "postgresql")
        cpu.start()
        own0 = resource.getrusage(resource.RUSAGE_SELF)
        size0 = await database_size(self.dep)
        await sleep_until(w1)
        cpu.end()
        own1 = resource.getrusage(resource.RUSAGE_SELF)
        size1 = await database_size(self.dep)
        own = (own1.ru_utime + own1.ru_stime) - (own0.ru_utime + own0.ru_stime)
        return {
            "server_cpu_s": {
                s.name: cpu.result.get(s.pid) for s in self.dep.servers if s.pid in cpu.result
            },
            "postgres_cpu_s": cpu.pg_result,
            "client_cpu_s": round(own, 2),
            "machine_busy_s": cpu.machine_busy_s,
            "database_before": size0,
            "database_after": size1,
        }

    async def _series(self, w0: float, w1: float) -> list[dict[str, Any]]:
        """Each server's VmRSS and the database size every SOAK_SAMPLE_S."""
        samples = []
        t = w0
        while t <= w1 + 0.01:
            await sleep_until(t)
            samples.append(
                {
                    "t": round(t - w0, 1),
                    "rss_kib": {
                        s.name: proc_status(s.pid).get("VmRSS", 0) for s in self.dep.servers
                    },
                    "db_bytes": sum((await database_size(self.dep)).values()),
                }
            )
            t += SOAK_SAMPLE_S
        return samples

    async def _big_upload(self, at: float) -> dict[str, Any]:
        """One ``--upload-mib`` MiB artifact streamed with a Content-Length (httpx)."""
        await sleep_until(at)
        assert self.dep.setup is not None
        self.uploads += 1
        size = self.opts.upload_mib * MIB
        block = os.urandom(MIB)

        async def body() -> AsyncIterator[bytes]:
            for i in range(self.opts.upload_mib):
                yield block[:-8] + self.uploads.to_bytes(4, "big") + i.to_bytes(4, "big")

        server = self.dep.servers[0]
        assert self.http is not None
        start = time.perf_counter()
        answer = await self.http.post(
            f"{server.url}/v1/spaces/{self.dep.setup.space_id}/artifacts",
            params={"name": f"build-{self.uploads}.tar"},
            headers={
                "Authorization": f"Bearer {self.dep.setup.agents[0][2]}",
                "Content-Type": "application/octet-stream",
                "Content-Length": str(size),
            },
            content=body(),
        )
        end = time.perf_counter()
        if answer.status_code == 201:
            self.ledger.artifacts += 1
        else:
            self.traffic.recorder.failed(f"big upload: HTTP {answer.status_code}", answer.text)
        return {
            "mib": self.opts.upload_mib,
            "status": answer.status_code,
            "seconds": round(end - start, 2),
            "mib_per_s": round(self.opts.upload_mib / (end - start), 1),
            "_start": start,
            "_end": end,
        }

    async def _backup(self, at: float) -> dict[str, Any]:
        """``buildmax backup create`` as its own process (exit, time, peak RSS)."""
        await sleep_until(at)
        argv = self.dep.backup_argv(self.backups)
        start = time.perf_counter()
        result = await asyncio.to_thread(measured, argv)
        end = time.perf_counter()
        if result["exit"] != 0:
            self.traffic.recorder.failed(f"backup: exit {result['exit']}", str(result["output"]))
        return result | {"command": " ".join(argv), "_start": start, "_end": end}

    def reconnects(self) -> int:
        """Keep-alive connections opened again (idle too long, closed by the server, errors)."""
        conns = [*self.reader.conns, *(s.conn for s in self.crew.sessions)]
        return sum(max(0, c.connects - 1) for c in conns)

    async def check(self) -> dict[str, Any]:
        if self.dep.database_url is None:
            counts, active = sqlite_state(self.dep)
        else:
            counts, active = await postgres_state(self.dep)
        return consistency(counts, active, self.ledger)


def window_report(
    factor: float,
    duration: float,
    rec: Recorder,
    specials: dict[str, dict[str, Any]],
    marks: dict[str, Any],
    unfinished: int,
) -> dict[str, Any]:
    ops = {
        op: latency_summary(rec.latencies(op))
        for op in (*ORDINARY, *OTHER_OPS)
        if rec.answered.get(op)
    }
    ordinary = sum(rec.answered[op] for op in ORDINARY)
    measured_ops = {op: s for op, s in ops.items() if op in ORDINARY and s["p95"] is not None}
    worst = max(measured_ops.items(), key=lambda kv: kv[1]["p95"], default=(None, {"p95": None}))
    report = {
        "factor": factor,
        "scheduled_per_s": round(rec.ticks / duration, 1),
        "achieved_per_s": round(ordinary / duration, 1),
        "operations_ms": ops,
        "mix": {op: round(rec.answered[op] / ordinary, 3) for op in ORDINARY if ordinary},
        "late": rec.late,
        "worst_send_delay_ms": round(rec.worst_delay * 1000, 1),
        "not_sent": dict(rec.unsent),
        "unfinished": unfinished,
        "empty_claims": dict(rec.empty),
        "errors_expected": dict(rec.expected),
        "errors_unexpected": dict(rec.unexpected),
        "unexpected_examples": rec.example,
        "worst_p95": {"operation": worst[0], "ms": worst[1]["p95"]},
        "burst": specials["burst"],
        "big_upload": specials["big_upload"],
        "backup": specials["backup"],
        "during": during(rec, specials),
        **marks,
    }
    report["machine_busy_cores"] = round(marks["machine_busy_s"] / duration, 2)
    clean = not rec.unexpected and not rec.unsent and not unfinished
    p95 = worst[1]["p95"]
    # The rate is judged on what the load does between the specials: a
    # window runs the burst, the upload and the backup once in seconds,
    # the seed once in 30 minutes. Their effect is reported beside it, and
    # the seed's bar counts every ordinary request.
    steady = report["during"]["outside"]["worst_p95_ms"]
    report["sustained"] = clean and steady is not None and steady < TARGET_P95_MS
    report["seed_bar_met"] = clean and p95 is not None and p95 < SEED_P95_MS
    return report


def worst_p95(rec: Recorder, keep: Callable[[float], bool]) -> dict[str, Any]:
    """The ordinary operation with the highest p95 among the requests
    scheduled at a time ``keep`` accepts."""
    count, worst_op, worst_ms = 0, None, None
    for op in ORDINARY:
        values = [lat for t, lat in rec.samples.get(op, []) if keep(t)]
        count += len(values)
        p95 = latency_summary(values)["p95"]
        if p95 is not None and (worst_ms is None or p95 > worst_ms):
            worst_op, worst_ms = op, p95
    return {"requests": count, "worst_p95_operation": worst_op, "worst_p95_ms": worst_ms}


def during(rec: Recorder, specials: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The ordinary operations' worst p95 while each special ran, and outside them all."""
    spans = {name: (r["_start"], r["_end"]) for name, r in specials.items() if "_start" in r}
    out = {name: worst_p95(rec, within(*span)) for name, span in spans.items()}
    out["outside"] = worst_p95(rec, lambda t: not any(within(*span)(t) for span in spans.values()))
    return out


def within(start: float, end: float) -> Callable[[float], bool]:
    return lambda t: start <= t <= end


def soak_summary(series: list[dict[str, Any]], rec: Recorder, w0: float) -> dict[str, Any]:
    """The RSS and database series per minute, and the first and last 10 minutes compared."""
    minutes: dict[int, dict[str, Any]] = {}
    for sample in series:
        minute = minutes.setdefault(
            int(sample["t"] // 60), {"rss_max_kib": {}, "db_bytes": 0, "ordinary": []}
        )
        for name, kib in sample["rss_kib"].items():
            minute["rss_max_kib"][name] = max(kib, minute["rss_max_kib"].get(name, 0))
        minute["db_bytes"] = sample["db_bytes"]
    for op in ORDINARY:
        for t, lat in rec.samples.get(op, []):
            if int((t - w0) // 60) in minutes:
                minutes[int((t - w0) // 60)]["ordinary"].append(lat)
    per_minute = [
        {
            "minute": m,
            "rss_max_kib": v["rss_max_kib"],
            "db_bytes": v["db_bytes"],
            "ordinary_p95_ms": latency_summary(v["ordinary"])["p95"],
        }
        for m, v in sorted(minutes.items())
    ]
    total = series[-1]["t"] if series else 0.0
    span = min(SOAK_COMPARE_S, total / 2)
    return {
        "samples": series,
        "per_minute": per_minute,
        "compare_s": span,
        "first": span_summary([s for s in series if s["t"] < span]),
        "last": span_summary([s for s in series if s["t"] >= total - span]),
    }


def span_summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    names = samples[0]["rss_kib"] if samples else {}
    return {
        "rss_mean_kib": {
            n: round(sum(s["rss_kib"][n] for s in samples) / len(samples)) for n in names
        },
        "rss_max_kib": {n: max(s["rss_kib"][n] for s in samples) for n in names},
        "db_bytes_end": samples[-1]["db_bytes"] if samples else 0,
    }


# --------------------------------------------------------------------------- runs


def planned_factors(opts: argparse.Namespace) -> list[float]:
    if opts.soak or opts.factor is not None or not opts.search:
        return [opts.factor if opts.factor is not None else 1.0]
    return [float(f) for f in LADDER if f <= opts.max_factor]


def ready_needed(opts: argparse.Namespace) -> int:
    """Enough ready tasks that the planned run cannot drain the queue:
    READY_MARGIN times the code claims of its work loops (a ninth of the
    writes), at least MIN_READY."""
    seconds: float = opts.warmup + (opts.soak or opts.duration)
    writes = sum(planned_factors(opts)) * WRITES_PER_UNIT * seconds
    return max(MIN_READY, math.ceil(READY_MARGIN * writes / len(WRITE_OPS)))


async def drive(dep: Deployment, opts: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The windows of one configuration, then the database check."""
    load = Workload(dep, opts, workdir)
    await load.open()
    windows = []
    try:
        duration = opts.soak or opts.duration
        for factor in planned_factors(opts):
            report = await load.window(factor, opts.warmup, duration)
            windows.append(report)
            progress(window_line(report))
            if not report["sustained"]:
                break
    finally:
        await load.close()
    return {
        "windows": windows,
        "consistency": await load.check(),
        "ledger": dataclasses.asdict(load.ledger) | {"held": len(load.ledger.held)},
        "reconnects": load.reconnects(),
    }


def run_configuration(
    opts: argparse.Namespace, workdir: Path, engine: str, processes: int
) -> dict[str, Any]:
    key = "sqlite" if engine == "sqlite" else f"pg{processes}"
    noun = "process" if processes == 1 else "processes"
    label = f"{'SQLite' if engine == 'sqlite' else 'PostgreSQL'}, {processes} {noun}"
    dep = Deployment(key, label, engine, workdir / f"{key}-data", None, [])
    admin = db_url(opts.pg_url, "postgres")
    name = f"bench_workload_{os.getpid()}_{secrets.token_hex(4)}_{key}"
    created = False
    try:
        if engine == "sqlite":
            prepare_sqlite(dep, opts, workdir)
        else:
            from buildmax.database.servers import create_database

            dep.database_url = run_async(create_database(admin, name))
            created = True
            prepare_postgres(dep, opts, workdir, processes)
        result = run_async(drive(dep, opts, workdir))
        return {
            "key": key,
            "label": label,
            "commands": [
                " ".join(serve_args(dep.data_dir, port_of(s), dep.database_url)) + f"   # {s.name}"
                for s in dep.servers
            ],
            "seed": strip_private(dep.seed),
            **result,
        }
    finally:
        for server in dep.servers:
            server.stop()
        if created:
            drop(admin, name)


def drop(admin: str, name: str) -> None:
    from buildmax.database.servers import drop_database

    try:
        run_async(drop_database(admin, name))
        progress(f"dropped database {name}")
    except Exception as exc:
        progress(f"could not drop database {name}: {exc}")


def configurations(opts: argparse.Namespace) -> list[tuple[str, int]]:
    found = [("sqlite", 1)] if "sqlite" in opts.engine_set else []
    if "postgresql" in opts.engine_set:
        found += [("postgresql", n) for n in opts.pg_process_counts]
    return found


def verdicts(run: dict[str, Any]) -> dict[str, Any]:
    windows = run["windows"]
    sustained = [w["factor"] for w in windows if w["sustained"]]
    first = next((w for w in windows if w["factor"] == 1), None)
    highest = max(sustained, default=None)
    goal: bool | None = highest is not None and highest >= GOAL_FACTOR
    if not goal and len(sustained) == len(windows):
        goal = None  # every window ran was sustained, none at the goal's factor
    return {
        "highest_sustained_factor": highest,
        "seed_bar": None if first is None else first["seed_bar_met"],
        "goal": goal,
        "database": run["consistency"]["verdict"],
    }


# --------------------------------------------------------------------------- printing


def mib(n: float) -> str:
    return f"{n / MIB:.1f} MiB"


def window_line(w: dict[str, Any]) -> str:
    worst = w["worst_p95"]
    return (
        f"factor {w['factor']:g}: {w['achieved_per_s']}/s of {w['scheduled_per_s']}/s, worst "
        f"ordinary p95 {fmt_ms(worst['ms'])} ms ({worst['operation']}), unexpected "
        f"{sum(w['errors_unexpected'].values())}, not sent {sum(w['not_sent'].values())}: "
        f"{'sustained' if w['sustained'] else 'NOT sustained'}"
    )


def print_operations(w: dict[str, Any]) -> None:
    print(
        f"    {'operation':<24} {'count':>6} {'share':>6} {'p50 ms':>8} {'p95 ms':>8} "
        f"{'p99 ms':>8} {'max ms':>8}"
    )
    for op, s in w["operations_ms"].items():
        share = f"{w['mix'][op] * 100:.1f}%" if op in w["mix"] else ""
        print(
            f"    {op:<24} {s['count']:>6} {share:>6} {fmt_ms(s['p50']):>8} {fmt_ms(s['p95']):>8} "
            f"{fmt_ms(s['p99']):>8} {fmt_ms(s['max']):>8}"
        )


def print_errors(w: dict[str, Any]) -> None:
    expected = ", ".join(f"{k} x{v}" for k, v in w["errors_expected"].items()) or "none"
    unexpected = ", ".join(f"{k} x{v}" for k, v in w["errors_unexpected"].items()) or "none"
    print(f"    errors: expected (claim races): {expected}; unexpected: {unexpected}")
    for kind, example in w["unexpected_examples"].items():
        print(f"      {kind}: {example!r}")
    if w["empty_claims"]:
        empty = ", ".join(f"{k} x{v}" for k, v in w["empty_claims"].items())
        print(f"    claims answered 'nothing claimable': {empty}")
        if "claim-next" in w["empty_claims"]:
            print("    WARNING: the ready queue ran dry: raise --ready")
    if w["not_sent"] or w["unfinished"]:
        print(f"    not sent: {w['not_sent']}; cancelled unanswered: {w['unfinished']}")


def during_text(w: dict[str, Any], name: str) -> str:
    d = w["during"].get(name)
    if not d or d["worst_p95_ms"] is None:
        return ""
    return (
        f"; ordinary while it ran: {d['requests']} requests, worst p95 "
        f"{fmt_ms(d['worst_p95_ms'])} ms ({d['worst_p95_operation']})"
    )


def print_specials(w: dict[str, Any]) -> None:
    b = w["burst"]
    if "error" in b:
        print(f"    burst: {b['error']}")
    else:
        print(
            f"    burst: {b['claims']} simultaneous claim-next in {b['claims_wall_ms']} ms: "
            f"{b['claimed']} claimed, {b['nothing_ready']} nothing ready, "
            f"{b['races_lost_409']} races lost (409), {b['failed']} failed; duplicate tasks "
            f"{b['duplicate_tasks']}; {b['released']} released ({b['release_failed']} failed), "
            f"{b['wall_ms']} ms in all{during_text(w, 'burst')}"
        )
    u = w["big_upload"]
    if "error" in u:
        print(f"    big upload: {u['error']}")
    else:
        print(
            f"    big upload: {u['mib']} MiB streamed in {u['seconds']} s "
            f"({u['mib_per_s']} MiB/s), HTTP {u['status']}{during_text(w, 'big_upload')}"
        )
    k = w["backup"]
    if "error" in k:
        print(f"    backup: {k['error']}")
    else:
        print(
            f"    backup create: exit {k['exit']}, {k['seconds']} s, peak RSS "
            f"{k['peak_rss_mib']} MiB{during_text(w, 'backup')}"
        )
        print(f"      {k['output'][0]}")
    quiet = w["during"].get("outside")
    if quiet and quiet["worst_p95_ms"] is not None:
        print(
            f"    ordinary outside the burst, the upload and the backup: {quiet['requests']} "
            f"requests, worst p95 {fmt_ms(quiet['worst_p95_ms'])} ms "
            f"({quiet['worst_p95_operation']})"
        )


def print_resources(w: dict[str, Any]) -> None:
    servers = ", ".join(f"{n} {v} s" for n, v in w["server_cpu_s"].items())
    pg = "" if w["postgres_cpu_s"] is None else f"; PostgreSQL processes {w['postgres_cpu_s']} s"
    print(
        f"    CPU in the window: servers {servers}{pg}; load generator {w['client_cpu_s']} s; "
        f"machine busy {w['machine_busy_cores']} of {os.cpu_count()} cores"
    )
    for name, r in w["rss"].items():
        print(
            f"    RSS {name}: {mib(r['hwm_kib'] * 1024)} VmHWM, "
            f"{mib(r['sampled_kib'] * 1024)} sampled max in the window"
        )
    before, after = w["database_before"], w["database_after"]
    grew = sum(after.values()) - sum(before.values())
    parts = " + ".join(f"{k} {mib(v)}" for k, v in after.items())
    print(f"    database: {parts} at the end ({'+' if grew >= 0 else ''}{mib(grew)} in the window)")
    for name, e in w["events"].items():
        lag = e["lag_ms"]
        print(
            f"    events {name}: {e['events']} received, lag p50 {fmt_ms(lag['p50'])} ms, "
            f"p95 {fmt_ms(lag['p95'])} ms, max {fmt_ms(lag['max'])} ms; connects "
            f"{e['connects']}, errors {e['errors'] or 'none'}"
        )


def print_soak(soak: dict[str, Any]) -> None:
    print("    soak, per minute (largest VmRSS per server, database size, p95 of all ordinary):")
    for m in soak["per_minute"]:
        rss = ", ".join(f"{n} {mib(v * 1024)}" for n, v in m["rss_max_kib"].items())
        print(
            f"      min {m['minute']:>3}: {rss}; database {mib(m['db_bytes'])}; "
            f"p95 {fmt_ms(m['ordinary_p95_ms'])} ms"
        )
    first, last = soak["first"], soak["last"]
    print(f"    first vs last {soak['compare_s'] / 60:.1f} minutes:")
    for name in first["rss_mean_kib"]:
        a, b = first["rss_mean_kib"][name], last["rss_mean_kib"][name]
        print(
            f"      {name}: mean VmRSS {mib(a * 1024)} -> {mib(b * 1024)} "
            f"({(b - a) / 1024:+.1f} MiB); max {mib(first['rss_max_kib'][name] * 1024)} -> "
            f"{mib(last['rss_max_kib'][name] * 1024)}"
        )
    print(f"      database {mib(first['db_bytes_end'])} -> {mib(last['db_bytes_end'])}")


def print_window(w: dict[str, Any]) -> None:
    print(
        f"  factor {w['factor']:g}: scheduled {w['scheduled_per_s']} requests/s, achieved "
        f"{w['achieved_per_s']}/s; late sends (> {LATE_S * 1000:g} ms) {w['late']}, worst send "
        f"delay {w['worst_send_delay_ms']} ms; "
        f"{'sustained' if w['sustained'] else 'NOT sustained'}"
    )
    print_operations(w)
    print_errors(w)
    print_specials(w)
    print_resources(w)
    if "soak" in w:
        print_soak(w["soak"])


def print_run(run: dict[str, Any]) -> None:
    print()
    print(run["label"])
    for line in run["commands"]:
        print(f"  server: {line}")
    seed = run["seed"]
    print(
        f"  seeded: {seed['tasks_by_state']} in {seed['seconds']} s; database "
        f"{mib(seed['db_bytes'])}"
    )
    for w in run["windows"]:
        print_window(w)
    check = run["consistency"]["verdict"]
    if run["consistency"]["problems"]:
        check += " (" + "; ".join(run["consistency"]["problems"]) + ")"
    ledger = run["ledger"]
    print(
        f"  database after the run: {check} (the clients saw {ledger['claims']} claims, "
        f"{ledger['submissions']} hand-ins, {ledger['reviews']} reviews, "
        f"{ledger['integrations']} integrations, {ledger['artifacts']} artifacts; "
        f"{ledger['held']} attempts still held)"
    )
    print(
        f"  connections reopened: {run['reconnects']} (pooled and session connections, "
        f"idle over {IDLE_REUSE_S:g} s, closed by the server or broken)"
    )


def verdict_word(met: bool | None) -> str:
    return "n/a" if met is None else ("PASS" if met else "MISS")


def print_summary(report: dict[str, Any]) -> None:
    print()
    print("Summary")
    print(
        f"  {'configuration':<24} {'highest sustained':<18} {'seed bar':<8} {'20x goal':<8} "
        f"{'factor-1 worst p95':<40} database"
    )
    for run in report["runs"]:
        v = run["verdicts"]
        high = v["highest_sustained_factor"]
        high_text = "none" if high is None else f"{high:g} ({high * 50:g}/s)"
        first = next((w for w in run["windows"] if w["factor"] == 1), None)
        worst = "-"
        if first is not None:
            worst = f"{fmt_ms(first['worst_p95']['ms'])} ms ({first['worst_p95']['operation']})"
        print(
            f"  {run['label']:<24} {high_text:<18} {verdict_word(v['seed_bar']):<8} "
            f"{verdict_word(v['goal']):<8} {worst:<40} {v['database']}"
        )
    print(
        f"  seed bar: factor 1 (50 requests/s), p95 < {SEED_P95_MS:g} ms for every ordinary "
        f"operation, no unexpected error. Sustained: p95 < {TARGET_P95_MS:g} ms for every "
        "ordinary operation scheduled outside the burst, the upload and the backup, no "
        f"unexpected error. 20x goal: factor {GOAL_FACTOR} ({GOAL_FACTOR * 50} requests/s) "
        "sustained."
    )


def print_report(report: dict[str, Any]) -> None:
    print("Configuration")
    print(
        f"  seeded  : {report['projects']} projects, {report['historical']:,} historical (done) "
        f"+ {report['ready']:,} ready tasks, {report['agents']} agents, per configuration"
    )
    print(
        f"  load    : open loop, factor x {READS_PER_UNIT} reads + {WRITES_PER_UNIT} writes per "
        f"second; warm-up {report['warmup_s']:g}s, measured {report['duration_s']:g}s per "
        f"window; {report['connections']} pooled read connections, one per agent session; "
        f"{report['streams']} event streams; factors {report['factors']}"
    )
    reads = ", ".join(f"{op} {w / READS_PER_UNIT:.0%}" for op, w in READ_MIX)
    print(f"  reads   : {reads}")
    print(
        "  writes  : the agents' work loops, 9 writes per task, 1/9 each: " + ", ".join(WRITE_OPS)
    )
    print(
        f"  special : per window, {report['burst']} simultaneous claims, a "
        f"{report['upload_mib']} MiB upload and buildmax backup create"
    )
    print("  plugins : " + "; ".join(report["plugins"]))
    print("  versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()))
    m = report["machine"]
    print(
        f"  machine : {m['cpus']} CPUs, Linux {m['kernel']}, load average at start "
        f"{' '.join(str(x) for x in m['loadavg_at_start'])}"
    )
    for run in report["runs"]:
        print_run(run)
    print_summary(report)
    print(
        "Latency runs from each request's scheduled send time (open loop). Ordinary operations: "
        "the reads and the agents' loop writes; not the burst, the big upload, the backup or the "
        f"event streams. Late: sent more than {LATE_S * 1000:g} ms after its time."
    )
    print(f"Whole run: {report['total_s']} s.")


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="The acceptance workload (factor x 50 requests/s, open loop) against "
        "buildmax serve on SQLite and PostgreSQL, with a factor search or a soak."
    )
    p.add_argument("--historical", type=int, default=100_000, help="done tasks seeded (100,000)")
    p.add_argument(
        "--ready",
        type=int,
        help="ready tasks seeded (default: enough that the planned run cannot drain the "
        f"queue, at least {MIN_READY:,})",
    )
    p.add_argument("--projects", type=int, default=20, help="projects (20)")
    p.add_argument("--agents", type=int, default=50, help="agent sessions (50)")
    p.add_argument("--duration", type=float, default=10, help="measured seconds per window (10)")
    p.add_argument("--warmup", type=float, default=3, help="warm-up seconds per window (3)")
    p.add_argument(
        "--engines", default="sqlite,postgresql", help="sqlite, postgresql or both (default)"
    )
    p.add_argument(
        "--pg-processes",
        default="1,2",
        help="server process counts on PostgreSQL, each on a fresh database (1,2)",
    )
    p.add_argument(
        "--pg-url",
        default=os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432"),
        help="PostgreSQL server (fresh databases are created and dropped on it); "
        "default $BENCH_PG_URL or postgresql://postgres@127.0.0.1:5432",
    )
    p.add_argument(
        "--search",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="factor search: windows at 1, 2, 3, 5, 7, 10, 15, 20, 30, ... until one is not "
        "sustained (default on; --no-search runs factor 1 only)",
    )
    p.add_argument("--factor", type=float, help="run one window at this factor instead")
    p.add_argument("--max-factor", type=float, default=100, help="the search's last factor (100)")
    p.add_argument(
        "--soak",
        type=float,
        metavar="SECONDS",
        help="one window this long at --factor (default 1), RSS and database size every 10 s",
    )
    p.add_argument(
        "--connections",
        type=int,
        default=200,
        help="pooled keep-alive read connections, spread over the servers (200)",
    )
    p.add_argument("--streams", type=int, default=3, help="event-stream connections (3)")
    p.add_argument("--burst", type=int, default=100, help="simultaneous claims per window (100)")
    p.add_argument(
        "--burst-at", type=float, default=0.5, help="when the burst starts, share of the window"
    )
    p.add_argument(
        "--upload-mib",
        type=int,
        default=16,
        help="the large upload per window, MiB (16: the default artifacts max_bytes)",
    )
    p.add_argument(
        "--upload-at", type=float, default=0.2, help="when it starts, share of the window"
    )
    p.add_argument(
        "--backup-at", type=float, default=0.3, help="when the backup starts, share of the window"
    )
    p.add_argument(
        "--patience",
        type=float,
        default=1.0,
        help="seconds a request waits for a free connection or session before it is "
        "counted as not sent (1)",
    )
    p.add_argument("--request-timeout", type=float, default=10.0, help="per request (10 s)")
    p.add_argument("--seed", type=int, default=1, help="random seed of the read choices (1)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temp directory (logs, data)")
    opts = p.parse_args(argv)
    engines = {e.strip() for e in opts.engines.split(",") if e.strip()}
    if not engines or engines - {"sqlite", "postgresql"}:
        p.error("--engines: sqlite, postgresql or both")
    opts.engine_set = engines
    try:
        opts.pg_process_counts = [int(n) for n in opts.pg_processes.split(",") if n.strip()]
    except ValueError:
        p.error("--pg-processes: process counts, comma-separated")
    if not opts.pg_process_counts or not all(1 <= n <= 8 for n in opts.pg_process_counts):
        p.error("--pg-processes: counts from 1 to 8")
    if opts.duration < 1 or opts.warmup < 0 or opts.duration > 600 or opts.warmup > 600:
        p.error("--duration 1..600 s, --warmup 0..600 s")
    if opts.soak is not None and not 20 <= opts.soak <= 86_400:
        p.error("--soak 20..86400 s")
    if opts.factor is not None and not 0 < opts.factor <= 1000:
        p.error("--factor: more than 0, at most 1000")
    if opts.historical < 0 or opts.projects < 1 or opts.agents < 2:
        p.error("need --historical >= 0, --projects >= 1, --agents >= 2 (reviews need two)")
    if opts.streams < 0 or opts.burst < 0 or opts.connections < 1 or opts.upload_mib < 1:
        p.error("need --streams >= 0, --burst >= 0, --connections >= 1, --upload-mib >= 1")
    if not all(0 <= x < 1 for x in (opts.burst_at, opts.upload_at, opts.backup_at)):
        p.error("--burst-at, --upload-at, --backup-at: shares of the window, 0 to below 1")
    if opts.ready is None:
        opts.ready = ready_needed(opts)
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if not sys.platform.startswith("linux"):
        print("bench_workload: needs Linux (/proc for RSS and CPU)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="bench_workload-"))
    report: dict[str, Any] = {
        "projects": opts.projects,
        "historical": opts.historical,
        "ready": opts.ready,
        "agents": opts.agents,
        "warmup_s": opts.warmup,
        "duration_s": opts.soak or opts.duration,
        "connections": opts.connections,
        "streams": opts.streams,
        "burst": opts.burst,
        "upload_mib": opts.upload_mib,
        "factors": planned_factors(opts),
        "mix": {"reads": dict(READ_MIX), "writes_per_task": list(WRITE_OPS)},
        "versions": versions(),
        "plugins": loaded_plugins(),
        "machine": {
            "cpus": os.cpu_count(),
            "kernel": platform.release(),
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        "runs": [],
    }
    try:
        for engine, processes in configurations(opts):
            run = run_configuration(opts, workdir, engine, processes)
            run["verdicts"] = verdicts(run)
            report["runs"].append(run)
    except BenchError as exc:
        print(f"bench_workload: {exc}", file=sys.stderr)
        return 1
    finally:
        if opts.keep:
            progress(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    report["total_s"] = round(time.perf_counter() - started, 1)
    if opts.json:
        print(json.dumps(strip_private(report), indent=2, default=str))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
