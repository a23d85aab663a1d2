"""``GET /v1/spaces/{space}/task-counts``: the space's (or a project's)
tasks by state, for viewers, every state named."""

from __future__ import annotations

from buildmax_tasks.tables import TASK_STATES

from .conftest import Work


async def test_tasks_are_counted_by_state_for_the_space_and_a_project(work: Work) -> None:
    first, second, third = [await work.task(f"t{n}") for n in range(3)]
    await work.claim(first["id"])
    await work.call("POST", f"/tasks/{second['id']}/cancel", json={"reason": "dup"}, expect=200)
    other = await work.call("POST", "/projects", json={"name": "other"}, expect=201)
    await work.call("POST", "/tasks", json={"project": other["id"], "title": "x"}, expect=201)
    counted = await work.call("GET", "/task-counts", work.viewer, expect=200)
    assert list(counted["states"]) == list(TASK_STATES)
    assert (counted["states"]["ready"], counted["states"]["claimed"]) == (2, 1)
    assert (counted["states"]["canceled"], counted["states"]["done"]) == (1, 0)
    assert counted["total"] == 4
    main = await work.call("GET", f"/task-counts?project={work.project}", work.viewer, expect=200)
    assert (main["states"]["ready"], main["total"]) == (1, 3)
    assert third["id"]


async def test_counts_are_refused_to_strangers_and_for_an_unknown_project(
    work: Work, make_principal
) -> None:
    stranger = await make_principal("agent")
    await work.call("GET", "/task-counts", stranger, expect=404, problem="not-found")
    await work.call("GET", "/task-counts?project=nope", work.viewer, expect=404)
