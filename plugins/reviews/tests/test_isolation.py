"""Space isolation of the routes an attempt's token reaches: the token of a
claim in one space reads and changes nothing of another space its agent is
a member of (404, as if that space did not exist)."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Flow, add_member

#: Every reviews route an attempt's token reaches (method, path, body):
#: ``{held}`` is a review work item of this space its agent holds,
#: ``{done}`` one reviewed with a finding, ``{subject}`` its subject and
#: ``{finding}`` that finding.
ROUTES = [
    ("GET", "/reviews/{held}", None),
    ("GET", "/reviews/{done}", None),
    ("POST", "/reviews/{held}", {"decision": "approve"}),
    ("GET", "/findings", None),
    ("GET", "/findings?subject={subject}", None),
    ("POST", "/findings/{finding}/resolve", {"resolution": "mine now"}),
]


def test_the_route_list_covers_every_reviews_route_an_attempts_token_reaches(app: Any) -> None:
    served = {
        (method, rule.rule.removeprefix("/v1/spaces/<space>"))
        for rule in app.url_map.iter_rules()
        if rule.endpoint.startswith("reviews.")
        and "attempt" in app.view_functions[rule.endpoint].__buildmax_api__.scopes
        for method in rule.methods - {"HEAD", "OPTIONS"}
    }
    listed = {
        (
            m,
            _filled(
                p.split("?")[0], {"held": "<ident>", "done": "<ident>", "finding": "<finding>"}
            ),
        )
        for m, p, _ in ROUTES
    }
    assert served == listed


def _filled(value: str, ids: dict[str, str]) -> str:
    for name, public_id in ids.items():
        value = value.replace("{" + name + "}", public_id)
    return value


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
async def test_an_attempts_token_reaches_no_review_of_another_space_its_agent_is_in(
    flow: Flow, make_space: Any, method: str, path: str, body: Any
) -> None:
    """The reviewer is a member of both spaces and holds a review work item
    here; the token of its claim in the other space is refused (404) on
    every reviews route of this one, and nothing here changes."""
    subject, handed = await flow.implemented("reviewed")
    (done,) = handed["work_ids"]
    await flow.claim(done, flow.reviewer2)
    recorded = await flow.review(
        done, flow.reviewer2, "request_changes", findings=[{"severity": "major", "text": "secret"}]
    )
    (finding,) = recorded["findings"]
    _, waiting = await flow.implemented("waiting")
    (held,) = waiting["work_ids"]
    await flow.claim(held, flow.reviewer)

    other = await make_space(flow.owner)
    await add_member(flow.app, other, flow.reviewer, "member")
    there = f"/v1/spaces/{other.id}"
    await flow.call("POST", f"{there}/projects", json={"name": "main"}, expect=201)
    task = await flow.call(
        "POST", f"{there}/tasks", json={"project": "main", "title": "t"}, expect=201
    )
    claim = await flow.call(
        "POST", f"{there}/tasks/{task['id']}/claim", flow.reviewer, json={}, expect=201
    )

    ids = {"held": held, "done": done, "subject": subject["id"], "finding": finding["id"]}
    sent = None if body is None else {k: _filled(v, ids) for k, v in body.items()}
    before = await flow.snapshot()
    problem = await flow.call(
        method, _filled(path, ids), claim["token"], json=sent, problem="not-found"
    )
    assert "secret" not in str(problem)
    assert await flow.snapshot() == before
    # The reviews routes of its own space it reaches.
    await flow.call("GET", f"{there}/findings", claim["token"], expect=200)
