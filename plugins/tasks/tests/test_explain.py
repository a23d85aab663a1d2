"""Acceptance 9 (EXPLAIN part): the ready queue and claim-next's candidate
query are served by the partial index ``task_tasks_ready`` on both engines,
with 20,000 historical tasks in the table, and need no sort.

Each query is the plugin's own (``claims.ready_statement`` with the values
the ``/ready`` route and ``claim_next`` bind), compiled for the engine's
dialect with literal values, then explained after ANALYZE; then again as
the engine receives it, with bound parameters.

The space holds 2,000 ready tasks. With only a handful, PostgreSQL rightly
reads them through ``task_tasks_space_state`` and sorts them (cheaper than
any index walk); it takes the ordered partial index for a ``/ready`` page
once a space has about a thousand ready tasks, because it expects each of
the query's three ``NOT IN`` hold and decision filters to drop half of them.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_tasks.claims import ClaimFilters, ready_params, ready_statement
from buildmax_tasks.records import task_list_statement
from buildmax_tasks.tables import projects, task_revisions, tasks
from sqlalchemy.dialects import postgresql, sqlite

from buildmax.migrations import migrate
from buildmax.tables import schema_migrations

HISTORY = 20_000
READY = 2_000


async def seed(work: Any) -> int:
    """20,000 done tasks and a few ready ones in the work space, each with its
    first revision (bulk SQL), a few ready ones in another project; the
    tables analysed. The project's key."""
    now = work.app.clock.now_ms()
    async with work.app.db.write() as tx:
        project_pk = await tx.fetch_val(
            sa.select(projects.c.id).where(
                projects.c.space_id == work.space.pk, projects.c.name == "main"
            )
        )

        # One INSERT ... SELECT a state (a statement of 22,000 bound values
        # took most of each test's time to compile).
        zero = sa.literal_column("0", sa.BigInteger)
        counted = sa.select(zero.label("n")).cte("counted", recursive=True)
        counted = counted.union_all(
            sa.select(counted.c.n + sa.literal_column("1", sa.BigInteger)).where(
                counted.c.n < sa.literal_column(str(HISTORY - 1), sa.BigInteger)
            )
        )
        n = counted.c.n
        for state, count in (("done", HISTORY), ("ready", READY)):
            await tx.execute(
                tasks.insert().from_select(
                    [
                        "public_id",
                        "space_id",
                        "project_id",
                        "kind",
                        "title",
                        "state",
                        "priority",
                        "ready_at",
                        "created_at",
                        "updated_at",
                    ],
                    sa.select(
                        sa.literal(f"ta_{state}_", sa.String) + sa.cast(n, sa.String),
                        sa.literal(work.space.pk, sa.BigInteger),
                        sa.literal(project_pk, sa.BigInteger),
                        sa.literal("code"),
                        sa.literal("task ", sa.String) + sa.cast(n, sa.String),
                        sa.literal(state),
                        n % 7,
                        sa.literal_column(str(now), sa.BigInteger) - n,
                        sa.literal_column(str(now), sa.BigInteger) - n,
                        sa.literal_column(str(now), sa.BigInteger) - n,
                    ).where(n < count),
                )
            )
        # Each task's first revision, as every task has one.
        await tx.execute(
            task_revisions.insert().from_select(
                ["task_id", "number", "title", "body", "criteria", "created_at"],
                sa.select(
                    tasks.c.id,
                    tasks.c.revision,
                    tasks.c.title,
                    sa.literal(""),
                    sa.literal(""),
                    tasks.c.created_at,
                ).where(tasks.c.space_id == work.space.pk, tasks.c.title.like("task %")),
            )
        )
        seeded = sa.select(sa.func.count()).where(tasks.c.space_id == work.space.pk)
        assert await tx.fetch_val(seeded) >= HISTORY + READY
        if tx.dialect == "sqlite":
            await tx.execute(sa.text("ANALYZE"))
    if work.app.db.dialect == "postgresql":
        async with work.app.db.read() as conn:
            await conn.execute(sa.text("ANALYZE"))
    return int(project_pk)


def queries(space_pk: int, now: int, *, lock: bool = False) -> dict[str, Any]:
    """The ready queue and claim-next's candidate queries, as the plugin
    builds them, with the values it binds."""
    filters = ClaimFilters()
    first = ready_statement(filters.shape(), lock=lock)
    later = ready_statement(filters.shape(), after=True, lock=lock)
    shaped = {
        "ready": (first, ready_params(space_pk, now, filters, 51)),
        "claim-next": (first, ready_params(space_pk, now, filters, 20)),
        "claim-next (one at a time)": (first, ready_params(space_pk, now, filters, 1)),
        "claim-next (later batch)": (
            later,
            ready_params(space_pk, now, filters, 20, (0, now - 1000, 3)),
        ),
    }
    return {name: statement.params(**values) for name, (statement, values) in shaped.items()}


def literal_sql(query: Any, dialect: str) -> str:
    compiled = query.compile(
        dialect=postgresql.dialect() if dialect == "postgresql" else sqlite.dialect(),
        compile_kwargs={"literal_binds": True},
    )
    return str(compiled)


def pg_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", ()):
        found.extend(pg_nodes(child))
    return found


async def plan_of(work: Any, sql: str) -> list[str]:
    """The plan's lines touching ``task_tasks`` (scans and sorts)."""
    async with work.app.db.read() as conn:
        if conn.dialect == "sqlite":
            rows = await conn.fetch_all(sa.text("EXPLAIN QUERY PLAN " + sql))
            return [r["detail"] for r in rows]
        (row,) = await conn.fetch_all(sa.text("EXPLAIN (FORMAT JSON) " + sql))
    plan = row["QUERY PLAN"]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    return [describe(node) for node in pg_nodes(plan[0]["Plan"])]


def describe(node: dict[str, Any]) -> str:
    parts = [node["Node Type"]]
    if "Index Name" in node:
        parts.append(f"using {node['Index Name']}")
    if "Relation Name" in node:
        parts.append(f"on {node['Relation Name']}")
    return " ".join(parts)


def assert_served_by_the_ready_index(dialect: str, name: str, plan: list[str]) -> None:
    print(f"\n{dialect} {name}:\n  " + "\n  ".join(plan))
    if dialect == "sqlite":
        main = [line for line in plan if "task_tasks " in line + " "]
        assert any("USING INDEX task_tasks_ready" in line for line in main), plan
        assert not any(line.startswith("SCAN task_tasks") for line in main), plan
        assert not any("TEMP B-TREE" in line for line in plan), plan
    else:
        on_tasks = [line for line in plan if line.endswith("on task_tasks")]
        assert on_tasks and all("using task_tasks_ready" in line for line in on_tasks), plan
        assert not any(line.startswith("Sort") for line in plan), plan


async def test_the_ready_query_and_claim_next_use_the_ready_index(work):
    await seed(work)
    dialect = work.app.db.dialect
    for name, query in queries(work.space.pk, work.app.clock.now_ms()).items():
        sql = literal_sql(query, dialect)
        assert_served_by_the_ready_index(dialect, name, await plan_of(work, sql))
    if dialect == "postgresql":
        locked = queries(work.space.pk, work.app.clock.now_ms(), lock=True)["claim-next"]
        plan = await plan_of(work, literal_sql(locked, dialect))
        assert_served_by_the_ready_index(dialect, "claim-next FOR UPDATE SKIP LOCKED", plan)


async def test_the_queries_as_sent_with_parameters_use_the_ready_index(work):
    """The same queries with their values as bound parameters, which is how
    they reach the engine. SQLite plans them with the bound values; on
    PostgreSQL a prepared statement is explained after six executions, when
    the server has settled between a custom and a generic plan."""
    await seed(work)
    dialect = work.app.db.dialect
    now = work.app.clock.now_ms()
    for name, query in queries(work.space.pk, now).items():
        if dialect == "sqlite":
            compiled = query.compile(
                dialect=sqlite.dialect(paramstyle="named"),
                compile_kwargs={"render_postcompile": True},
            )
            statement = sa.text("EXPLAIN QUERY PLAN " + compiled.string).bindparams(
                **compiled.params
            )
            async with work.app.db.read() as conn:
                plan = [r["detail"] for r in await conn.fetch_all(statement)]
        else:
            compiled = query.compile(
                dialect=postgresql.dialect(paramstyle="numeric_dollar"),
                compile_kwargs={"render_postcompile": True},
            )
            values = ", ".join(
                literal_sql(sa.literal(compiled.params[k]), dialect) for k in compiled.positiontup
            )
            async with work.app.db.write() as tx:
                await tx.execute(sa.text("PREPARE ready_probe AS " + compiled.string))
                try:
                    for _ in range(6):
                        await tx.fetch_all(sa.text(f"EXECUTE ready_probe({values})"))
                    (row,) = await tx.fetch_all(
                        sa.text(f"EXPLAIN (FORMAT JSON) EXECUTE ready_probe({values})")
                    )
                finally:
                    await tx.execute(sa.text("DEALLOCATE ready_probe"))
            raw = row["QUERY PLAN"]
            raw = json.loads(raw) if isinstance(raw, str) else raw
            plan = [describe(node) for node in pg_nodes(raw[0]["Plan"])]
        assert_served_by_the_ready_index(dialect, name + " (parameters)", plan)


async def test_the_task_list_reads_newest_first_from_an_index(work):
    """The task list (``GET /tasks``, unfiltered and by state) is served by
    an index in its order: no sort of the space's history, which took about
    100 ms at 100,000 tasks and failed the read's 250 ms bound under load."""
    await seed(work)
    dialect = work.app.db.dialect
    for name, conditions in (("all", []), ("done", [tasks.c.state == "done"])):
        query = task_list_statement(work.space.pk, conditions, 21, None)
        plan = await plan_of(work, literal_sql(query, dialect))
        print(f"\n{dialect} task list ({name}):\n  " + "\n  ".join(plan))
        if dialect == "sqlite":
            assert not any("TEMP B-TREE" in line for line in plan), plan
            assert any("USING INDEX task_tasks_space" in line for line in plan), plan
        else:
            assert not any(line.startswith("Sort") for line in plan), plan


async def test_the_task_list_of_one_project_reads_the_project_index(work):
    """A project's page is read from ``task_tasks_project`` (in one state:
    ``task_tasks_project_state``), never by walking the whole space or the
    whole project newest first (SQLite, unanalysed, preferred
    ``task_tasks_space``: a small project of a big space was a scan of every
    task)."""
    await seed(work)
    dialect = work.app.db.dialect
    async with work.app.db.read() as conn:
        project_pk = await conn.fetch_val(
            sa.select(projects.c.id).where(projects.c.space_id == work.space.pk)
        )
    if dialect == "sqlite":
        # As the server leaves it: never analysed (a fresh connection reads the plan).
        async with work.app.db.write() as tx:
            await tx.execute(sa.text("DROP TABLE IF EXISTS sqlite_stat1"))
    for after, state in ((None, None), ("ta_x", None), (None, "ready"), ("ta_x", "done")):
        conditions = [] if state is None else [tasks.c.state == state]
        query = task_list_statement(work.space.pk, conditions, 21, after, project_pk=project_pk)
        if dialect == "sqlite":
            with contextlib.closing(sqlite3.connect(work.app.db.path)) as fresh:
                sql = "EXPLAIN QUERY PLAN " + literal_sql(query, dialect)
                plan = [row[3] for row in fresh.execute(sql)]
        else:
            plan = await plan_of(work, literal_sql(query, dialect))
        print(f"\n{dialect} task list (project, {state=}, {after=}):\n  " + "\n  ".join(plan))
        if dialect == "sqlite":
            on_tasks = [line for line in plan if "task_tasks " in line + " "]
            index = "task_tasks_project " if state is None else "task_tasks_project_state "
            assert any(f"USING INDEX {index}" in line + " " for line in on_tasks), plan
            assert not any("TEMP B-TREE" in line for line in plan), plan
        else:
            assert not any(line.startswith("Sort") for line in plan), plan


async def test_migration_3_indexes_a_database_made_before_it(work):
    """A database migrated before the task list's indexes existed gets them
    from migration 3, and task search, with its tasks indexed, from
    migration 4."""
    app = work.app
    made = await work.task("Made before search", criteria="found by its criteria")
    async with app.db.write() as tx:
        await tx.execute(sa.text("DROP INDEX task_tasks_space"))
        await tx.execute(sa.text("DROP INDEX task_tasks_project_state"))
        await tx.execute(sa.text("DROP TABLE task_search"))
        await tx.execute(
            sa.delete(schema_migrations).where(
                schema_migrations.c.plugin == "tasks", schema_migrations.c.version >= 3
            )
        )
    applied = await migrate(app.db, app.migrations(), app.clock)
    assert [(m.plugin, m.version) for m in applied] == [
        ("tasks", 3),
        ("tasks", 4),
        ("tasks", 5),
        ("tasks", 6),
    ]
    found = await work.call("GET", "/tasks?q=criteria", work.viewer, expect=200)
    assert [t["id"] for t in found["items"]] == [made["id"]]
    catalog = (
        "SELECT name FROM sqlite_master WHERE type = 'index'"
        if app.db.dialect == "sqlite"
        else "SELECT indexname AS name FROM pg_indexes WHERE tablename = 'task_tasks'"
    )
    async with app.db.read() as conn:
        names = {row["name"] for row in await conn.fetch_all(sa.text(catalog))}
    assert {"task_tasks_space", "task_tasks_project_state"} <= names


@pytest.mark.engine_independent
def test_a_task_read_joins_only_the_project_and_the_current_revision() -> None:
    """Every other public id a task shows (space, agent, subject, current
    attempt and submissions) is a subquery of its own: as joins, PostgreSQL
    took 12-16 ms to plan each task list at 100,000 tasks, and 0.3-0.5 ms
    with them as subqueries (its generic plan is never chosen for a list)."""
    sql = str(task_list_statement(1, [], 21, None).compile(dialect=postgresql.dialect()))
    joined = [part.split(" ON ", 1)[0] for part in sql.split(" JOIN ")[1:]]
    assert joined == ["task_projects", "task_revisions"], sql
