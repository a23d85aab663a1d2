"""Read routes a person's screen needs: ``GET .../task-counts`` (the
space's or a project's tasks by state, every state named) and
``GET .../attempts/{attempt}/checkpoints`` (newest first, numbered, paged)."""

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


async def test_an_attempts_checkpoints_are_listed_newest_first_and_paged(work: Work) -> None:
    task = await work.task("long work")
    claim = await work.claim(task["id"])
    attempt = claim["attempt"]
    path = f"/attempts/{attempt['id']}"
    for step in range(3):
        body = {"generation": attempt["generation"], "data": {"step": step}}
        await work.call("POST", f"{path}/checkpoint", work.agent, json=body, expect=201)
    page = await work.call("GET", f"{path}/checkpoints?limit=2", work.viewer, expect=200)
    assert [(c["number"], c["data"]) for c in page["items"]] == [(3, {"step": 2}), (2, {"step": 1})]
    rest = await work.call(
        "GET", f"{path}/checkpoints?limit=2&cursor={page['next_cursor']}", work.viewer, expect=200
    )
    assert [c["number"] for c in rest["items"]] == [1] and rest["next_cursor"] is None
    # The attempt's own token reads them; another attempt's token does not.
    await work.call("GET", f"{path}/checkpoints", claim["token"], expect=200)
    other = await work.claim((await work.task("other"))["id"], work.agent2)
    await work.call("GET", f"{path}/checkpoints", other["token"], expect=403)


async def test_the_task_list_filters_by_a_least_priority(work: Work) -> None:
    await work.task("low", priority=-5)
    high = await work.task("high", priority=50)
    mid = await work.task("mid", priority=0)
    listed = await work.call("GET", "/tasks?min_priority=0", work.viewer, expect=200)
    assert [t["id"] for t in listed["items"]] == [mid["id"], high["id"]]
    for bad in ("x", "1001", "1.5"):
        await work.call("GET", f"/tasks?min_priority={bad}", work.viewer, expect=422)
