"""The upgrade path, on the engine under test (SQLite or PostgreSQL).

The documented procedure (``docs/operator_guide.md``, "Upgrading") is:

1. stop every server;
2. back up the database;
3. install the new release and run ``buildmax db migrate`` with it (on
   SQLite, starting the new server does the same);
4. start the new servers.

What these tests prove of it:

- **Step 3 keeps the data and step 4 serves it**
  (``test_a_database_of_an_older_release_upgrades_in_place``). For every
  migration namespace with more than one migration and every earlier
  version ``v`` of it, a database is built with the real ``migrate()`` where
  that namespace stops at ``v``; rows are written into it with plain
  SQLAlchemy Core inserts on the tables as they exist at ``v`` (read from
  the database's own catalog, never from today's ``Table`` objects); the
  new code's ``migrate()`` then applies exactly that namespace's ``v+1`` to
  its head; afterwards every namespace is ``current``, every row that was
  there before is still there with the same values, and a new server
  started *without* auto-migration reads the old rows through the HTTP API
  and claims and submits the old ready task.

  Every *other* namespace stands at its head in that database. Then the
  only schema change ``migrate()`` makes is the namespace's own, so a lost
  or altered row is blamed on exactly those migrations; each migration runs
  against the other namespaces' tables in their final shape (plugin tables
  holding foreign keys into the kernel's, as in every real upgrade); and
  the rows of the other namespaces are already in the shape the new code
  reads, so the server's answers after the upgrade test the upgraded
  namespace's data rather than rows that happen to be missing elsewhere.

- **The safety net for steps 1 and 4**
  (``test_a_server_of_the_previous_release_refuses_the_newer_schema``): for
  every namespace with more than one migration, the previous release is
  simulated by the same code without that namespace's newest migration. A
  previous-release server left running while the new ``buildmax db
  migrate`` runs turns unready (``/readyz`` answers 503), the migration
  status calls the namespace ``ahead``, and a previous-release server
  started afterwards is refused: the app's start-up (every ``buildmax
  serve`` worker), ``buildmax serve`` itself, ``buildmax db migrate``, ``db
  status`` (exit status 2) and every command that checks the schema
  (``_require_current_schema``). The new code's server then starts.

Nothing here names a version: the cases come from the loaded code's
migrations, so a new migration of any namespace is covered when it lands.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import sqlalchemy as sa
from buildmax_hookspecs import Migration
from click.testing import CliRunner, Result

from buildmax.app import BuildMax, create_app
from buildmax.clock import ManualClock
from buildmax.config import Config
from buildmax.database import Database, open_database, servers
from buildmax.migrations import group_migrations, migrate, migration_status
from buildmax.testing import call

# -- the cases, from the code ---------------------------------------------------------------------


def _installed_migrations() -> list[Migration]:
    """The migrations of a server with the suite's settings (every installed plugin)."""
    from buildmax import essentials
    from buildmax.plugins import create_plugins

    return create_plugins(essential=essentials).hooks.migrations()


def _heads(migrations: Sequence[Migration]) -> dict[str, int]:
    """Each namespace's newest version."""
    return {plugin: len(items) for plugin, items in group_migrations(migrations).items()}


_HEADS = _heads(_installed_migrations())
#: (namespace, an earlier version of it) for every namespace with more than one migration.
UPGRADES = [(plugin, v) for plugin, head in sorted(_HEADS.items()) for v in range(1, head)]
#: Namespaces whose previous release had fewer migrations than this code.
NEWER = [plugin for plugin, head in sorted(_HEADS.items()) if head > 1]


def _without_newer(migrations: Sequence[Migration], plugin: str, version: int) -> list[Migration]:
    """``migrations`` less those of ``plugin`` after ``version``."""
    return [m for m in migrations if not (m.plugin == plugin and m.version > version)]


@pytest.mark.engine_independent
def test_the_cases_are_the_servers_migrations(tmp_path: Path) -> None:
    """The cases were collected from the same migrations a server loads."""
    app = create_app(Config(data_dir=str(tmp_path / "data")))
    assert _heads(app.migrations()) == _HEADS
    assert {plugin for plugin, _ in UPGRADES} == set(NEWER)


# -- a fresh, empty database ----------------------------------------------------------------------


@pytest.fixture
async def empty_settings(
    buildmax_engine: str, buildmax_pg_server: str | None, tmp_path: Path
) -> AsyncIterator[Config]:
    """Settings naming an empty database of the engine under test (not the
    suite's migrated clone: these tests build the schema themselves)."""
    data_dir = str(tmp_path / "data")
    if buildmax_engine != "postgresql":
        yield Config(data_dir=data_dir)
        return
    assert buildmax_pg_server is not None
    name = f"bmx_upgrade_{secrets.token_hex(6)}"
    url = await servers.create_database(buildmax_pg_server, name)
    try:
        yield Config(data_dir=data_dir, database_url=url)
    finally:
        await servers.drop_database(buildmax_pg_server, name)


async def _open(settings: Config) -> Database:
    db = open_database(settings.effective_database_url)
    await db.connect()
    return db


# -- what an older release's database holds ------------------------------------------------------

#: When the older release wrote its rows, and when the new server runs.
WRITTEN_AT = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SERVED_AT = WRITTEN_AT + 86_400_000

OWNER_SECRET = "bmx_upgrade-owner-0000000000000000000000000000"
AGENT_SECRET = "bmx_upgrade-agent-0000000000000000000000000000"
SPACE_ID = "sp_upgradeSpace00000000A"
PROJECT_ID = "pj_upgradeProject000000A"
OWNER_ID = "pr_upgradeOwner00000000A"
AGENT_ID = "pr_upgradeAgent00000000A"
DONE_TASK_ID = "ta_upgradeDoneTask00000A"
READY_TASK_ID = "ta_upgradeReadyTask0000A"
ATTEMPT_ID = "at_upgradeAttempt000000A"
SUBMISSION_ID = "sb_upgradeSubmission000A"
ATTEMPT_TOKEN_ID = "tk_upgradeAttemptTokenA0"


def _verifier(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class Ref:
    """The generated numeric key of the row seeded as ``key``."""

    key: str


@dataclass(frozen=True)
class Seed:
    """A row to insert into ``table`` (its key, when it has one, generated)."""

    key: str
    table: str
    values: dict[str, Any]


@dataclass(frozen=True)
class Patch:
    """Values to set on the seeded row ``key`` (keys that point both ways)."""

    key: str
    values: dict[str, Any]


def _t(offset_s: int) -> int:
    return WRITTEN_AT + offset_s * 1000


#: A space where an agent finished one task (claimed, submitted: an attempt
#: and a submission) and another task, depending on it, waits ready.
SEEDS: list[Seed | Patch] = [
    Seed(
        "owner",
        "principals",
        {
            "public_id": OWNER_ID,
            "kind": "human",
            "name": "upgrade-owner",
            "display_name": "Owner Before The Upgrade",
            "system_role": "admin",
            "password_hash": None,
            "created_at": _t(0),
            "disabled_at": None,
        },
    ),
    Seed(
        "agent",
        "principals",
        {
            "public_id": AGENT_ID,
            "kind": "agent",
            "name": "upgrade-agent",
            "display_name": "",
            "system_role": None,
            "password_hash": None,
            "created_at": _t(1),
            "disabled_at": None,
        },
    ),
    Seed(
        "owner-token",
        "tokens",
        {
            "public_id": "tk_upgradeOwnerToken000A",
            "principal_id": Ref("owner"),
            "verifier": _verifier(OWNER_SECRET),
            "name": "laptop",
            "origin": "api",
            "scope_type": None,
            "scope_id": None,
            "created_at": _t(2),
            "expires_at": None,
            "revoked_at": None,
            "last_used_at": _t(30),
        },
    ),
    Seed(
        "agent-token",
        "tokens",
        {
            "public_id": "tk_upgradeAgentToken000A",
            "principal_id": Ref("agent"),
            "verifier": _verifier(AGENT_SECRET),
            "name": "runner",
            "origin": "api",
            "scope_type": None,
            "scope_id": None,
            "created_at": _t(3),
            "expires_at": None,
            "revoked_at": None,
            "last_used_at": None,
        },
    ),
    Seed(
        "space",
        "spaces",
        {
            "public_id": SPACE_ID,
            "slug": "upgrade",
            "name": "Upgrade",
            "created_at": _t(4),
            "created_by": Ref("owner"),
            "event_seq": 5,
        },
    ),
    Seed(
        "owner-member",
        "space_members",
        {
            "space_id": Ref("space"),
            "principal_id": Ref("owner"),
            "role": "owner",
            "created_at": _t(4),
        },
    ),
    Seed(
        "agent-member",
        "space_members",
        {
            "space_id": Ref("space"),
            "principal_id": Ref("agent"),
            "role": "member",
            "created_at": _t(5),
        },
    ),
    Seed(
        "project",
        "task_projects",
        {
            "public_id": PROJECT_ID,
            "space_id": Ref("space"),
            "name": "main",
            "description": "the project before the upgrade",
            "repository_url": "https://git.example/upgrade.git",
            "target_branch": "main",
            "policy_id": None,
            "revision": 1,
            "created_at": _t(6),
            "created_by": Ref("owner"),
            "updated_at": _t(6),
        },
    ),
    Seed(
        "done-task",
        "task_tasks",
        {
            "public_id": DONE_TASK_ID,
            "space_id": Ref("space"),
            "project_id": Ref("project"),
            "kind": "code",
            "title": "write the parser",
            "priority": 2,
            "labels": '["parser"]',
            "resources": '["repo:main"]',
            "agent_id": None,
            "state": "done",
            "stage": None,
            "subject_task_id": None,
            "subject_submission_id": None,
            "slot": None,
            "human_only": 0,
            "max_attempts": 3,
            "attempts_used": 0,
            "generation": 1,
            "revision": 1,
            "current_attempt_id": None,  # patched below, once the attempt exists
            "current_submission_id": None,
            "finding_ids": "[]",
            "outcome_reason": None,
            "ready_at": _t(7),
            "created_at": _t(7),
            "created_by": Ref("owner"),
            "updated_at": _t(20),
        },
    ),
    Seed(
        "done-task-revision",
        "task_revisions",
        {
            "task_id": Ref("done-task"),
            "number": 1,
            "title": "write the parser",
            "body": "Parse the input format.",
            "criteria": "The tests pass.",
            "created_at": _t(7),
            "created_by": Ref("owner"),
        },
    ),
    Seed(
        "ready-task",
        "task_tasks",
        {
            "public_id": READY_TASK_ID,
            "space_id": Ref("space"),
            "project_id": Ref("project"),
            "kind": "code",
            "title": "document the parser",
            "priority": 1,
            "labels": '["docs"]',
            "resources": '["repo:main"]',
            "agent_id": None,
            "state": "ready",
            "stage": None,
            "subject_task_id": None,
            "subject_submission_id": None,
            "slot": None,
            "human_only": 0,
            "max_attempts": 3,
            "attempts_used": 0,
            "generation": 0,
            "revision": 1,
            "current_attempt_id": None,
            "current_submission_id": None,
            "finding_ids": "[]",
            "outcome_reason": None,
            "ready_at": _t(20),
            "created_at": _t(8),
            "created_by": Ref("owner"),
            "updated_at": _t(20),
        },
    ),
    Seed(
        "ready-task-revision",
        "task_revisions",
        {
            "task_id": Ref("ready-task"),
            "number": 1,
            "title": "document the parser",
            "body": "Describe the format.",
            "criteria": "",
            "created_at": _t(8),
            "created_by": Ref("owner"),
        },
    ),
    Seed(
        "dependency",
        "task_dependencies",
        {"task_id": Ref("ready-task"), "prerequisite_id": Ref("done-task"), "created_at": _t(8)},
    ),
    Seed(
        "attempt-token",
        "tokens",
        {
            "public_id": ATTEMPT_TOKEN_ID,
            "principal_id": Ref("agent"),
            "verifier": _verifier("bmx_upgrade-attempt-revoked-000000000000000000"),
            "name": f"attempt {ATTEMPT_ID}",
            "origin": "claim",
            "scope_type": "attempt",
            "scope_id": ATTEMPT_ID,
            "created_at": _t(10),
            "expires_at": None,
            "revoked_at": _t(20),
            "last_used_at": _t(20),
        },
    ),
    Seed(
        "attempt",
        "task_attempts",
        {
            "public_id": ATTEMPT_ID,
            "task_id": Ref("done-task"),
            "space_id": Ref("space"),
            "generation": 1,
            "claimant_id": Ref("agent"),
            "agent_revision_id": None,
            "state": "submitted",
            "lease_expires_at": _t(610),
            "run_environment": '{"plugins":{"agent_revision_id":null,"pins":[]}}',
            "progress": '{"note":"halfway"}',
            "token_id": ATTEMPT_TOKEN_ID,
            "hold_refused_at": None,
            "charged": 0,
            "end_reason": None,
            "created_at": _t(10),
            "renewed_at": _t(15),
            "ended_at": _t(20),
        },
    ),
    Seed(
        "checkpoint",
        "task_checkpoints",
        {"attempt_id": Ref("attempt"), "data": '{"step":1}', "created_at": _t(12)},
    ),
    Seed(
        "submission",
        "task_submissions",
        {
            "public_id": SUBMISSION_ID,
            "task_id": Ref("done-task"),
            "attempt_id": Ref("attempt"),
            "generation": 1,
            "task_revision": 1,
            "submitted_by": Ref("agent"),
            "summary": "the parser, with tests",
            "candidate": '{"branch":"parser"}',
            "evidence": '{"tests":"42 passed"}',
            "verdict": None,
            "created_at": _t(20),
        },
    ),
    Patch(
        "done-task",
        {"current_attempt_id": Ref("attempt"), "current_submission_id": Ref("submission")},
    ),
    *(
        Seed(
            f"event-{seq}",
            "events",
            {
                "space_id": Ref("space"),
                "seq": seq,
                "type": kind,
                "data": data,
                "created_at": _t(at),
            },
        )
        for seq, kind, data, at in [
            (1, "project.created", f'{{"name":"main","project_id":"{PROJECT_ID}"}}', 6),
            (2, "task.created", f'{{"project_id":"{PROJECT_ID}","task_id":"{DONE_TASK_ID}"}}', 7),
            (3, "task.created", f'{{"project_id":"{PROJECT_ID}","task_id":"{READY_TASK_ID}"}}', 8),
            (4, "task.claimed", f'{{"attempt_id":"{ATTEMPT_ID}","task_id":"{DONE_TASK_ID}"}}', 10),
            (5, "task.state", f'{{"state":"done","task_id":"{DONE_TASK_ID}"}}', 20),
        ]
    ),
]


async def _columns(conn: Any) -> dict[str, list[str]]:
    """Every table of the database and its columns, from the catalog."""
    if conn.dialect == "postgresql":
        query = sa.text(
            "SELECT table_name AS t, column_name AS c FROM information_schema.columns "
            "WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position"
        )
    else:
        query = sa.text(
            "SELECT m.name AS t, p.name AS c FROM sqlite_master AS m "
            "JOIN pragma_table_info(m.name) AS p "
            "WHERE m.type = 'table' AND m.name NOT LIKE 'sqlite\\_%' ESCAPE '\\' "
            "ORDER BY m.name, p.cid"
        )
    found: dict[str, list[str]] = {}
    for row in await conn.fetch_all(query):
        found.setdefault(row["t"], []).append(row["c"])
    return found


#: A seeded row: its table and the values written (its generated key as ``id``).
Written = dict[str, tuple[str, dict[str, Any]]]


async def _seed(db: Database) -> Written:
    """Insert :data:`SEEDS` with Core statements on the tables as the
    database has them now: a table it lacks is skipped (and the rows
    referring to its rows), a column it lacks is left out."""
    pks: dict[str, int] = {}
    written: Written = {}

    def resolve(values: dict[str, Any], columns: list[str]) -> dict[str, Any] | None:
        if any(isinstance(v, Ref) and v.key not in pks for v in values.values()):
            return None
        return {
            c: pks[v.key] if isinstance(v, Ref) else v for c, v in values.items() if c in columns
        }

    async with db.write() as tx:
        existing = await _columns(tx)
        for item in SEEDS:
            if isinstance(item, Patch):
                if item.key not in written:
                    continue
                name, row = written[item.key]
                table = sa.table(name, *(sa.column(c) for c in existing[name]))
                changes = resolve(item.values, existing[name])
                if changes is None:
                    continue
                await tx.execute(
                    sa.update(table).where(table.c.id == pks[item.key]).values(changes)
                )
                row.update(changes)
                continue
            if item.table not in existing:
                continue
            columns = existing[item.table]
            values = resolve(item.values, columns)
            if values is None:
                continue
            table = sa.table(item.table, *(sa.column(c) for c in columns))
            insert = table.insert().values(values)
            if "id" in columns:
                pks[item.key] = await tx.fetch_val(insert.returning(table.c.id))
                values = {"id": pks[item.key], **values}
            else:
                await tx.execute(insert)
            written[item.key] = (item.table, values)
    return written


Snapshot = dict[str, list[dict[str, Any]]]


async def _snapshot(db: Database) -> Snapshot:
    """Every row of every table."""
    async with db.read() as conn:
        tables = await _columns(conn)
        return {
            name: [dict(r) for r in await conn.fetch_all(sa.text(f'SELECT * FROM "{name}"'))]
            for name in tables
        }


_GONE = object()


def _lost_rows(before: Snapshot, after: Snapshot) -> list[str]:
    """The rows of ``before`` that ``after`` lacks, or holds with another
    value in a column ``before`` had (columns added since are ignored)."""
    lost = []
    for name, rows in before.items():
        columns = sorted({c for row in rows for c in row})

        def key(row: dict[str, Any], columns: list[str] = columns) -> tuple[Any, ...]:
            return tuple((c, row.get(c, _GONE)) for c in columns)

        missing = Counter(key(r) for r in rows) - Counter(key(r) for r in after.get(name, []))
        lost += [f"{name}: {dict(k)}" for k in missing.elements()]
    return lost


def _missing_seeds(written: Written, after: Snapshot) -> list[str]:
    """The seeded rows ``after`` does not hold, value for value, exactly once."""
    missing = []
    for key, (name, values) in written.items():
        matches = [
            row
            for row in after.get(name, [])
            if all(row.get(c, _GONE) == v for c, v in values.items())
        ]
        if len(matches) != 1:
            missing.append(f"{key} ({name}): {values} matched {len(matches)} rows")
    return missing


# -- 1. an older database upgrades in place -------------------------------------------------------


@pytest.mark.parametrize(
    ("namespace", "version"), UPGRADES, ids=[f"{p}-from-{v}" for p, v in UPGRADES]
)
async def test_a_database_of_an_older_release_upgrades_in_place(
    namespace: str, version: int, empty_settings: Config
) -> None:
    app = create_app(empty_settings, clock=ManualClock(WRITTEN_AT))
    code = app.migrations()
    head = _heads(code)[namespace]
    await app.db.connect()
    try:
        # The database the older release left: this namespace at `version`.
        await migrate(app.db, _without_newer(code, namespace, version), app.clock)
        older = {s.plugin: (s.state, s.db_version) for s in await migration_status(app.db, code)}
        assert older == {
            plugin: ("pending", version) if plugin == namespace else ("current", h)
            for plugin, h in _heads(code).items()
        }
        written = await _seed(app.db)
        assert {"space", "done-task", "attempt", "submission", "ready-task"} <= set(written)
        before = await _snapshot(app.db)

        # `buildmax db migrate` with the new code.
        applied = await migrate(app.db, code, app.clock)
        assert [(m.plugin, m.version) for m in applied] == [
            (namespace, v) for v in range(version + 1, head + 1)
        ]
        statuses = await migration_status(app.db, code)
        assert {s.plugin: (s.state, s.db_version) for s in statuses} == {
            plugin: ("current", h) for plugin, h in _heads(code).items()
        }
        after = await _snapshot(app.db)
    finally:
        await app.db.close()
    assert _lost_rows(before, after) == []
    assert _missing_seeds(written, after) == []

    await _serves_the_older_rows(empty_settings)


async def _serves_the_older_rows(settings: Config) -> None:
    """A new server (no auto-migration: a pending migration would refuse
    its start) reads the older rows and works on them."""
    server = create_app(settings, clock=ManualClock(SERVED_AT))
    async with server.test_app():
        client = server.test_client()
        ready = await call(client, "GET", "/readyz", None, expect=200)
        assert ready["checks"] == {"database": "ok", "migrations": "current"}

        space = await call(client, "GET", f"/v1/spaces/{SPACE_ID}", OWNER_SECRET, expect=200)
        assert (space["id"], space["slug"], space["name"]) == (SPACE_ID, "upgrade", "Upgrade")
        base = f"/v1/spaces/{SPACE_ID}"

        done = await call(client, "GET", f"{base}/tasks/{DONE_TASK_ID}", OWNER_SECRET, expect=200)
        assert {k: done[k] for k in _DONE_TASK} == _DONE_TASK
        attempts = await call(
            client, "GET", f"{base}/tasks/{DONE_TASK_ID}/attempts", OWNER_SECRET, expect=200
        )
        assert [
            (a["id"], a["claimant_id"], a["state"], a["progress"]) for a in attempts["items"]
        ] == [(ATTEMPT_ID, AGENT_ID, "submitted", {"note": "halfway"})]
        submission = await call(
            client, "GET", f"{base}/submissions/{SUBMISSION_ID}", OWNER_SECRET, expect=200
        )
        assert {k: submission[k] for k in _SUBMISSION} == _SUBMISSION

        queue = await call(client, "GET", f"{base}/ready", AGENT_SECRET, expect=200)
        assert [t["id"] for t in queue["items"]] == [READY_TASK_ID]
        claim = await call(
            client, "POST", f"{base}/tasks/{READY_TASK_ID}/claim", AGENT_SECRET, json={}, expect=201
        )
        assert (claim["task"]["id"], claim["task"]["state"]) == (READY_TASK_ID, "claimed")
        assert (claim["attempt"]["generation"], claim["attempt"]["claimant_id"]) == (1, AGENT_ID)
        assert claim["task"]["body"] == "Describe the format."
        handed_in = await call(
            client,
            "POST",
            f"{base}/attempts/{claim['attempt']['id']}/submit",
            claim["token"],
            json={"generation": 1, "summary": "documented after the upgrade"},
            expect=201,
        )
        read = await call(
            client,
            "GET",
            f"{base}/submissions/{handed_in['submission']['id']}",
            AGENT_SECRET,
            expect=200,
        )
        assert (read["task_id"], read["submitted_by"], read["summary"]) == (
            READY_TASK_ID,
            AGENT_ID,
            "documented after the upgrade",
        )


#: The done task as the API shows it (its row and its first revision).
_DONE_TASK = {
    "id": DONE_TASK_ID,
    "project_id": PROJECT_ID,
    "title": "write the parser",
    "body": "Parse the input format.",
    "criteria": "The tests pass.",
    "state": "done",
    "priority": 2,
    "labels": ["parser"],
    "resources": ["repo:main"],
    "generation": 1,
    "revision": 1,
    "current_attempt_id": ATTEMPT_ID,
    "current_submission_id": SUBMISSION_ID,
}
#: Its submission, written before the namespace's later migrations existed.
_SUBMISSION = {
    "id": SUBMISSION_ID,
    "task_id": DONE_TASK_ID,
    "attempt_id": ATTEMPT_ID,
    "submitted_by": AGENT_ID,
    "summary": "the parser, with tests",
    "candidate": {"branch": "parser"},
    "evidence": {"tests": "42 passed"},
    "artifacts": [],
}


# -- 2. a server of the previous release refuses the newer schema ----------------------------------


def _cli(settings: Config, *command: str) -> Result:
    """Run ``buildmax <command>`` on the test's database."""
    from buildmax import cli as cli_module

    cli_module._register_commands()
    args = ["--data-dir", settings.data_dir]
    if settings.database_url:
        args += ["--database-url", settings.database_url]
    return CliRunner().invoke(cli_module.cli, [*command, *args])


def _previous_release(
    settings: Config, previous: list[Migration], monkeypatch: pytest.MonkeyPatch
) -> BuildMax:
    """A server as the previous release's worker builds it (``buildmax.asgi``:
    migrating at start on SQLite only), knowing only ``previous``."""
    app = create_app(settings, auto_migrate=settings.engine == "sqlite")
    monkeypatch.setattr(app, "migrations", lambda: list(previous))
    return app


async def _start_error(app: BuildMax) -> str:
    """The message the app's start-up failed with."""
    try:
        async with app.test_app():
            pass
    except Exception as exc:
        return str(exc)
    raise AssertionError("start-up should have been refused")


@pytest.mark.parametrize("namespace", NEWER)
async def test_a_server_of_the_previous_release_refuses_the_newer_schema(
    namespace: str, empty_settings: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = empty_settings
    code = create_app(settings).migrations()
    head = _heads(code)[namespace]
    [newest] = [m for m in code if (m.plugin, m.version) == (namespace, head)]
    previous = _without_newer(code, namespace, head - 1)
    if settings.engine == "postgresql":  # the previous release's `buildmax db migrate`
        db = await _open(settings)
        try:
            await migrate(db, previous, ManualClock(WRITTEN_AT))
        finally:
            await db.close()

    # A previous-release server is left running while the new code migrates.
    old = _previous_release(settings, previous, monkeypatch)
    async with old.test_app():
        client = old.test_client()
        await call(client, "GET", "/readyz", None, expect=200)
        migrated = await asyncio.to_thread(_cli, settings, "db", "migrate")
        assert migrated.exit_code == 0, migrated.output
        assert f"applied {namespace} {head}: {newest.name}" in migrated.output.splitlines()
        unready = await client.get("/readyz")
        assert unready.status_code == 503
        assert unready.headers["Retry-After"] == "30"
        assert (await unready.get_json())["detail"] == f"migrations not current for: {namespace}"

    db = await _open(settings)
    try:
        statuses = {s.plugin: s for s in await migration_status(db, previous)}
    finally:
        await db.close()
    assert (statuses[namespace].state, statuses[namespace].db_version) == ("ahead", head)
    assert statuses[namespace].code_version == head - 1
    assert {p for p, s in statuses.items() if s.state != "current"} == {namespace}

    ahead = f"{namespace} (database at {head}, code knows {head - 1})"
    # A previous-release server (re)started now: its start-up refuses.
    message = await _start_error(_previous_release(settings, previous, monkeypatch))
    assert ahead in message and "newer BuildMax release" in message

    # The previous release's commands, every one loading the same migrations.
    monkeypatch.setattr(BuildMax, "migrations", lambda self: list(previous))
    served: list[Any] = []

    def run(config: Any) -> int:  # Hypercorn, had serve gone through
        served.append(config)
        return 0

    monkeypatch.setattr("hypercorn.run.run", run)
    with mock.patch.dict(os.environ):  # a serve that went through would export settings
        serve = await asyncio.to_thread(_cli, settings, "serve")
    assert serve.exit_code == 1, serve.output
    assert ahead in serve.output and "restore a backup" in serve.output
    assert served == []
    old_migrate = await asyncio.to_thread(_cli, settings, "db", "migrate")
    assert old_migrate.exit_code == 1 and ahead in old_migrate.output
    status = await asyncio.to_thread(_cli, settings, "db", "status")
    assert status.exit_code == 2, status.output
    rows = {line.split()[0]: line.split()[1:] for line in status.output.splitlines()[1:]}
    assert rows[namespace] == [str(head), str(head - 1), "ahead"]
    refused = await asyncio.to_thread(_read_with_the_schema_check, settings)
    assert refused == (
        f"the database schema is newer than this code for {namespace}: "
        "run the BuildMax version that migrated it"
    )

    # The new code's server starts on it.
    monkeypatch.undo()
    new = create_app(settings)
    async with new.test_app():
        ready = await call(new.test_client(), "GET", "/readyz", None, expect=200)
        assert ready["checks"]["migrations"] == "current"


def _read_with_the_schema_check(settings: Config) -> str:
    """What a command reading the database (``with_app``, which checks the
    schema first) says; the work itself must not run."""
    import click

    from buildmax.commands.server import with_app

    ran: list[bool] = []

    async def work(app: Any) -> None:
        ran.append(True)

    try:
        with_app(settings, work)
    except click.ClickException as exc:
        assert ran == []
        return exc.message
    raise AssertionError("the command should have been refused")
