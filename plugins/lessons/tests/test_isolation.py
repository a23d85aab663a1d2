"""Space isolation of every lesson route: a member of space A gets 404 for
each route of space B, as if B did not exist, and nothing of B changes;
searching A never finds B's lessons; a source may not name B's records."""

from __future__ import annotations

from typing import Any

import pytest

from buildmax.spaces import put_member
from buildmax.testing import PrincipalHandle

from .conftest import Lab

#: Every lesson route (method, path, body); ``{l}`` is a lesson of B.
ROUTES = [
    ("POST", "/lessons", {"kind": "note", "title": "mine now", "text": "x"}),
    ("GET", "/lessons", None),
    ("GET", "/lessons?q=secret", None),
    ("GET", "/lessons/{l}", None),
    ("GET", "/lessons/{l}/revisions", None),
    ("POST", "/lessons/{l}/revisions", {"revision": 1, "reason": "x", "text": "taken"}),
    ("POST", "/lessons/{l}/supersede", {"by": "{l}"}),
    ("GET", "/lessons/{l}/votes", None),
    ("POST", "/lessons/{l}/votes", {"vote": "wrong"}),
]


def test_the_route_list_covers_every_lesson_route(app: Any) -> None:
    served = {
        (method, rule.rule.removeprefix("/v1/spaces/<space>").replace("<lesson>", "{l}"))
        for rule in app.url_map.iter_rules()
        if rule.endpoint.startswith("lessons.")
        for method in rule.methods - {"HEAD", "OPTIONS"}
    }
    assert served == {(m, p.split("?")[0]) for m, p, _ in ROUTES}


async def _claim_in_another_space(lab: Lab, make_space: Any) -> tuple[str, dict[str, Any]]:
    """A space of which the agent is a member too, and the agent's claim of
    a task there: the space's path and the claim."""
    other = await make_space(lab.owner)
    async with lab.app.db.write() as tx:
        await put_member(tx, other.pk, lab.agent.pk, "member", lab.app.clock.now_ms())
    there = f"/v1/spaces/{other.id}"
    await lab.call("POST", f"{there}/projects", json={"name": "main"}, expect=201)
    task = await lab.call(
        "POST", f"{there}/tasks", json={"project": "main", "title": "t"}, expect=201
    )
    claim = await lab.call(
        "POST", f"{there}/tasks/{task['id']}/claim", lab.agent, json={}, expect=201
    )
    return there, claim


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
async def test_a_member_of_another_space_gets_404_for_every_lesson_route(
    lab: Lab, make_principal: Any, make_space: Any, method: str, path: str, body: Any
) -> None:
    secret = await lab.lesson("The secret handshake", "a secret only this space knows")
    before = (await lab.rows(), await lab.audit())
    stranger: PrincipalHandle = await make_principal("agent")
    await make_space(stranger)
    url = lab.base + path.replace("{l}", secret["id"])
    sent = None
    if body is not None:
        sent = {
            k: (v.replace("{l}", secret["id"]) if isinstance(v, str) else v)
            for k, v in body.items()
        }
    problem = await lab.call(method, url, stranger, json=sent, expect=404)
    assert problem["type"].endswith("not-found")
    assert "secret" not in str(problem)
    assert (await lab.rows(), await lab.audit()) == before


async def test_a_search_in_one_space_never_finds_another_spaces_lessons(
    lab: Lab, make_principal: Any, make_space: Any
) -> None:
    await lab.lesson("The secret handshake", "a secret only this space knows")
    stranger: PrincipalHandle = await make_principal("agent")
    other = await make_space(stranger)
    mine = f"/v1/spaces/{other.id}"
    await lab.call("POST", f"{mine}/projects", stranger, json={"name": "main"}, expect=201)
    await lab.call(
        "POST",
        f"{mine}/lessons",
        stranger,
        json={"kind": "note", "title": "t", "text": "x"},
        expect=201,
    )
    for query in ("q=secret", "q=handshake", ""):
        page = await lab.call("GET", f"{mine}/lessons?{query}", stranger, expect=200)
        assert all("secret" not in item["text"] for item in page["items"])
    # Naming space A's records from B is refused, and nothing is made.
    task = await lab.call("POST", "/tasks", json={"project": "main", "title": "a task"}, expect=201)
    sources = [{"type": "task", "id": task["id"]}]
    await lab.call(
        "POST",
        f"{mine}/lessons",
        stranger,
        json={"kind": "note", "title": "t", "text": "x", "sources": sources},
        problem="invalid-lesson-source",
    )
    await lab.call(
        "POST",
        f"{mine}/lessons",
        stranger,
        json={"kind": "note", "title": "t", "text": "x", "project": "web"},
        problem="not-found",
    )


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
async def test_an_attempts_token_reaches_no_lesson_of_another_space_its_agent_is_in(
    lab: Lab, make_space: Any, method: str, path: str, body: Any
) -> None:
    """The agent is a member of both spaces; the token of its claim in the
    other space is refused (404) on every lesson route of this one."""
    secret = await lab.lesson("The secret handshake", "a secret only this space knows")
    there, claim = await _claim_in_another_space(lab, make_space)
    before = (await lab.rows(), await lab.audit())
    url = lab.base + path.replace("{l}", secret["id"])
    sent = None
    if body is not None:
        sent = {
            k: (v.replace("{l}", secret["id"]) if isinstance(v, str) else v)
            for k, v in body.items()
        }
    await lab.call(method, url, claim["token"], json=sent, problem="not-found")
    assert (await lab.rows(), await lab.audit()) == before
    # Its own space's lessons it reaches.
    await lab.call("GET", f"{there}/lessons", claim["token"], expect=200)


async def test_a_claim_in_another_space_is_offered_none_of_this_spaces_lessons(
    lab: Lab, make_space: Any
) -> None:
    await lab.lesson("The secret handshake", "a secret only this space knows")
    _, claim = await _claim_in_another_space(lab, make_space)
    assert "lessons" not in claim["attempt"]["run_environment"]
