"""Human review in the dashboard: the submission's diff rendered as a diff,
a review with findings on its lines recorded as the person (a human
review, through the reviews plugin's route), a refused form shown again as
filled, and artifacts downloaded through the dashboard as the API serves
them."""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import urlencode

from buildmax.testing import call

from .conftest import Team, make_task, signed_in

DIFF = b"""diff --git a/src/parser.py b/src/parser.py
--- a/src/parser.py
+++ b/src/parser.py
@@ -1,3 +1,4 @@
 import re
-PATTERN = re.compile("a+")
+PATTERN = re.compile("a*")
+LIMIT = 10
 def parse(text):
"""


async def _claimed(client: Any, team: Team, title: str, **extra: Any) -> tuple[Any, Any]:
    """A new task of the team's, claimed by its agent: the task and the attempt."""
    task = await make_task(client, team, title, **extra)
    claim = await call(
        client, "POST", f"{team.base}/tasks/{task['id']}/claim", team.agent, json={}, expect=201
    )
    return task, claim["attempt"]


async def _upload(
    client: Any, team: Team, attempt: Any, name: str, data: bytes, media_type: str
) -> Any:
    """An artifact of ``attempt``, uploaded by the agent."""
    return await call(
        client,
        "POST",
        f"{team.base}/artifacts?name={name}&attempt={attempt['id']}"
        f"&generation={attempt['generation']}&sha256={hashlib.sha256(data).hexdigest()}",
        team.agent,
        data=data,
        content_type=media_type,
        expect=201,
    )


async def _submitted(client: Any, team: Team) -> dict[str, Any]:
    """A task handed in with a diff; its review work item waits."""
    task, attempt = await _claimed(client, team, "parse more", criteria="- accepts empty input")
    artifact = await _upload(client, team, attempt, "change.diff", DIFF, "text/x-diff")
    await call(
        client,
        "POST",
        f"{team.base}/attempts/{attempt['id']}/submit",
        team.agent,
        json={
            "generation": attempt["generation"],
            "summary": "done",
            "artifacts": [artifact["id"]],
        },
        expect=201,
    )
    [item] = (
        await call(
            client, "GET", f"{team.base}/reviews?subject={task['id']}", team.owner, expect=200
        )
    )["items"]
    return {"task": task, "artifact": artifact, "work": item["task_id"]}


async def test_the_review_page_renders_the_diff_with_the_form(app, client, team, browser):
    done = await _submitted(client, team)
    b = await signed_in(browser, team.owner)
    html = await b.text(f"/ui/spaces/{team.space.id}/reviews/{done['work']}")
    assert "<code>src/parser.py</code>" in html
    assert '<tr class="d-add">' in html and '<tr class="d-del">' in html
    assert "+LIMIT = 10" in html
    assert 'data-path="src/parser.py" data-line="3"' in html  # LIMIT is new line 3
    assert 'action="/ui/spaces/' in html and "Record review" in html
    assert "- accepts empty input" in html


async def test_a_human_review_with_a_finding_on_a_diff_line_is_the_apis(
    app, client, team, browser, audit_log
):
    done = await _submitted(client, team)
    b = await signed_in(browser, team.owner)
    path = f"/ui/spaces/{team.space.id}/reviews/{done['work']}/record"
    answer = await b.client.post(
        path,
        form={
            "csrf": b.csrf,
            "decision": "request_changes",
            "summary": "close, one thing",
            "finding_path": "src/parser.py",
            "finding_line": "2",
            "finding_severity": "major",
            "finding_text": "a* also matches nothing",
        },
    )
    assert answer.status_code == 303, await answer.get_data(as_text=True)
    item = await call(client, "GET", f"{team.base}/reviews/{done['work']}", team.owner, expect=200)
    assert (item["review"]["decision"], item["review"]["human"]) == ("request_changes", True)
    assert [(f["path"], f["line"], f["severity"], f["text"]) for f in item["findings"]] == [
        ("src/parser.py", 2, "major", "a* also matches nothing")
    ]
    subject = await call(
        client, "GET", f"{team.base}/tasks/{done['task']['id']}", team.owner, expect=200
    )
    assert subject["state"] == "ready"  # reopened for the changes, as through the API
    [recorded] = [e for e in audit_log.events if e.action.startswith("review.")]
    assert recorded.actor_id == team.owner.id and recorded.actor_kind == "human"
    assert (recorded.request_id or "").startswith("ui/")
    # The finding now shows on its line of the diff.
    html = await b.text(f"/ui/spaces/{team.space.id}/reviews/{done['work']}")
    assert "a* also matches nothing" in html
    assert "Record review" not in html


async def test_a_refused_review_shows_the_form_again_and_records_nothing(
    app, client, team, browser
):
    done = await _submitted(client, team)
    b = await signed_in(browser, team.owner)
    path = f"/ui/spaces/{team.space.id}/reviews/{done['work']}/record"
    for form, status in (
        ({"decision": "request_changes", "summary": "kept text"}, 422),  # no finding
        (
            {
                "decision": "approve",
                "summary": "kept text",
                "finding_line": "two",
                "finding_text": "x",
                "finding_path": "a",
            },
            422,
        ),
        ({"decision": "maybe", "summary": "kept text"}, 422),
    ):
        answer = await b.client.post(path, form={"csrf": b.csrf, **form})
        body = await answer.get_data(as_text=True)
        assert answer.status_code == status, body[:500]
        assert "kept text" in body and "Record review" in body
        assert 'role="alert"' in body
    item = await call(client, "GET", f"{team.base}/reviews/{done['work']}", team.owner, expect=200)
    assert item["review"] is None and item["findings"] == []


async def test_a_viewer_gets_no_form_and_a_forged_review_is_refused(app, client, team, browser):
    done = await _submitted(client, team)
    b = await signed_in(browser, team.viewer)
    html = await b.text(f"/ui/spaces/{team.space.id}/reviews/{done['work']}")
    assert "Record review" not in html and "+LIMIT = 10" in html
    answer = await b.client.post(
        f"/ui/spaces/{team.space.id}/reviews/{done['work']}/record",
        form={"csrf": b.csrf, "decision": "approve", "summary": "fine"},
    )
    assert answer.status_code == 403
    item = await call(client, "GET", f"{team.base}/reviews/{done['work']}", team.owner, expect=200)
    assert item["review"] is None


async def test_artifacts_download_through_the_dashboard_as_the_api_serves_them(
    app, client, team, browser, person
):
    done = await _submitted(client, team)
    b = await signed_in(browser, team.owner)
    path = f"/ui/spaces/{team.space.id}/artifacts/{done['artifact']['id']}/content"
    answer = await b.get(path)
    assert answer.status_code == 200
    assert await answer.get_data() == DIFF
    assert answer.headers["Content-Type"].startswith("text/x-diff")
    assert answer.headers["Content-Disposition"].startswith("attachment")
    assert answer.headers["Content-Security-Policy"] == "sandbox"
    assert answer.headers["ETag"] == f'"{hashlib.sha256(DIFF).hexdigest()}"'
    part = await b.get(path, headers={"Range": "bytes=0-9"})
    assert part.status_code == 206 and await part.get_data() == DIFF[:10]
    beyond = await b.get(path, headers={"Range": "bytes=99999-"})
    assert beyond.status_code == 416
    assert beyond.headers["Content-Range"] == f"bytes */{len(DIFF)}"
    stranger = await signed_in(browser, await person())
    assert (await stranger.get(path)).status_code == 404
    assert (await browser().get(path)).status_code == 303  # not signed in


async def test_the_task_page_shows_artifacts_reviews_and_for_owners_the_audit_trail(
    app, client, team, browser
):
    done = await _submitted(client, team)
    b = await signed_in(browser, team.owner)
    html = await b.text(f"/ui/spaces/{team.space.id}/tasks/{done['task']['id']}")
    assert "change.diff" in html and "+LIMIT = 10" in html
    assert "review slot 1" in html
    assert "Audit trail" in html and "task.claimed" in html
    viewer = await signed_in(browser, team.viewer)
    html = await viewer.text(f"/ui/spaces/{team.space.id}/tasks/{done['task']['id']}")
    assert "change.diff" in html and "Audit trail" not in html


async def test_numbers_a_form_cannot_hold_are_refused_not_500(app, client, team, browser):
    done = await _submitted(client, team)
    b = await signed_in(browser, team.owner)
    answer = await b.client.post(
        f"/ui/spaces/{team.space.id}/reviews/{done['work']}/record",
        form={
            "csrf": b.csrf,
            "decision": "approve",
            "finding_path": "a",
            "finding_line": "\u00b2",
            "finding_text": "x",
        },
    )
    assert answer.status_code == 422
    task, attempt = await _claimed(client, team, "t")
    refused = await b.client.post(
        f"/ui/spaces/{team.space.id}/tasks/{task['id']}/cancel-attempt",
        form={
            "csrf": b.csrf,
            "attempt": attempt["id"],
            "generation": "\u00b2",
            "reason": "x",
        },
    )
    assert refused.status_code == 422
    shown = await call(
        client, "GET", f"{team.base}/attempts/{attempt['id']}", team.owner, expect=200
    )
    assert shown["state"] == "active"


async def test_more_than_a_hundred_finding_rows_are_refused(app, client, team, browser):
    done = await _submitted(client, team)
    b = await signed_in(browser, team.owner)
    rows = 101
    form = [("csrf", b.csrf), ("decision", "request_changes")]
    for n in range(rows):
        form += [
            ("finding_path", "a"),
            ("finding_line", str(n + 1)),
            ("finding_severity", "minor"),
            ("finding_text", f"f{n}"),
        ]
    answer = await b.client.post(
        f"/ui/spaces/{team.space.id}/reviews/{done['work']}/record",
        data=urlencode(form),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert answer.status_code == 422
    item = await call(client, "GET", f"{team.base}/reviews/{done['work']}", team.owner, expect=200)
    assert item["review"] is None


async def test_a_page_shows_a_bounded_amount_of_artifacts_inline(app, client, team, browser):
    """A text artifact over the inline limit, and artifacts past the
    page's budget, are downloads that say why; an SVG is never an image."""
    task, attempt = await _claimed(client, team, "big")

    async def upload(name: str, data: bytes, media_type: str) -> None:
        await _upload(client, team, attempt, name, data, media_type)

    await upload("huge.txt", b"x" * (300 * 1024), "text/plain")
    for n in range(3):
        await upload(f"part{n}.txt", bytes([97 + n]) * (200 * 1024), "text/plain")
    await upload("logo.svg", b"<svg xmlns='http://www.w3.org/2000/svg'/>", "image/svg+xml")
    b = await signed_in(browser, team.owner)
    html = await b.text(f"/ui/spaces/{team.space.id}/tasks/{task['id']}")
    assert "too large to show here (307,200 bytes)" in html
    shown = sum(("a" * 100 in html, "b" * 100 in html, "c" * 100 in html))
    assert shown == 2 and "this page shows no more artifacts inline" in html
    assert "<img" not in html
