"""``buildmax qualify`` end to end: real server processes on the engine
under test, journeys from a scratch directory, bundles read back from disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

import buildmax
from buildmax.testing import TEST_DATABASE_ENV

QUALIFY = (sys.executable, "-m", "buildmax", "qualify")
#: The runner's own logic does not depend on the engine: most tests run it once, on SQLite.
SQLITE = "sqlite"
NOWHERE = "postgresql://postgres@127.0.0.1:9/postgres"


@pytest.fixture
def engine(buildmax_engine: str) -> str:
    return "postgres" if buildmax_engine == "postgresql" else "sqlite"


def qualify(tmp_path: Path, engine: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the command outside any git checkout (commit ``unknown``)."""
    pg_url = os.environ.get(TEST_DATABASE_ENV, "postgresql://postgres@127.0.0.1:5432/postgres")
    return subprocess.run(
        [
            *QUALIFY,
            "--journeys",
            "journeys",
            "--output",
            "out",
            "--engine",
            engine,
            "--pg-url",
            pg_url,
            *args,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )


def write(tmp_path: Path, name: str, text: str) -> None:
    directory = tmp_path / "journeys"
    directory.mkdir(exist_ok=True)
    (directory / name).write_text(text)


def bundle(tmp_path: Path, engine: str, journey: str) -> Path:
    return tmp_path / "out" / "unknown" / engine / journey


def read(path: Path) -> Any:
    return json.loads(path.read_text())


PASSING = """
id = "J90"
title = "a principal reads itself"

[[arrange]]
step = "principal"
name = "ada-{run.id}"
save = "ada"

[[act]]
step = "request"
save = "me"
as = "ada"
path = "/v1/principals/me"
expect = 200

[[check]]
step = "response"
grader = "status"
name = "the principal reads itself"
of = "me"
status = 200

[[check]]
step = "durable"
grader = "db_rows"
sql = "select count(*) from principals where name = :name"
params = { name = "{ada.name}" }
equals = 1

[[check]]
step = "audit"
grader = "audit"
action = "principal.created"
target = "{ada.id}"

[[check]]
step = "forbidden"
grader = "absent"
kind = "secret_in_log"
"""


async def test_a_passing_journey_leaves_a_complete_redacted_bundle(
    tmp_path: Path, engine: str
) -> None:
    write(tmp_path, "J90.toml", PASSING)
    done = qualify(tmp_path, engine)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"J90      {engine}" in done.stdout and "4 checks passed" in done.stdout

    directory = bundle(tmp_path, engine, "J90")
    manifest = read(directory / "manifest.json")
    assert manifest["status"] == "passed" and manifest["classification"] is None
    assert manifest["commit"] == "unknown" and manifest["dirty"] is None
    assert manifest["engine"] == engine
    assert manifest["server"]["version"] == buildmax.__version__
    assert manifest["server"]["processes"] == 1
    label = "SQLite " if engine == "sqlite" else "PostgreSQL "
    assert manifest["server"]["database"].startswith(label)
    assert manifest["environment"]["python"] == ".".join(map(str, sys.version_info[:3]))
    assert "buildmax-graders" in manifest["packages"]
    assert manifest["started_at"] <= manifest["ended_at"]
    assert manifest["faults_injected"] == []
    assert set(manifest["files"].values()) == {"present"}
    for name in manifest["files"]:
        assert (directory / name).stat().st_size > 0, name

    result = read(directory / "result.json")
    assert [c["outcome"] for c in result["checks"]] == ["passed"] * 4
    assert result["checks"][1]["evidence"]["value"] == 1
    suite = ET.parse(directory / "junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "4" and suite.get("failures") == "0"

    log = (directory / "server.log").read_text()
    assert "A first admin was created" in log and "[redacted]" in log
    assert "bmx_" not in log, "the bootstrap token reached the bundle"
    state = read(directory / "db-state.json")["tables"]
    assert state["principals"]["count"] == 2
    assert all(row["verifier"] == "[redacted]" for row in state["tokens"]["rows"])
    events = [json.loads(line) for line in (directory / "audit.jsonl").read_text().splitlines()]
    assert {"admin.bootstrapped", "principal.created"} <= {e.get("action") for e in events}
    summary = read(tmp_path / "out" / "unknown" / "summary.json")
    assert [o["status"] for o in summary["outcomes"]] == ["passed"]


@pytest.mark.engine_independent
def test_failures_not_applicable_and_not_built_are_told_apart(tmp_path: Path) -> None:
    other = "postgres"
    write(
        tmp_path,
        "J91.toml",
        PASSING.replace("J90", "J91").replace("status = 200\n", "status = 404\n", 1),
    )
    write(tmp_path, "J92.toml", PASSING.replace('id = "J90"', f'id = "J92"\nengines = ["{other}"]'))
    write(tmp_path, "J93.toml", 'id = "J93"\ntitle = "t"\nstatus = "not built"\nreason = "later"\n')
    write(tmp_path, "J94.toml", 'id = "J94"\ntitle = "t"\nsurprise = 1\n')
    # A step that crashes (no principal "ghost") and a check that fails:
    # a harness failure whose reason also names the failing check.
    crashing = PASSING.replace("J90", "J97").replace('as = "ada"', 'as = "ghost"')
    write(tmp_path, "J97.toml", crashing.replace("equals = 1", "equals = 7"))
    done = qualify(tmp_path, SQLITE)
    assert done.returncode == 1, done.stdout + done.stderr

    statuses = {
        o["journey"]: (o["status"], o["classification"])
        for o in read(tmp_path / "out" / "unknown" / "summary.json")["outcomes"]
    }
    assert statuses == {
        "J91": ("failed", "product"),
        "J92": ("not applicable", None),
        "J93": ("not built", None),
        "J94": ("failed", "harness"),
        "J97": ("failed", "harness"),
    }
    crashed = read(bundle(tmp_path, SQLITE, "J97") / "result.json")
    assert crashed["reason"].startswith("act[0] request: me: KeyError: \"no value at 'ghost'\"")
    assert "; first failing check: check[1] db_rows: " in crashed["reason"]
    assert crashed["reason"].endswith(": 1, expected 7")
    # Every failure shows in JUnit, also one with no failing check.
    for journey in ("J91", "J94", "J97"):
        suite = ET.parse(bundle(tmp_path, SQLITE, journey) / "junit.xml").getroot()[0]
        assert int(suite.get("failures", 0)) + int(suite.get("errors", 0)) >= 1, journey
    failed = read(bundle(tmp_path, SQLITE, "J91") / "manifest.json")
    assert failed["reason"] == "check[0] status: me: status 200, expected 404"
    assert "[product] check[0] status: me: status 200, expected 404" in done.stdout
    skipped = read(bundle(tmp_path, SQLITE, "J92") / "manifest.json")
    assert skipped["reason"] == f"declared for {other} only"
    assert skipped["files"]["server.log"].startswith("not applicable")
    assert not (bundle(tmp_path, SQLITE, "J92") / "server.log").exists()
    unreadable = read(bundle(tmp_path, SQLITE, "J94") / "manifest.json")
    assert unreadable["reason"] == "J94.toml: unknown key(s) surprise"


@pytest.mark.engine_independent
def test_a_step_failure_stops_the_steps_and_names_the_step(tmp_path: Path) -> None:
    write(
        tmp_path,
        "J95.toml",
        PASSING.replace("J90", "J95").replace('path = "/v1/principals/me"', 'path = "/v1/nowhere"'),
    )
    done = qualify(tmp_path, SQLITE)
    assert done.returncode == 1
    result = read(bundle(tmp_path, SQLITE, "J95") / "result.json")
    assert result["classification"] == "product"
    assert result["reason"].startswith("act[0] request: me: GET /v1/nowhere: status 404")
    # The checks still run: those on values the failed step never saved are
    # harness errors, the rest report what they saw.
    assert [c["outcome"] for c in result["checks"]] == ["error", "passed", "passed", "passed"]
    assert result["checks"][0]["reason"].startswith("KeyError: \"no value at 'me'\"")


FAULTS = """
id = "J96"
title = "faults are injected where recorded"

[[arrange]]
step = "space"
save = "space"
slug = "f-{run.id}"

[[act]]
step = "drop_answer"
save = "dropped"
as = "admin"
method = "POST"
path = "/v1/spaces"
json = { slug = "g-{run.id}" }
idempotency_key = "k-{run.id}"

[[act]]
step = "request"
save = "replay"
as = "admin"
method = "POST"
path = "/v1/spaces"
json = { slug = "g-{run.id}" }
idempotency_key = "k-{run.id}"
kill_after = true

[[act]]
step = "start_server"

[[check]]
step = "response"
grader = "status"
of = "replay"
status = 201

[[check]]
step = "durable"
grader = "db_rows"
sql = "select count(*) from spaces where slug = :slug"
params = { slug = "g-{run.id}" }
equals = 1

[[check]]
step = "audit"
grader = "audit"
action = "space.created"
target = "{replay.body.id}"

[[check]]
step = "forbidden"
grader = "absent"
kind = "log_pattern"
pattern = "Traceback"
"""


@pytest.mark.engine_independent
def test_injected_faults_are_recorded_with_their_points(tmp_path: Path) -> None:
    write(tmp_path, "J96.toml", FAULTS)
    done = qualify(tmp_path, SQLITE)
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = read(bundle(tmp_path, SQLITE, "J96") / "manifest.json")
    faults = [(f["fault"], f["step"]) for f in manifest["faults_injected"]]
    assert faults == [
        ("dropped-answer", "act[0] drop_answer: dropped"),
        ("server-killed", "act[1] request: replay"),
    ]
    assert (
        "right after the answer to POST v1/spaces arrived (status 201)"
        in (manifest["faults_injected"][1]["injection_point"])
    )
    assert manifest["server"]["starts"] == [2]
    log = (bundle(tmp_path, SQLITE, "J96") / "server.log").read_text()
    assert "--- server 0 killed (SIGKILL) ---" in log and "--- start 2 of server 0 ---" in log


MCP_CALLS = """
id = "J86"
title = "tool calls through the MCP SDK's client, as principals of a space"

[[arrange]]
step = "space"
save = "space"
slug = "m-{run.id}"

[[arrange]]
step = "principal"
name = "ada"
spaces = { "{space.slug}" = "member" }

[[arrange]]
step = "principal"
name = "vic"
spaces = { "{space.slug}" = "viewer" }

[[arrange]]
step = "request"
save = "project"
as = "admin"
method = "POST"
path = "/v1/spaces/{space.slug}/projects"
json = { name = "app", repository_url = "https://git.test/app.git", target_branch = "main" }
expect = 201

[[arrange]]
step = "request"
save = "task"
as = "admin"
method = "POST"
path = "/v1/spaces/{space.slug}/tasks"
json = { project = "{project.body.id}", title = "t" }
expect = 201

[[act]]
step = "mcp"
save = "refused"
as = "vic"
tool = "claim_next"
arguments = { space = "{space.slug}" }
expect = "forbidden"

[[act]]
step = "mcp"
save = "claimed"
as = "ada"
tool = "claim_task"
arguments = { space = "{space.slug}", task = "{task.body.id}" }
expect = "ok"

[[check]]
step = "response"
grader = "status"
of = "refused"
status = 403
problem = "forbidden"

[[check]]
step = "response"
grader = "json_schema"
of = "claimed"
[check.schema]
required = ["tool", "error", "status", "problem", "body"]
properties.tool.const = "claim_task"
properties.error.const = false
properties.status.type = "null"
properties.problem.type = "null"
properties.body.properties.task.properties.id.const = "{task.body.id}"

[[check]]
step = "response"
grader = "json_schema"
of = "claimed.body.token"
schema = { type = "string", pattern = "^bmx_" }

[[check]]
step = "durable"
grader = "db_rows"
sql = "select count(*) from task_attempts, principals p where p.id = claimant_id and p.name = 'ada'"
equals = 1

[[check]]
step = "audit"
grader = "audit"
action = "task.claimed"
target = "{task.body.id}"

[[check]]
step = "forbidden"
grader = "absent"
kind = "secret_in_log"
"""


@pytest.mark.engine_independent
def test_an_mcp_step_calls_a_tool_through_the_sdk_as_a_principal(tmp_path: Path) -> None:
    """A refusal is saved as its problem (the status grader reads it like
    an HTTP answer), a success as the route's answer; the attempt token a
    claim mints through a tool is a secret the bundle redacts."""
    write(tmp_path, "J86.toml", MCP_CALLS)
    done = qualify(tmp_path, SQLITE)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 checks passed" in done.stdout
    directory = bundle(tmp_path, SQLITE, "J86")
    result = read(directory / "result.json")
    assert [s["outcome"] for s in result["steps"]][-2:] == ["ok", "ok"]
    refused = result["checks"][0]["evidence"]
    assert (refused["status"], refused["problem"]) == (403, "forbidden")
    assert result["checks"][2]["evidence"]["value"] == "[redacted]"
    assert result["checks"][5]["reason"].startswith("none of 3 secret(s)")
    assert "bmx_" not in (directory / "result.json").read_text()
    # The SDK's client logs a line per request; the runner keeps them out of its output.
    assert "httpx2" not in done.stdout + done.stderr


@pytest.mark.engine_independent
def test_an_mcp_step_that_hears_the_unexpected_fails_naming_the_call(tmp_path: Path) -> None:
    """A refusal where success was expected, a success where a problem
    was, and an endpoint that answers no MCP (no token: 401) each fail the
    step as the product's fault, saying what came back."""
    refusal = MCP_CALLS.replace("J86", "J85").replace('expect = "forbidden"', 'expect = "ok"')
    success = MCP_CALLS.replace("J86", "J84").replace('expect = "ok"', 'expect = "claim-vetoed"')
    anonymous = MCP_CALLS.replace("J86", "J83").replace('as = "vic"', 'as = "anonymous"')
    for text in (refusal, success, anonymous):
        write(tmp_path, text.split('"', 2)[1] + ".toml", text)
    done = qualify(tmp_path, SQLITE)
    assert done.returncode == 1, done.stdout + done.stderr
    reasons = {
        journey: read(bundle(tmp_path, SQLITE, journey) / "result.json")
        for journey in ("J85", "J84", "J83")
    }
    assert {r["classification"] for r in reasons.values()} == {"product"}
    assert reasons["J85"]["reason"].startswith(
        "act[0] mcp: refused: claim_next as vic: refused (forbidden (403): "
        "this needs the member role in the space), expected success"
    )
    assert reasons["J84"]["reason"].startswith(
        "act[1] mcp: claimed: claim_task as ada: succeeded, expected the problem 'claim-vetoed'"
    )
    assert reasons["J83"]["reason"].startswith(
        "act[0] mcp: refused: claim_next as anonymous: POST /mcp answered 401: send an API token"
    )


@pytest.mark.engine_independent
def test_an_unreachable_database_is_an_infrastructure_failure(tmp_path: Path) -> None:
    write(tmp_path, "J90.toml", PASSING)
    done = subprocess.run(
        [
            *QUALIFY,
            "--journeys",
            "journeys",
            "--output",
            "out",
            "--engine",
            "postgres",
            "--pg-url",
            NOWHERE,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    manifest = read(bundle(tmp_path, "postgres", "J90") / "manifest.json")
    assert manifest["classification"] == "infrastructure"
    assert "PostgreSQL: cannot reach PostgreSQL" in manifest["reason"]


@pytest.mark.engine_independent
def test_unknown_journey_ids_and_missing_directories_are_usage_errors(tmp_path: Path) -> None:
    write(tmp_path, "J90.toml", PASSING)
    unknown = qualify(tmp_path, "sqlite", "--journey", "J42")
    assert unknown.returncode == 2 and "no journey J42 (known: J90)" in unknown.stderr
    missing = subprocess.run(
        [*QUALIFY, "--journeys", "nowhere"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and "nowhere is not a directory" in missing.stderr
    listed = qualify(tmp_path, "sqlite", "--list")
    assert listed.returncode == 0 and listed.stdout.startswith("J90   written")
    assert not (tmp_path / "out").exists()


CHAOS = '''
import os
import signal


async def kill_quietly(run):
    """A crash nobody asked for: no fault is recorded."""
    server = run.deployment.servers[0]
    os.killpg(server.process.pid, signal.SIGKILL)
    server.process.wait()
'''


@pytest.mark.engine_independent
def test_a_server_that_dies_uninvited_fails_the_journey(tmp_path: Path) -> None:
    (tmp_path / "steps").mkdir()
    (tmp_path / "steps" / "chaos.py").write_text(CHAOS)
    dying = PASSING.replace("J90", "J98").replace(
        "[[check]]", '[[act]]\nstep = "python"\ncall = "chaos:kill_quietly"\n\n[[check]]', 1
    )
    write(tmp_path, "J98.toml", dying)
    done = qualify(tmp_path, SQLITE)
    assert done.returncode == 1
    manifest = read(bundle(tmp_path, SQLITE, "J98") / "manifest.json")
    assert manifest["classification"] == "product"
    assert manifest["reason"] == (
        "server 0 exited with status -9 during the journey without the journey stopping it"
    )
    assert manifest["server"]["exit_statuses"] == [-9] and manifest["faults_injected"] == []
    # Every check passed; JUnit still shows the journey failed.
    suite = ET.parse(bundle(tmp_path, SQLITE, "J98") / "junit.xml").getroot()[0]
    assert suite.get("failures") == "1"
    assert suite.findall("testcase")[-1].get("name") == "journey"


@pytest.mark.engine_independent
def test_a_server_that_will_not_start_in_a_step_is_infrastructure(tmp_path: Path) -> None:
    broken = (
        PASSING.replace('id = "J90"', 'id = "J89"')
        .replace(
            'title = "a principal reads itself"\n',
            'title = "t"\n\n[server]\nstart = false\nsettings = { log_level = "loudest" }\n',
        )
        .replace("[[arrange]]", '[[arrange]]\nstep = "start_server"\n\n[[arrange]]', 1)
    )
    write(tmp_path, "J89.toml", broken)
    done = qualify(tmp_path, SQLITE)
    assert done.returncode == 1
    manifest = read(bundle(tmp_path, SQLITE, "J89") / "manifest.json")
    assert manifest["classification"] == "infrastructure"
    assert manifest["reason"].startswith(
        "arrange[0] start_server: server 0 exited with status 1 before it was ready"
    )


@pytest.mark.engine_independent
def test_a_journey_out_of_time_is_a_failure_junit_shows(tmp_path: Path) -> None:
    slow = PASSING.replace('id = "J90"', 'id = "J99"\ntimeout = 3').replace(
        "[[act]]", '[[act]]\nstep = "sleep"\nseconds = 60\n\n[[act]]', 1
    )
    write(tmp_path, "J99.toml", slow)
    done = qualify(tmp_path, SQLITE)
    assert done.returncode == 1
    result = read(bundle(tmp_path, SQLITE, "J99") / "result.json")
    assert result["classification"] == "product"
    assert result["reason"] == "act[0] sleep: no end after 3 s"
    assert result["steps"][1] == {
        "step": "act[0] sleep",
        "outcome": "failed",
        "error": "act[0] sleep: no end after 3 s",
    }
    suite = ET.parse(bundle(tmp_path, SQLITE, "J99") / "junit.xml").getroot()[0]
    assert suite.get("errors") == "1"


@pytest.mark.engine_independent
def test_a_second_file_with_a_taken_id_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "J90.toml", PASSING)
    write(tmp_path, "J91.toml", PASSING)
    listed = qualify(tmp_path, "sqlite", "--list")
    assert "J91   UNREADABLE  id J90 is taken by J90.toml" in listed.stdout


@pytest.mark.engine_independent
def test_sigterm_stops_the_servers_and_keeps_the_finished_summary(tmp_path: Path) -> None:
    slow = PASSING.replace('id = "J90"', 'id = "J88"').replace(
        "[[act]]", '[[act]]\nstep = "sleep"\nseconds = 120\n\n[[act]]', 1
    )
    write(tmp_path, "J88.toml", slow)
    write(tmp_path, "J87.toml", PASSING.replace('id = "J90"', 'id = "J87"'))
    runner = subprocess.Popen(
        [*QUALIFY, "--journeys", "journeys", "--output", "out", "--engine", SQLITE],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    servers = ["pgrep", "-f", "bmq-J88-sqlite"]
    deadline = time.monotonic() + 120
    while subprocess.run(servers, capture_output=True).returncode != 0:
        assert time.monotonic() < deadline, "the journey's server never started"
        time.sleep(0.2)
    time.sleep(2)  # inside the sleep step
    runner.send_signal(signal.SIGTERM)
    out, err = runner.communicate(timeout=60)
    assert runner.returncode == 1, out + err
    assert "interrupted after 1 of 2 journey runs" in err
    assert subprocess.run(servers, capture_output=True).returncode == 1, "a server outlived the run"
    summary = read(tmp_path / "out" / "unknown" / "summary.json")
    assert summary["interrupted"] is True
    assert [o["journey"] for o in summary["outcomes"]] == ["J87"]
    assert not bundle(tmp_path, SQLITE, "J88").exists()


@pytest.mark.postgres_only
async def test_a_refused_create_database_is_a_database_error() -> None:
    from buildmax.database import DatabaseError, servers

    with pytest.raises(DatabaseError, match=r"CREATE DATABASE .* TEMPLATE .*bmq_no_such"):
        await servers.create_database(
            os.environ[TEST_DATABASE_ENV], "bmq_never_made", template="bmq_no_such_template"
        )
