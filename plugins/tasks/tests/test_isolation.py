"""Space isolation and the viewer role, for every route of the tasks plugin.

``ROUTES`` lists every route the plugin serves; a route added without an
entry here fails ``test_every_tasks_route_is_listed``. For each route:

- a member of space A naming space B gets 404, exactly as if B did not
  exist;
- the same member naming B's resources (tasks, attempts, submissions,
  projects, agents, holds, decisions) under A's own space gets 404 too, and
  lists of A never show B's records;
- a viewer of A is refused every mutation of A with 403;

and no row of either space changes, no event is appended and nothing is
audited.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from buildmax.spaces import put_member

PROBLEM = "urn:buildmax:problem:"


@dataclass(frozen=True)
class Route:
    """One route: how to call it with a space's resources, and what a
    member of another space gets when it names those resources under its
    own space (``cross``): a status and slug, or ``"list"`` for a listing
    that must simply not show them."""

    method: str
    rule: str
    body: Callable[[dict[str, str]], Any] = lambda r: None
    query: Callable[[dict[str, str]], str] = lambda r: ""
    cross: tuple[int, str] | str = (404, "not-found")

    def path(self, space: str, res: dict[str, str]) -> str:
        path = self.rule.replace("<space>", space)
        for name in ("task", "attempt", "agent", "decision", "hold", "project", "submission"):
            path = path.replace(f"<{name}>", res[name])
        path = path.replace("<prerequisite>", res["prerequisite"])
        return path + self.query(res)

    @property
    def mutates(self) -> bool:
        return self.method != "GET"


def gen(res: dict[str, Any]) -> int:
    """The generation attempt routes are called with (1 unless a test says)."""
    return int(res.get("generation", 1))


#: Every route of the tasks plugin.
ROUTES = [
    # projects
    Route("POST", "/v1/spaces/<space>/projects", lambda r: {"name": "intruder"}, cross="list"),
    Route("GET", "/v1/spaces/<space>/projects", cross="list"),
    Route("GET", "/v1/spaces/<space>/projects/<project>"),
    Route(
        "PATCH",
        "/v1/spaces/<space>/projects/<project>",
        lambda r: {"expected_revision": 1, "description": "taken over"},
    ),
    Route("GET", "/v1/spaces/<space>/projects/<project>/policies"),
    Route(
        "POST",
        "/v1/spaces/<space>/projects/<project>/policy",
        lambda r: {"approvals_required": 0},
    ),
    # tasks
    Route(
        "POST",
        "/v1/spaces/<space>/tasks",
        lambda r: {"project": r["project"], "title": "intruder"},
    ),
    Route("GET", "/v1/spaces/<space>/tasks", query=lambda r: f"?project={r['project']}"),
    Route("GET", "/v1/spaces/<space>/ready", query=lambda r: f"?project={r['project']}"),
    Route("GET", "/v1/spaces/<space>/task-counts", query=lambda r: f"?project={r['project']}"),
    Route("GET", "/v1/spaces/<space>/tasks/<task>"),
    Route(
        "PATCH",
        "/v1/spaces/<space>/tasks/<task>",
        lambda r: {"expected_revision": 1, "title": "taken over"},
    ),
    Route("GET", "/v1/spaces/<space>/tasks/<task>/revisions"),
    Route("GET", "/v1/spaces/<space>/tasks/<task>/dependencies"),
    Route(
        "POST",
        "/v1/spaces/<space>/tasks/<task>/dependencies",
        lambda r: {"prerequisite": r["other_task"]},
    ),
    Route("DELETE", "/v1/spaces/<space>/tasks/<task>/dependencies/<prerequisite>"),
    Route(
        "PUT",
        "/v1/spaces/<space>/tasks/<task>/links",
        lambda r: {"links": [{"kind": "related", "task": r["other_task"]}]},
    ),
    Route("POST", "/v1/spaces/<space>/tasks/<task>/cancel", lambda r: {"reason": "taken over"}),
    Route("POST", "/v1/spaces/<space>/tasks/<task>/retry"),
    Route("GET", "/v1/spaces/<space>/tasks/<task>/attempts"),
    Route("GET", "/v1/spaces/<space>/tasks/<task>/submissions"),
    # claims and attempts
    Route("POST", "/v1/spaces/<space>/tasks/<task>/claim", lambda r: {}),
    Route("POST", "/v1/spaces/<space>/claims", lambda r: {"project": r["project"]}),
    Route("GET", "/v1/spaces/<space>/attempts/<attempt>"),
    Route("GET", "/v1/spaces/<space>/attempts/<attempt>/checkpoints"),
    Route("POST", "/v1/spaces/<space>/attempts/<attempt>/renew", lambda r: {"generation": gen(r)}),
    Route(
        "POST",
        "/v1/spaces/<space>/attempts/<attempt>/checkpoint",
        lambda r: {"generation": gen(r), "data": {"step": 1}},
    ),
    Route(
        "POST", "/v1/spaces/<space>/attempts/<attempt>/release", lambda r: {"generation": gen(r)}
    ),
    Route(
        "POST",
        "/v1/spaces/<space>/attempts/<attempt>/fail",
        lambda r: {"generation": gen(r), "reason": "taken over"},
    ),
    Route(
        "POST",
        "/v1/spaces/<space>/attempts/<attempt>/cancel",
        lambda r: {"generation": gen(r), "reason": "taken over", "override_reason": "taken over"},
    ),
    Route(
        "POST",
        "/v1/spaces/<space>/attempts/<attempt>/submit",
        lambda r: {"generation": gen(r), "summary": "taken over"},
    ),
    Route("GET", "/v1/spaces/<space>/submissions/<submission>"),
    # holds
    Route(
        "POST",
        "/v1/spaces/<space>/holds",
        lambda r: {"scope": "task", "target": r["task"], "strength": "stopped", "reason": "x"},
    ),
    Route("GET", "/v1/spaces/<space>/holds", query=lambda r: "?all=true", cross="list"),
    Route("POST", "/v1/spaces/<space>/holds/<hold>/lift"),
    # decisions
    Route(
        "POST",
        "/v1/spaces/<space>/tasks/<task>/decisions",
        lambda r: {"question": "take over?", "options": ["yes", "no"]},
    ),
    Route("GET", "/v1/spaces/<space>/decisions", query=lambda r: f"?state=all&task={r['task']}"),
    Route(
        "POST",
        "/v1/spaces/<space>/decisions/<decision>/answer",
        lambda r: {"answer": "yes"},
    ),
    # agents
    Route("POST", "/v1/spaces/<space>/agents", lambda r: {"name": "intruder"}, cross="list"),
    Route("GET", "/v1/spaces/<space>/agents", cross="list"),
    Route("GET", "/v1/spaces/<space>/agents/<agent>"),
    Route(
        "POST",
        "/v1/spaces/<space>/agents/<agent>/revisions",
        lambda r: {"instructions": "taken over", "plugins": []},
    ),
    Route("GET", "/v1/spaces/<space>/agents/<agent>/revisions"),
]


def test_every_tasks_route_is_listed(app):
    """A route of the tasks plugin missing from ROUTES (or listed but gone) fails here."""
    served = {
        (method, rule.rule)
        for rule in app.url_map.iter_rules()
        if rule.endpoint.startswith("tasks_")
        for method in rule.methods - {"HEAD", "OPTIONS"}
    }
    listed = [(r.method, r.rule) for r in ROUTES]
    assert len(listed) == len(set(listed))
    assert served == set(listed)


# -- two populated spaces -------------------------------------------------------------


async def populate(work: Any, space_id: str, owner: Any, member: Any) -> dict[str, str]:
    """A project, agent, tasks with an edge, an active attempt, a submission,
    a hold and a decision in ``space_id``; their public ids."""
    base = f"/v1/spaces/{space_id}"

    async def call(method: str, path: str, who: Any, body: Any, status: int) -> Any:
        return await work.call(method, base + path, who, json=body, expect=status)

    project = await call("POST", "/projects", owner, {"name": "iso"}, 201)
    agent = await call("POST", "/agents", owner, {"name": "coder", "plugins": ["lint"]}, 201)

    async def task(title: str, **fields: Any) -> dict[str, Any]:
        body = {"project": project["id"], "title": title, **fields}
        return await call("POST", "/tasks", owner, body, 201)  # type: ignore[no-any-return]

    first = await task("first", resources=["repo:https://git.test/x@main"])
    second = await task("second", prerequisites=[first["id"]])
    running = await task("running")
    handed = await task("handed in")
    claim = await call("POST", f"/tasks/{running['id']}/claim", member, {}, 201)
    done = await call("POST", f"/tasks/{handed['id']}/claim", member, {}, 201)
    submitted = await call(
        "POST",
        f"/attempts/{done['attempt']['id']}/submit",
        member,
        {"generation": 1, "summary": "done"},
        201,
    )
    hold = await call(
        "POST",
        "/holds",
        owner,
        {"scope": "task", "target": first["id"], "strength": "suspended", "reason": "wait"},
        201,
    )
    decision = await call(
        "POST",
        f"/tasks/{second['id']}/decisions",
        owner,
        {"question": "go?", "options": ["yes", "no"], "answerable_by": "member"},
        201,
    )
    return {
        "space": space_id,
        "project": project["id"],
        "agent": agent["id"],
        # Routes on a task use the one with an edge, a decision and attempts nearby.
        "task": second["id"],
        "prerequisite": first["id"],
        "other_task": running["id"],
        "attempt": claim["attempt"]["id"],
        "submission": submitted["submission"]["id"],
        "hold": hold["id"],
        "decision": decision["id"],
    }


@pytest.fixture
async def spaces_ab(work, make_principal, make_space):
    """Space A (the ``work`` space) and space B (another owner and member),
    each populated the same way."""
    bob = await make_principal("human")
    bob_agent = await make_principal("agent")
    space_b = await make_space(bob)
    async with work.app.db.write() as tx:
        await put_member(tx, space_b.pk, bob_agent.pk, "member", work.app.clock.now_ms())
    # The work fixture made project "main" in A already; A gets its own set here.
    res_a = await populate(work, work.space.id, work.owner, work.agent)
    res_b = await populate(work, space_b.id, bob, bob_agent)
    return res_a, res_b


async def call_route(
    work: Any, route: Route, space: str, res: dict[str, str], who: Any
) -> tuple[int, Any, str]:
    url = route.path(space, res)
    kwargs: dict[str, Any] = {"headers": who.headers}
    body = route.body(res)
    if body is not None:
        kwargs["json"] = body
    response = await work.client.open(url, method=route.method, **kwargs)
    text = (await response.get_data()).decode()
    payload = await response.get_json() if response.status_code != 204 else None
    return response.status_code, payload, text


# -- the tests ----------------------------------------------------------------------


async def test_a_member_of_a_gets_404_for_every_route_of_b(work, spaces_ab, audit_log):
    """A's owner (every role check of A passes) names space B: 404 for every
    route, nothing changes anywhere, nothing is audited."""
    _, res_b = spaces_ab
    before = await work.snapshot()
    audit_log.events.clear()
    wrong = []
    for route in ROUTES:
        status, body, _ = await call_route(work, route, res_b["space"], res_b, work.owner)
        if status != 404 or body.get("type") != PROBLEM + "not-found":
            wrong.append((route.method, route.rule, status, body))
    assert wrong == []
    assert await work.snapshot() == before
    assert audit_log.events == []


async def test_b_resources_named_under_a_are_not_found(work, spaces_ab, audit_log):
    """A's owner names B's project, task, attempt, submission, agent, hold
    or decision under A's own space: 404; A's listings never show B's
    records; nothing changes and nothing is audited."""
    res_a, res_b = spaces_ab
    before = await work.snapshot()
    audit_log.events.clear()
    b_ids = {v for k, v in res_b.items() if k != "space"}
    wrong = []
    for route in ROUTES:
        if route.cross == "list":
            if route.mutates:
                continue  # creates in A by name: nothing of B is named
            status, _, text = await call_route(work, route, res_a["space"], res_b, work.owner)
            leaked = sorted(i for i in b_ids if i in text)
            if status != 200 or leaked:
                wrong.append((route.method, route.rule, status, leaked))
            continue
        status, body, _ = await call_route(work, route, res_a["space"], res_b, work.owner)
        expected_status, slug = route.cross  # type: ignore[misc]
        if status != expected_status or body.get("type") != PROBLEM + slug:
            wrong.append((route.method, route.rule, status, body))
    assert wrong == []
    assert await work.snapshot() == before
    assert audit_log.events == []


async def test_a_viewer_is_refused_every_mutation_with_403(work, spaces_ab, audit_log):
    """A viewer of A calls every mutation route with A's own resources and a
    valid body: 403 each time; nothing changes; nothing is audited."""
    res_a, _ = spaces_ab
    before = await work.snapshot()
    audit_log.events.clear()
    mutations = [r for r in ROUTES if r.mutates]
    wrong = []
    for route in mutations:
        status, body, _ = await call_route(work, route, res_a["space"], res_a, work.viewer)
        if status != 403 or body.get("type") != PROBLEM + "forbidden":
            wrong.append((route.method, route.rule, status, body))
    assert wrong == []
    assert await work.snapshot() == before
    assert audit_log.events == []


async def test_the_viewer_may_read_every_read_route(work, spaces_ab):
    """The same viewer reads every read route of its space: the 403s above
    come from the role, not from broken requests."""
    res_a, _ = spaces_ab
    wrong = []
    for route in ROUTES:
        if route.mutates:
            continue
        status, body, _ = await call_route(work, route, res_a["space"], res_a, work.viewer)
        if status != 200:
            wrong.append((route.method, route.rule, status, body))
    assert wrong == []


async def test_the_bodies_are_accepted_from_those_allowed(work, spaces_ab):
    """Every mutation route accepts its listed body from a principal allowed
    to call it (so the refusals above are about space and role, not about a
    malformed request). Each call gets a resource in a state it accepts."""
    res_a, _ = spaces_ab
    by_key = {(r.method, r.rule): r for r in ROUTES}
    called: set[tuple[str, str]] = set()
    res = dict(res_a)

    async def step(method: str, rule: str, who: Any, status: int, **overrides: str) -> Any:
        res.update(overrides)
        route = by_key[(method, "/v1/spaces/<space>" + rule)]
        got, body, _ = await call_route(work, route, res["space"], res, who)
        assert got == status, (method, rule, got, body)
        called.add((route.method, route.rule))
        return body

    async def fresh(title: str) -> str:
        made = await work.call(
            "POST", "/tasks", json={"project": res["project"], "title": title}, expect=201
        )
        return made["id"]  # type: ignore[no-any-return]

    owner = work.owner
    await step("POST", "/projects", owner, 201)
    await step("PATCH", "/projects/<project>", owner, 200)
    await step("POST", "/projects/<project>/policy", owner, 201)
    await step("POST", "/tasks", owner, 201)
    await step("POST", "/agents", owner, 201)
    await step("POST", "/agents/<agent>/revisions", owner, 201)
    await step("POST", "/decisions/<decision>/answer", owner, 200)
    await step("POST", "/holds/<hold>/lift", owner, 200)

    task = await fresh("edited")
    await step("PATCH", "/tasks/<task>", owner, 200, task=task)
    await step("POST", "/tasks/<task>/dependencies", owner, 201, other_task=res["prerequisite"])
    await step("DELETE", "/tasks/<task>/dependencies/<prerequisite>", owner, 204)
    await step("PUT", "/tasks/<task>/links", owner, 200)
    await step("POST", "/tasks/<task>/cancel", owner, 200)
    await step("POST", "/tasks/<task>/retry", owner, 200)
    claim = await step("POST", "/tasks/<task>/claim", owner, 201)
    await step("POST", "/attempts/<attempt>/renew", owner, 200, attempt=claim["attempt"]["id"])
    await step("POST", "/attempts/<attempt>/checkpoint", owner, 201)
    await step("POST", "/attempts/<attempt>/release", owner, 200)
    for ender in ("fail", "cancel", "submit"):
        claim = await step("POST", "/claims", owner, 201)
        res["generation"] = str(claim["attempt"]["generation"])
        await step(
            "POST",
            f"/attempts/<attempt>/{ender}",
            owner,
            201 if ender == "submit" else 200,
            attempt=claim["attempt"]["id"],
        )
    await step("POST", "/tasks/<task>/decisions", owner, 201, task=await fresh("asked"))
    await step("POST", "/holds", owner, 201, task=await fresh("held"))
    assert called == {k for k, r in by_key.items() if r.mutates}
