"""The built-in graders against saved values, files, logs and a real
SQLite database: each passes on the outcome it asserts and fails naming the
problem; a spec it cannot use is refused when the journey loads."""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_graders.builtin import BUILTIN_GRADERS
from buildmax_graders.journey import render, resolve
from buildmax_hookspecs import GradingContext

pytestmark = pytest.mark.engine_independent


class Context:
    """A grading context over plain values, a log, a directory and a SQLite file."""

    def __init__(self, workdir: Path, values: Mapping[str, Any] | None = None) -> None:
        self.workdir = workdir
        self.values = dict(values or {})
        self.log = ""
        self.events: list[Mapping[str, Any]] = []
        self.minted: list[str] = []
        self.db = workdir / "state.db"

    def value(self, ref: str) -> Any:
        return resolve(self.values, ref)

    def render(self, template: Any) -> Any:
        return render(self.values, template)

    async def scalar(self, sql: str, params: Mapping[str, Any] | None = None) -> Any:
        with sqlite3.connect(self.db) as conn:
            return conn.execute(sql, dict(params or {})).fetchone()[0]

    async def audit_events(self) -> Sequence[Mapping[str, Any]]:
        return self.events

    def server_log(self) -> str:
        return self.log

    def secrets(self) -> Sequence[str]:
        return self.minted

    def environment(self) -> Mapping[str, str]:
        return {"BUILDMAX_GRADER_TEST": "yes"}


@pytest.fixture
def context(tmp_path: Path) -> Context:
    with sqlite3.connect(tmp_path / "state.db") as conn:
        conn.execute("create table attempts (task text, generation integer)")
        conn.execute("insert into attempts values ('t1', 1)")
    return Context(tmp_path)


async def grade(name: str, spec: Mapping[str, Any], context: Context) -> Any:
    grader = BUILTIN_GRADERS[name]({"grader": name, "step": "response", **spec})
    assert isinstance(context, GradingContext)
    return await grader.grade(context)


def problem(status: int, slug: str) -> dict[str, Any]:
    return {"status": status, "body": {"type": f"urn:buildmax:problem:{slug}", "detail": "why"}}


# -- status ---------------------------------------------------------------------


async def test_status_checks_the_code_and_the_problem_slug(context: Context) -> None:
    context.values["claim"] = problem(409, "task-claimed")
    passed = await grade(
        "status", {"of": "claim", "status": 409, "problem": "task-claimed"}, context
    )
    assert passed.passed and passed.reason == "claim: 409 task-claimed"

    wrong_slug = await grade("status", {"of": "claim", "status": 409, "problem": "x"}, context)
    assert not wrong_slug.passed
    assert wrong_slug.reason == "claim: problem 'task-claimed', expected 'x'"

    wrong_code = await grade("status", {"of": "claim", "status": [200, 201]}, context)
    assert wrong_code.reason == "claim: status 409, expected 200 or 201 (why)"


async def test_status_problem_false_refuses_any_problem_and_true_needs_one(
    context: Context,
) -> None:
    context.values["ok"] = problem(200, "odd")
    result = await grade("status", {"of": "ok", "status": 200, "problem": False}, context)
    assert not result.passed and "a 'odd' problem, expected none" in result.reason
    assert (await grade("status", {"of": "ok", "status": 200, "problem": True}, context)).passed
    context.values["plain"] = {"status": 404, "body": "nothing here"}
    plain = await grade("status", {"of": "plain", "status": 404, "problem": True}, context)
    assert not plain.passed and plain.reason == "plain: no problem, expected one"


# -- json_schema ------------------------------------------------------------------


async def test_json_schema_names_where_a_value_breaks_it(context: Context) -> None:
    context.values["race"] = {"statuses": {"201": 2, "409": 98}}
    schema = {"properties": {"201": {"const": 1}}}
    result = await grade("json_schema", {"of": "race.statuses", "schema": schema}, context)
    assert not result.passed
    assert result.reason == "race.statuses: 201: 1 was expected"
    context.values["race"]["statuses"]["201"] = 1
    assert (await grade("json_schema", {"of": "race.statuses", "schema": schema}, context)).passed


async def test_json_schema_reads_files_and_refuses_bad_ones(context: Context) -> None:
    (context.workdir / "doc.json").write_text('{"a": 1}')
    (context.workdir / "bad.json").write_text("{")
    schema = {"required": ["a"]}
    assert (await grade("json_schema", {"file": "doc.json", "schema": schema}, context)).passed
    bad = await grade("json_schema", {"file": "bad.json", "schema": schema}, context)
    assert not bad.passed and "not a readable JSON file" in bad.reason


# -- sha256 ---------------------------------------------------------------------


async def test_sha256_compares_a_files_bytes_with_a_digest(context: Context) -> None:
    (context.workdir / "blob").write_bytes(b"bytes")
    digest = hashlib.sha256(b"bytes").hexdigest()
    context.values["upload"] = {"sha256": digest}
    ok = await grade("sha256", {"file": "blob", "digest": "{upload.sha256}"}, context)
    assert ok.passed and ok.evidence["bytes"] == 5
    (context.workdir / "blob").write_bytes(b"bytez")
    changed = await grade("sha256", {"file": "blob", "digest": "{upload.sha256}"}, context)
    assert not changed.passed and changed.reason.startswith("blob: sha256 ")
    missing = await grade("sha256", {"file": "gone", "digest": digest}, context)
    assert not missing.passed and "cannot read" in missing.reason


# -- command ----------------------------------------------------------------------


async def test_command_checks_exit_and_output(context: Context) -> None:
    script = "import os, sys; print('chain system: first bad sequence 3'); sys.exit(1)"
    argv = [sys.executable, "-c", script]
    spec = {"argv": argv, "exit": 1, "output": "first bad sequence \\d+"}
    assert (await grade("command", spec, context)).passed
    wrong_exit = await grade("command", {"argv": argv}, context)
    assert not wrong_exit.passed
    assert "exit 1, expected 0: chain system: first bad sequence 3" in wrong_exit.reason
    leaked = await grade("command", {**spec, "not_output": "chain \\w+"}, context)
    assert not leaked.passed and "output has 'chain system'" in leaked.reason


async def test_command_runs_with_the_journeys_environment(context: Context) -> None:
    argv = [sys.executable, "-c", "import os; print(os.environ['BUILDMAX_GRADER_TEST'])"]
    result = await grade("command", {"argv": argv, "output": "^yes$"}, context)
    assert result.passed, result.reason


# -- db_rows and absent rows ------------------------------------------------------------


async def test_db_rows_counts_exactly(context: Context) -> None:
    spec = {"sql": "select count(*) from attempts where task = :t", "params": {"t": "t1"}}
    assert (await grade("db_rows", {**spec, "equals": 1}, context)).passed
    two = await grade("db_rows", {**spec, "equals": 2, "why": "attempts of t1"}, context)
    assert not two.passed and two.reason == "attempts of t1: 1, expected 2"


async def test_absent_row_fails_when_the_row_exists(context: Context) -> None:
    spec = {"kind": "row", "sql": "select count(*) from attempts where generation = 1"}
    result = await grade("absent", spec, context)
    assert not result.passed and result.reason.endswith(": 1, expected 0")


# -- audit --------------------------------------------------------------------------


async def test_audit_counts_matching_events_after_the_mark(context: Context) -> None:
    def event(seq: int, action: str, target: str) -> dict[str, Any]:
        return {"chain": "sp_1", "seq": seq, "action": action, "target": {"id": target}}

    context.events = [event(1, "task.claimed", "t1"), event(2, "task.claimed", "t1")]
    context.values.update(task="t1", mark={"sp_1": 1})
    spec = {"action": "task.claimed", "target": "{task}", "since": "mark"}
    assert (await grade("audit", spec, context)).passed
    everything = await grade("audit", {**spec, "since": None}, context)
    assert not everything.passed
    assert everything.reason == "task.claimed on t1: 2 event(s), expected 1"


# -- absent: files and logs ----------------------------------------------------------------


async def test_absent_file_outside_finds_strays_and_links(context: Context) -> None:
    target = context.workdir / "out" / "plugins"
    target.mkdir(parents=True)
    (target / "skill.md").write_text("ok")
    spec = {"kind": "file_outside", "root": "out", "directory": "out/plugins"}
    assert (await grade("absent", spec, context)).passed
    nowhere = await grade("absent", {**spec, "root": "gone"}, context)
    assert not nowhere.passed and nowhere.reason == "gone is not a directory"
    (context.workdir / "out" / "escaped.txt").write_text("no")
    stray = await grade("absent", spec, context)
    assert not stray.passed and stray.reason == "1 path(s) outside out/plugins: escaped.txt"
    (context.workdir / "out" / "escaped.txt").unlink()
    (target / "link").symlink_to("/etc/passwd")
    linked = await grade("absent", spec, context)
    assert not linked.passed and "plugins/link" in linked.reason


async def test_absent_secret_in_log_and_log_pattern(context: Context) -> None:
    context.minted = ["bmx_secret_token"]
    context.log = "started\nrequest with bmx_secret_token\nTraceback (most recent call last)\n"
    leaked = await grade("absent", {"kind": "secret_in_log"}, context)
    assert not leaked.passed and leaked.reason == "1 secret(s) appear in the server log"
    traceback = await grade("absent", {"kind": "log_pattern", "pattern": "Traceback"}, context)
    assert not traceback.passed and traceback.reason.startswith("server log line 3 matches")
    context.log = "clean"
    assert (await grade("absent", {"kind": "secret_in_log"}, context)).passed
    context.minted = []
    with pytest.raises(LookupError, match="no secret to look for"):
        await grade("absent", {"kind": "secret_in_log"}, context)


# -- specs refused at load ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "spec", "message"),
    [
        ("status", {"of": "x"}, "missing required key 'status'"),
        ("status", {"of": "x", "status": 42}, "must be an HTTP status code"),
        ("status", {"of": "x", "status": 200, "stauts": 1}, "unknown key(s) stauts"),
        ("json_schema", {"of": "x", "file": "y", "schema": {}}, "set exactly one of of, file"),
        ("json_schema", {"of": "x", "schema": {"type": "nope"}}, "the schema is invalid"),
        ("command", {"argv": "buildmax"}, "'argv' must be a non-empty list"),
        ("db_rows", {"sql": "delete from attempts", "equals": 0}, "'sql' must be a SELECT"),
        ("audit", {"action": "x", "count": "1"}, "'count' must be an integer"),
        ("absent", {"kind": "everything"}, "'kind' must be one of"),
    ],
)
def test_unusable_specs_are_refused(name: str, spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        BUILTIN_GRADERS[name](spec)


# -- placeholders --------------------------------------------------------------------------


def test_render_keeps_types_and_fills_keys() -> None:
    values = {"claim": {"body": {"generation": 2, "id": "at_1"}}, "space": {"slug": "s"}}
    assert render(values, "{claim.body.generation}") == 2
    assert render(values, "/attempts/{claim.body.id}") == "/attempts/at_1"
    assert render(values, {"{space.slug}": ["{claim.body.id}"]}) == {"s": ["at_1"]}
    assert render(values, '{"json": true}') == '{"json": true}'
    with pytest.raises(KeyError, match=r"no value at .claim\.body\.nope."):
        render(values, "{claim.body.nope}")


async def test_expected_values_and_patterns_take_placeholders(context: Context) -> None:
    context.values.update(expected={"count": 1, "word": "sequence 3"})
    spec = {"sql": "select count(*) from attempts", "equals": "{expected.count}"}
    assert (await grade("db_rows", spec, context)).passed
    context.values["expected"]["count"] = 2
    assert not (await grade("db_rows", spec, context)).passed
    argv = [sys.executable, "-c", "print('first bad sequence 3')"]
    found = await grade("command", {"argv": argv, "output": "{expected.word}$"}, context)
    assert found.passed, found.reason


async def test_db_state_redacts_secrets_before_cutting_long_values(tmp_path: Path) -> None:
    from buildmax_graders.evidence import DB_STATE_VALUE, Bundle, database_state

    from buildmax.database import open_database

    secret = "bmx_" + "s" * 40
    database = open_database(f"sqlite:///{tmp_path / 'state.db'}", sqlite_readers=1)
    await database.connect()
    try:
        async with database.write() as tx:
            await tx.execute(sa.text("create table receipts (body text, token_hash text)"))
            # The secret straddles the cut: a cut first would leave its start behind.
            body = "x" * (DB_STATE_VALUE - 10) + secret
            await tx.execute(sa.text("insert into receipts values (:body, 'h')"), {"body": body})
        state = await database_state(database, Bundle(tmp_path, secrets=[secret]).redact)
    finally:
        await database.close()
    (row,) = state["tables"]["receipts"]["rows"]
    assert "bmx_" not in row["body"] and "[redacted]" in row["body"]
    assert row["token_hash"] == "[redacted]"
    assert state["tables"]["receipts"]["count"] == 1


SLEEPER = "import os, time; open('pid', 'w').write(str(os.getpid())); time.sleep(60)"


async def test_a_command_overstaying_its_time_is_killed(context: Context) -> None:
    from buildmax_graders.process import run_command

    with pytest.raises(TimeoutError):
        await run_command([sys.executable, "-c", SLEEPER], cwd=context.workdir, seconds=1.5)
    pid = int((context.workdir / "pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped, not left running
    slow = await grade(
        "command", {"argv": [sys.executable, "-c", SLEEPER], "timeout": 1.5}, context
    )
    assert not slow.passed and slow.reason.endswith("still running after 1.5 s")
