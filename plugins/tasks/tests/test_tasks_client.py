"""``buildmax_tasks.client``: every tasks route through the typed client,
over real HTTP.

The sync client runs in a worker thread because the live server shares the
test's event loop; each scenario is checked through the client itself.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from buildmax_tasks import problems
from buildmax_tasks.client import (
    ERRORS,
    AsyncTasksClient,
    AttemptEnded,
    DependencyCycle,
    InvalidState,
    NameTaken,
    RevisionConflict,
    StaleGeneration,
    TaskClaimed,
    TaskHeld,
    TaskNotClaimable,
    TaskParked,
    TasksClient,
)

from buildmax.client import (
    AsyncClient,
    Client,
    Conflict,
    Forbidden,
    NotFound,
    TokenScopeRefused,
    ValidationError,
)
from buildmax.testing import PrincipalHandle

T = TypeVar("T")


@dataclass
class Team:
    """A live server, a space, its human owner and two agent members."""

    url: str
    space: str
    owner: PrincipalHandle
    agent: PrincipalHandle
    agent2: PrincipalHandle

    def run(self, who: PrincipalHandle | str, scenario: Callable[[TasksClient], T]) -> Awaitable[T]:
        """Run ``scenario`` with a tasks client of ``who`` (a principal or a
        raw token) in a worker thread."""
        token = who if isinstance(who, str) else who.token

        def work() -> T:
            with Client(self.url, token, backoff=0) as bmx:
                return scenario(TasksClient(bmx))

        return asyncio.to_thread(work)


@pytest.fixture
async def team(live_server: str, make_principal: Any, make_space: Any) -> Team:
    owner = await make_principal("human")
    agent = await make_principal("agent")
    agent2 = await make_principal("agent")
    space = await make_space(owner)
    found = Team(live_server, space.slug, owner, agent, agent2)

    def setup(tasks: TasksClient) -> None:
        for member in (agent, agent2):
            tasks.client.put_member(space.slug, member.id, "member")
        tasks.create_project(space.slug, "shop")

    await found.run(owner, setup)
    return found


# -- the typed errors ---------------------------------------------------------------


@pytest.mark.engine_independent
def test_every_problem_of_the_plugin_has_a_typed_exception_of_its_status() -> None:
    slugs = {
        kind.slug: kind.status
        for kind in vars(problems).values()
        if inspect.isclass(kind) and kind.__module__ == problems.__name__
    }
    assert {kind.answers.slug for kind in ERRORS if kind.answers} == set(slugs)
    base = {403: Forbidden, 409: Conflict, 422: ValidationError}
    with Client(url="http://127.0.0.1:9", token="t") as bare:
        tasks = TasksClient(bare)
        for kind in ERRORS:
            slug = kind.answers.slug  # type: ignore[union-attr]
            assert tasks.client.errors.error_class(slugs[slug], slug) is kind
            assert issubclass(kind, base[slugs[slug]]), slug
            assert kind.__doc__.startswith(f"{slugs[slug]} ``{slug}``: "), kind.__doc__


@pytest.mark.engine_independent
def test_the_typed_exceptions_belong_to_the_client_that_a_tasks_client_wraps() -> None:
    with (
        Client(url="http://127.0.0.1:9", token="t") as wrapped,
        Client(url="http://127.0.0.1:9", token="t") as bare,
    ):
        TasksClient(wrapped)
        TasksClient(wrapped)  # wrapping twice adds nothing twice
        assert wrapped.errors.error_class(409, "stale-generation") is StaleGeneration
        # Nothing is registered process-wide: a client nobody wrapped
        # raises the class of the status.
        assert bare.errors.error_class(409, "stale-generation") is Conflict
        with pytest.raises(ValueError, match="stale-generation"):
            wrapped.errors.add(type("Other", (Conflict,), {}, answers=problems.StaleGeneration))
        with pytest.raises(ValueError, match="derives from Conflict"):
            bare.errors.add(type("Wrong", (Forbidden,), {}, answers=problems.StaleGeneration))
        assert wrapped.errors.error_class(409, "stale-generation") is StaleGeneration


# -- the loop ---------------------------------------------------------------------


async def test_projects_policies_and_agents_round_trip(team: Team) -> None:
    space = team.space

    def scenario(tasks: TasksClient) -> None:
        project = tasks.get_project(space, "shop")
        assert (project["revision"], project["policy"]["revision"]) == (1, 0)
        edited = tasks.update_project(
            space, project["id"], 1, description="the web shop", target_branch="main"
        )
        assert (edited["revision"], edited["target_branch"]) == (2, "main")
        with pytest.raises(RevisionConflict) as stale:
            tasks.update_project(space, "shop", 1, description="lost update")
        assert stale.value.status == 409
        with pytest.raises(NameTaken):
            tasks.create_project(space, "shop")
        assert [p["name"] for p in tasks.list_projects(space)] == ["shop"]

        policy = tasks.set_policy(space, "shop", 2, human_review_required=True)
        assert (policy["revision"], policy["approvals_required"]) == (1, 2)
        tasks.set_policy(space, "shop", 1, integration="human", expected_revision=1)
        assert [p["revision"] for p in tasks.list_policies(space, "shop")] == [2, 1]
        assert tasks.get_project(space, "shop")["policy"]["integration"] == "human"

        agent = tasks.create_agent(space, "coder", "write the code")
        assert (agent["revision"]["number"], agent["revision"]["plugins"]) == (1, [])
        revised = tasks.revise_agent(space, "coder", "write tested code", [], expected_revision=1)
        assert revised["revision"]["instructions"] == "write tested code"
        assert [r["number"] for r in tasks.list_agent_revisions(space, agent["id"])] == [2, 1]
        assert tasks.get_agent(space, "coder")["revision"]["number"] == 2
        assert [a["name"] for a in tasks.list_agents(space)] == ["coder"]
        with pytest.raises(RevisionConflict):
            tasks.revise_agent(space, "coder", "again", [], expected_revision=1)

    await team.run(team.owner, scenario)


async def test_a_claimed_task_is_renewed_and_submitted_with_the_attempt_token(
    team: Team,
) -> None:
    space = team.space
    task = await team.run(
        team.agent,
        lambda tasks: tasks.create_task(
            space, "shop", "fix the login form", "the button", "tests pass", labels=["web"]
        ),
    )
    assert (task["state"], task["labels"], task["revision"]) == ("ready", ["web"], 1)

    def claim(tasks: TasksClient) -> dict[str, Any]:
        assert [t["id"] for t in tasks.list_ready(space, label="web")] == [task["id"]]
        assert tasks.list_tasks(space, state="ready", q="login")[0]["id"] == task["id"]
        assert tasks.list_tasks(space, label="nothing") == []
        return tasks.claim(space, task["id"], lease_seconds=60)

    claimed = await team.run(team.agent, claim)
    attempt = claimed["attempt"]
    assert (claimed["task"]["state"], attempt["generation"]) == ("claimed", 1)
    assert claimed["token"].startswith("bmx_")

    def with_the_attempt_token(tasks: TasksClient) -> dict[str, Any]:
        renewed = tasks.renew(space, attempt["id"], 1, lease_seconds=120, progress={"step": 1})
        assert renewed["progress"] == {"step": 1}
        assert renewed["lease_expires_at"] > attempt["lease_expires_at"]
        assert tasks.checkpoint(space, attempt["id"], 1, ["half", "way"])["number"] == 1
        with pytest.raises(StaleGeneration):
            tasks.renew(space, attempt["id"], 2)
        with pytest.raises(TokenScopeRefused):
            tasks.list_tasks(space)
        return tasks.submit(
            space,
            attempt["id"],
            1,
            "fixed it",
            candidate={"commit": "3f2a9c1", "branch": "fix-login"},
            evidence={"checks": {"tests": "pass"}},
        )

    submitted = await team.run(claimed["token"], with_the_attempt_token)
    assert (submitted["task"]["state"], submitted["stage"]) == ("done", None)
    submission = submitted["submission"]

    def afterwards(tasks: TasksClient) -> None:
        assert tasks.get_task(space, task["id"])["state"] == "done"
        assert [(a["generation"], a["state"]) for a in tasks.list_attempts(space, task["id"])] == [
            (1, "submitted")
        ]
        assert tasks.get_attempt(space, attempt["id"])["state"] == "submitted"
        assert [s["id"] for s in tasks.list_submissions(space, task["id"])] == [submission["id"]]
        kept = tasks.get_submission(space, submission["id"])
        assert kept["candidate"] == {"commit": "3f2a9c1", "branch": "fix-login"}
        with pytest.raises(AttemptEnded):
            tasks.renew(space, attempt["id"], 1)

    await team.run(team.agent, afterwards)


async def test_edits_and_dependencies(team: Team) -> None:
    space = team.space

    def scenario(tasks: TasksClient) -> None:
        first = tasks.create_task(space, "shop", "design the schema")
        second = tasks.create_task(
            space, "shop", "write the migration", kind="general", prerequisites=[first["id"]]
        )
        assert second["state"] == "open"
        links = tasks.list_dependencies(space, second["id"])
        assert [p["id"] for p in links["prerequisites"]] == [first["id"]]
        with pytest.raises(DependencyCycle):
            tasks.add_dependency(space, first["id"], second["id"])
        assert tasks.remove_dependency(space, second["id"], first["id"]) is None
        assert tasks.get_task(space, second["id"])["state"] == "ready"
        added = tasks.add_dependency(space, second["id"], first["id"])
        assert [d["id"] for d in tasks.list_dependencies(space, first["id"])["dependents"]] == [
            second["id"]
        ]
        assert added["prerequisites"][0]["state"] == "ready"

        edited = tasks.update_task(space, first["id"], 1, title="design the tables", priority=5)
        assert (edited["revision"], edited["title"], edited["priority"]) == (
            2,
            "design the tables",
            5,
        )
        titles = [r["title"] for r in tasks.list_task_revisions(space, first["id"])]
        assert titles == ["design the tables", "design the schema"]
        with pytest.raises(RevisionConflict):
            tasks.update_task(space, first["id"], 1, title="stale")
        with pytest.raises(NotFound):
            tasks.get_task(space, "ta_missing")

    await team.run(team.agent, scenario)


async def test_decisions_and_holds_park_work_until_answered_or_lifted(team: Team) -> None:
    space = team.space
    task = await team.run(team.agent, lambda tasks: tasks.create_task(space, "shop", "migrate"))

    def ask(tasks: TasksClient) -> dict[str, Any]:
        decision = tasks.ask_decision(space, task["id"], "Drop IE11?", ["yes", "no"])
        assert tasks.get_task(space, task["id"])["parked"] is True
        with pytest.raises(TaskParked):
            tasks.claim(space, task["id"])
        assert tasks.list_ready(space) == []
        return decision

    decision = await team.run(team.agent, ask)
    assert (decision["state"], decision["answerable_by"]) == ("pending", "human")

    def answer(tasks: TasksClient) -> dict[str, Any]:
        assert [d["id"] for d in tasks.list_decisions(space)] == [decision["id"]]
        answered = tasks.answer_decision(space, decision["id"], "yes", comment="few users")
        assert tasks.list_decisions(space) == []
        assert [d["answer"] for d in tasks.list_decisions(space, "answered", task["id"])] == ["yes"]
        hold = tasks.place_hold(space, "task", "suspended", "waiting for the API", task["id"])
        assert hold["scope"] == {"type": "task", "id": task["id"]}
        assert [h["id"] for h in tasks.list_holds(space)] == [hold["id"]]
        return {"answered": answered, "hold": hold}

    done = await team.run(team.owner, answer)
    assert (done["answered"]["state"], done["answered"]["comment"]) == ("answered", "few users")
    hold = done["hold"]

    def refused_while_held(tasks: TasksClient) -> None:
        with pytest.raises(TaskHeld) as held:
            tasks.claim(space, task["id"])
        assert held.value.hold is not None and held.value.hold["id"] == hold["id"]
        assert f"(hold {hold['id']})" in str(held.value)

    await team.run(team.agent, refused_while_held)

    def lift(tasks: TasksClient) -> None:
        assert tasks.lift_hold(space, hold["id"])["lifted_at"] is not None
        assert tasks.list_holds(space) == []
        assert [h["id"] for h in tasks.list_holds(space, include_lifted=True)] == [hold["id"]]

    await team.run(team.owner, lift)
    claimed = await team.run(team.agent, lambda tasks: tasks.claim(space, task["id"]))
    assert claimed["attempt"]["generation"] == 1


async def test_a_held_task_names_its_holder_and_attempts_end_in_every_way(team: Team) -> None:
    space = team.space
    task = await team.run(team.agent, lambda tasks: tasks.create_task(space, "shop", "refactor"))
    first = await team.run(team.agent, lambda tasks: tasks.claim(space, task["id"]))

    def someone_else(tasks: TasksClient) -> None:
        with pytest.raises(TaskClaimed) as taken:
            tasks.claim(space, task["id"])
        assert taken.value.holder is not None
        assert taken.value.holder["attempt_id"] == first["attempt"]["id"]
        assert f"attempt {first['attempt']['id']} of {team.agent.id}" in str(taken.value)

    await team.run(team.agent2, someone_else)

    def give_up(tasks: TasksClient) -> None:
        released = tasks.release(space, first["attempt"]["id"], 1, "not mine after all")
        assert released["state"] == "released"
        second = tasks.claim(space, task["id"])["attempt"]
        assert tasks.fail(space, second["id"], 2, "tests broke")["state"] == "failed"
        third = tasks.claim_next(space, project="shop", kind="code")
        assert (third["task"]["id"], third["attempt"]["generation"]) == (task["id"], 3)
        assert tasks.get_task(space, task["id"])["attempts_used"] == 1
        canceled = tasks.cancel_attempt(space, third["attempt"]["id"], 3, "wrong approach")
        assert canceled["state"] == "canceled"
        assert tasks.claim_next(space, label="nothing")["task"] is None
        assert tasks.cancel_task(space, task["id"], "not needed")["state"] == "canceled"
        with pytest.raises(TaskNotClaimable):
            tasks.claim(space, task["id"])

    await team.run(team.agent, give_up)
    retried = await team.run(team.owner, lambda tasks: tasks.retry_task(space, task["id"]))
    assert (retried["state"], retried["attempts_used"]) == ("ready", 0)
    states = await team.run(
        team.owner, lambda tasks: [a["state"] for a in tasks.list_attempts(space, task["id"])]
    )
    assert states == ["released", "failed", "canceled"]


async def test_the_async_client_offers_the_same_calls(team: Team) -> None:
    space = team.space
    async with AsyncClient(team.url, team.agent.token) as bmx:
        tasks = AsyncTasksClient(bmx)
        task = await tasks.create_task(space, "shop", "async work", priority=3)
        assert [t["id"] for t in await tasks.list_ready(space, project="shop")] == [task["id"]]
        claim = await tasks.claim_next(space)
        attempt = claim["attempt"]
        assert claim["task"]["id"] == task["id"] and claim["skipped"] == 0
        await tasks.renew(space, attempt["id"], attempt["generation"], progress="compiling")
        decision = await tasks.ask_decision(
            space, task["id"], "Ship it?", ["yes", "no"], answerable_by="member"
        )
        assert (await tasks.answer_decision(space, decision["id"], "yes"))["answer"] == "yes"
        submitted = await tasks.submit(space, attempt["id"], attempt["generation"], "shipped")
        assert submitted["task"]["state"] == "done"
        with pytest.raises(InvalidState):
            await tasks.remove_dependency(space, task["id"], task["id"])
        with pytest.raises(StaleGeneration):
            await tasks.checkpoint(space, attempt["id"], 99, {})
    async with AsyncClient(team.url, team.owner.token) as bmx:
        tasks = AsyncTasksClient(bmx)
        hold = await tasks.place_hold(space, "space", "stopped", "freeze")
        assert [h["id"] for h in await tasks.list_holds(space)] == [hold["id"]]
        await tasks.lift_hold(space, hold["id"])
        agent = await tasks.create_agent(space, "async-agent", plugins=[])
        await tasks.revise_agent(space, agent["id"], "be quick", [])
        assert [r["number"] for r in await tasks.list_agent_revisions(space, "async-agent")] == [
            2,
            1,
        ]
