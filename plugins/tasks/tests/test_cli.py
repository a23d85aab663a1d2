"""``buildmax project|task|attempt|hold|decision|agent`` against a live server.

Each command runs in a worker thread (the live server shares the test's
event loop); results are checked through the typed client, independently
of the command's own output.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click
import pytest
from buildmax_tasks.client import TasksClient
from buildmax_tasks.commands import SPACE_ENV
from click.testing import CliRunner, Result

from buildmax.cli import _register_commands, cli
from buildmax.client import TOKEN_ENV, URL_ENV, Client
from buildmax.testing import PrincipalHandle

T = TypeVar("T")


@pytest.fixture(scope="module")
def buildmax_cli() -> click.Group:
    """The root group with every command registered, the plugin's included."""
    _register_commands()
    return cli


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """No server, token or space from the outside; no login file."""
    for name in (URL_ENV, TOKEN_ENV, SPACE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


@dataclass
class Team:
    """A live server, a space with project ``shop``, its human owner and two
    agent members; commands run as one of them."""

    url: str
    space: str
    owner: PrincipalHandle
    agent: PrincipalHandle
    agent2: PrincipalHandle
    buildmax_cli: click.Group

    def run(self, who: PrincipalHandle | str, *args: str) -> Awaitable[Result]:
        """``buildmax ARGS --url ... --token ... --space ...`` as ``who`` (a
        principal or a raw token)."""
        token = who if isinstance(who, str) else who.token
        argv = [*args, "--url", self.url, "--token", token, "--space", self.space]
        return asyncio.to_thread(
            CliRunner().invoke, self.buildmax_cli, argv, catch_exceptions=False
        )

    def call(self, who: PrincipalHandle, scenario: Callable[[TasksClient], T]) -> Awaitable[T]:
        """Run ``scenario`` with a tasks client of ``who`` in a worker thread."""

        def work() -> T:
            with Client(self.url, who.token) as bmx:
                return scenario(TasksClient(bmx))

        return asyncio.to_thread(work)


@pytest.fixture
async def team(
    buildmax_cli: click.Group, live_server: str, make_principal: Any, make_space: Any
) -> Team:
    owner = await make_principal("human")
    agent = await make_principal("agent")
    agent2 = await make_principal("agent")
    space = await make_space(owner)
    found = Team(live_server, space.slug, owner, agent, agent2, buildmax_cli)

    def setup(tasks: TasksClient) -> None:
        for member in (agent, agent2):
            # By id: a space owner names by name only the principals it can see.
            tasks.client.put_member(space.slug, member.id, "member")
        tasks.create_project(space.slug, "shop")

    await found.call(owner, setup)
    return found


def ok(result: Result) -> Result:
    """``result``, after checking the command succeeded."""
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def record(result: Result) -> dict[str, str]:
    """The ``field  value`` lines of a shown record."""
    return dict(line.split(maxsplit=1) for line in ok(result).stdout.splitlines())


def table(result: Result) -> list[list[str]]:
    """A printed table's rows (header first), split on whitespace."""
    return [line.split() for line in ok(result).stdout.splitlines()]


async def test_a_task_goes_from_create_to_done(team: Team) -> None:
    created = await team.run(
        team.agent,
        "task",
        "create",
        "fix the login form",
        "--project",
        "shop",
        "--label",
        "web",
        "--criteria",
        "tests pass",
        "--json",
    )
    task = json.loads(ok(created).stdout)
    assert (task["state"], task["labels"], task["criteria"]) == ("ready", ["web"], "tests pass")

    ready = table(await team.run(team.agent, "task", "ready"))
    assert ready[0] == ["id", "state", "parked", "kind", "priority", "labels", "title"]
    assert ready[1][:6] == [task["id"], "ready", "False", "code", "0", "web"]

    claimed = await team.run(team.agent, "task", "claim", task["id"], "--lease", "300")
    fields = record(claimed)
    token = fields["token"]
    assert fields["task.id"] == task["id"] and fields["attempt.generation"] == "1"
    assert token.startswith("bmx_")
    assert (claimed.stdout + claimed.stderr).count(token) == 1
    assert "shown only this once" in claimed.stderr
    attempt = fields["attempt.id"]
    assert f"buildmax attempt renew {attempt} --generation 1" in claimed.stderr

    renewed = await team.run(
        token, "attempt", "renew", attempt, "--generation", "1", "--progress", '{"step": 1}'
    )
    assert record(renewed)["progress"] == '{"step":1}'
    checkpoint = await team.run(
        token, "attempt", "checkpoint", attempt, "half way", "--generation", "1"
    )
    assert record(checkpoint)["number"] == "1"
    submitted = await team.run(
        token,
        "attempt",
        "submit",
        attempt,
        "--generation",
        "1",
        "--summary",
        "fixed it",
        "--candidate",
        '{"commit": "3f2a9c1", "branch": "fix-login"}',
        "--json",
    )
    body = json.loads(ok(submitted).stdout)
    assert (body["task"]["state"], body["stage"]) == ("done", None)

    attempts = table(await team.run(team.agent, "task", "attempts", task["id"]))
    assert attempts[1][:3] == [attempt, "1", "submitted"]
    submissions = await team.call(
        team.agent, lambda tasks: tasks.list_submissions(team.space, task["id"])
    )
    assert submissions[0]["candidate"] == {"commit": "3f2a9c1", "branch": "fix-login"}
    assert submissions[0]["summary"] == "fixed it"


async def test_decision_ask_list_and_answer(team: Team) -> None:
    task = await team.call(team.agent, lambda tasks: tasks.create_task(team.space, "shop", "ie"))
    asked = await team.run(
        team.agent, "decision", "ask", task["id"], "Drop IE11?", "--option", "yes", "--option", "no"
    )
    decision = record(asked)["id"]
    shown = record(await team.run(team.agent, "task", "show", task["id"]))
    assert (shown["parked"], shown["pending_decisions"]) == ("True", decision)

    listed = table(await team.run(team.owner, "decision", "list"))
    assert listed[0] == ["id", "task_id", "state", "options", "answer", "question"]
    assert listed[1] == [decision, task["id"], "pending", "yes,", "no", "-", "Drop", "IE11?"]
    as_json = json.loads(ok(await team.run(team.owner, "decision", "list", "--json")).stdout)
    assert [(d["id"], d["options"]) for d in as_json] == [(decision, ["yes", "no"])]

    refused = await team.run(team.agent, "decision", "answer", decision, "yes")
    assert refused.exit_code == 1
    assert refused.stderr == "error: 403 forbidden: this decision needs a human's answer\n"

    answered = await team.run(
        team.owner, "decision", "answer", decision, "yes", "--comment", "few users"
    )
    assert record(answered)["state"] == "answered"
    assert table(await team.run(team.owner, "decision", "list")) == [listed[0]]
    answered_list = await team.run(team.owner, "decision", "list", "--state", "answered", "--json")
    assert [d["answer"] for d in json.loads(ok(answered_list).stdout)] == ["yes"]
    after = await team.call(team.agent, lambda tasks: tasks.get_task(team.space, task["id"]))
    assert after["parked"] is False


async def test_a_refused_claim_prints_the_problem_and_exits_1(team: Team) -> None:
    task = await team.call(team.agent, lambda tasks: tasks.create_task(team.space, "shop", "t"))
    placed = await team.run(team.owner, "hold", "place", "stopped", "--reason", "deploy freeze")
    hold = record(placed)
    assert (hold["strength"], hold["scope.type"]) == ("stopped", "space")

    refused = await team.run(team.agent, "task", "claim", task["id"])
    assert refused.exit_code == 1
    assert refused.stdout == ""
    assert refused.stderr == (
        "error: 403 task-held: a stopped hold on the space refuses claims: deploy freeze "
        f"(hold {hold['id']})\n"
    )
    listed = table(await team.run(team.agent, "hold", "list"))
    assert [row[0] for row in listed[1:]] == [hold["id"]]

    lifted = await team.run(team.owner, "hold", "lift", hold["id"])
    assert record(lifted)["lifted_at"] != "-"
    assert table(await team.run(team.agent, "hold", "list")) == [listed[0]]
    attempt = record(await team.run(team.agent, "task", "claim", task["id"]))["attempt.id"]

    taken = await team.run(team.agent2, "task", "claim", task["id"])
    assert taken.exit_code == 1
    assert taken.stderr.startswith(
        f"error: 409 task-claimed: another attempt holds this task (attempt {attempt} of "
        f"{team.agent.id}, lease until "
    )
    stale = await team.run(team.agent, "attempt", "renew", attempt, "--generation", "7")
    assert stale.exit_code == 1
    assert stale.stderr == "error: 409 stale-generation: generation 7 is not this attempt's (1)\n"


async def test_projects_and_their_policies(team: Team) -> None:
    created = await team.run(
        team.owner,
        "project",
        "create",
        "web-ui",
        "--repository-url",
        "https://git.example/web.git",
        "--target-branch",
        "main",
    )
    project = record(created)
    assert (project["name"], project["policy.revision"]) == ("web-ui", "0")
    listed = table(await team.run(team.agent, "project", "list"))
    assert [row[1] for row in listed[1:]] == ["shop", "web-ui"]

    changed = await team.run(
        team.owner, "project", "policy", "web-ui", "--approvals", "2", "--human-review"
    )
    assert record(changed)["approvals_required"] == "2"
    again = await team.run(team.owner, "project", "policy", "web-ui", "--integration", "human")
    policy = record(again)
    assert (policy["revision"], policy["approvals_required"], policy["integration"]) == (
        "2",
        "2",
        "human",
    )
    history = table(await team.run(team.agent, "project", "policy", "web-ui"))
    assert [row[:4] for row in history[1:]] == [
        ["2", "2", "True", "human"],
        ["1", "2", "True", "automatic"],
    ]
    shown = record(await team.run(team.agent, "project", "show", project["id"]))
    assert (shown["policy.revision"], shown["target_branch"]) == ("2", "main")
    denied = await team.run(team.agent, "project", "policy", "web-ui", "--approvals", "0")
    assert denied.exit_code == 1 and denied.stderr.startswith("error: 403 forbidden: ")


async def test_agents_are_created_revised_and_shown(team: Team) -> None:
    created = await team.run(
        team.owner, "agent", "create", "coder", "--instructions", "write code", "--plugin", "git"
    )
    agent = record(created)
    assert (agent["revision.number"], agent["revision.plugins"]) == ("1", "git")
    revised = await team.run(team.owner, "agent", "revise", "coder", "--plugin", "lint")
    assert record(revised)["revision.instructions"] == "write code"
    cleared = await team.run(
        team.owner, "agent", "revise", agent["id"], "--instructions", "be careful", "--no-plugins"
    )
    assert (record(cleared)["revision.number"], record(cleared)["revision.plugins"]) == ("3", "-")

    listed = table(await team.run(team.agent, "agent", "list"))
    assert listed[1] == [agent["id"], "coder", "3", "-"]
    revisions = table(await team.run(team.agent, "agent", "show", "coder", "--revisions"))
    assert [(row[1], row[2]) for row in revisions[1:]] == [("3", "-"), ("2", "lint"), ("1", "git")]
    shown = json.loads(ok(await team.run(team.agent, "agent", "show", "coder", "--json")).stdout)
    assert shown["revision"]["instructions"] == "be careful"
    nothing = await team.run(team.owner, "agent", "revise", "coder")
    assert nothing.exit_code == 2 and "nothing to change" in nothing.stderr


async def test_edits_dependencies_and_the_ways_work_ends(team: Team) -> None:
    first = record(await team.run(team.agent, "task", "create", "schema", "--project", "shop"))
    second = record(
        await team.run(
            team.agent,
            "task",
            "create",
            "migration",
            "--project",
            "shop",
            "--depends-on",
            first["id"],
        )
    )
    assert second["state"] == "open"
    undepended = await team.run(team.agent, "task", "undepend", second["id"], first["id"])
    assert ok(undepended).stdout == f"{second['id']} no longer waits for {first['id']}.\n"
    depended = table(await team.run(team.agent, "task", "depend", second["id"], first["id"]))
    assert depended[1][:2] == [first["id"], "ready"]
    cycle = await team.run(team.agent, "task", "depend", first["id"], second["id"])
    assert cycle.exit_code == 1 and cycle.stderr.startswith("error: 409 dependency-cycle: ")

    edited = record(
        await team.run(
            team.agent, "task", "edit", first["id"], "--title", "tables", "--priority", "5"
        )
    )
    assert (edited["title"], edited["priority"], edited["revision"]) == ("tables", "5", "2")
    stale = await team.run(
        team.agent, "task", "edit", first["id"], "--title", "x", "--expected-revision", "1"
    )
    assert stale.exit_code == 1 and stale.stderr.startswith("error: 409 revision-conflict: ")
    found = table(
        await team.run(team.agent, "task", "list", "--state", "ready", "--search", "table")
    )
    assert found[0][-1] == "match"
    assert [(row[0], row[-1]) for row in found[1:]] == [(first["id"], "[tables]")]
    refused = await team.run(team.agent, "task", "list", "--search", '""')
    assert refused.exit_code == 1 and refused.stderr.startswith("error: 422 validation-error: ")

    claim = await team.run(team.agent, "task", "claim-next", "--project", "shop", "--json")
    attempt = json.loads(ok(claim).stdout)["attempt"]
    assert "shown only this once" in claim.stderr
    released = await team.run(team.agent, "attempt", "release", attempt["id"], "--generation", "1")
    assert record(released)["state"] == "released"
    attempt = json.loads(
        ok(await team.run(team.agent, "task", "claim", first["id"], "--json")).stdout
    )["attempt"]
    failed = await team.run(
        team.agent, "attempt", "fail", attempt["id"], "--generation", "2", "--reason", "broke"
    )
    assert record(failed)["end_reason"] == "broke"
    attempt = record(await team.run(team.agent, "task", "claim", first["id"]))
    canceled = await team.run(
        team.owner,
        "attempt",
        "cancel",
        attempt["attempt.id"],
        "--generation",
        "3",
        "--reason",
        "wrong approach",
        "--override-reason",
        "reassigning",
    )
    assert record(canceled)["state"] == "canceled"

    cancel = await team.run(team.agent, "task", "cancel", first["id"], "--reason", "duplicate")
    assert record(cancel)["state"] == "canceled"
    assert ok(await team.run(team.agent, "task", "claim-next")).stdout == (
        "Nothing to claim (0 passed over).\n"
    )
    retried = await team.run(team.owner, "task", "retry", first["id"])
    assert (record(retried)["state"], record(retried)["attempts_used"]) == ("ready", "0")


async def test_the_space_comes_from_the_option_or_the_environment(
    team: Team, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["project", "list", "--url", team.url, "--token", team.agent.token]
    runner = CliRunner()
    missing = await asyncio.to_thread(runner.invoke, team.buildmax_cli, argv)
    assert missing.exit_code == 2
    assert "Missing option '--space'" in missing.stderr
    monkeypatch.setenv(SPACE_ENV, team.space)
    listed = await asyncio.to_thread(runner.invoke, team.buildmax_cli, [*argv, "--json"])
    assert [p["name"] for p in json.loads(ok(listed).stdout)] == ["shop"]


@pytest.mark.engine_independent
async def test_help_explains_the_commands_with_examples(buildmax_cli: click.Group) -> None:
    runner = CliRunner()
    top = runner.invoke(buildmax_cli, ["--help"])
    for name in ("project", "task", "attempt", "hold", "decision", "agent"):
        assert f"\n  {name} " in top.stdout
    claim = runner.invoke(buildmax_cli, ["task", "claim-next", "--help"])
    assert "buildmax task claim-next --project shop" in claim.stdout
    for option in ("--space SPACE", "$BUILDMAX_SPACE", "--url URL", "--token TOKEN", "--json"):
        assert option in claim.stdout
    submit = runner.invoke(buildmax_cli, ["attempt", "submit", "--help"])
    assert "--generation INTEGER" in submit.stdout and "--candidate JSON" in submit.stdout
