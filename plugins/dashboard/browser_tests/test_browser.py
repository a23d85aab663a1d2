"""The dashboard in a real browser: live updates, the lease countdown,
decisions, escaping under the Content-Security-Policy, accessibility (axe)
and layout from 320 px wide to a desktop, light and dark."""

from __future__ import annotations

import asyncio
from typing import Any

from playwright.async_api import Page, expect

from .conftest import PASSWORD, Site, Watch, _ok, every_variant, sign_in

HOSTILE = "<script>alert(1)</script>"


async def _task(site: Site, title: str, **extra: Any) -> dict[str, Any]:
    body = {"project": "main", "title": title, **extra}
    task: dict[str, Any] = await _ok(await site.owner.post(f"{site.base}/tasks", json=body), 201)
    return task


def _column(page: Page, state: str) -> Any:
    return page.locator(f"section.column[aria-labelledby='col-{state}']")


async def test_a_claim_appears_live_its_lease_counts_down_and_review_waits(context, site):
    task = await _task(site, "write the parser")
    page = await context.new_page()
    watch = Watch(page)
    await sign_in(page, site, site.owner_name)
    await page.goto(site.page_url(f"/ui/spaces/{site.space['id']}/projects/{site.project['id']}/"))
    await expect(_column(page, "ready")).to_contain_text("write the parser")
    await expect(page.locator("#freshness")).to_contain_text("live", timeout=3000)

    claim = await _ok(await site.agent.post(f"{site.base}/tasks/{task['id']}/claim", json={}), 201)
    # No reload: the page's own event stream brings it within two seconds.
    await expect(_column(page, "claimed")).to_contain_text("write the parser", timeout=2000)
    await expect(_column(page, "ready")).not_to_contain_text("write the parser")

    await page.get_by_role("link", name="write the parser").click()
    lease = page.locator("time[data-lease]")
    await expect(lease).to_contain_text("expires in")
    first = await lease.text_content()
    await asyncio.sleep(1.2)
    assert await lease.text_content() != first, "the lease countdown did not move"

    await page.goto(site.page_url(f"/ui/spaces/{site.space['id']}/"))
    await expect(page.locator("#freshness")).to_contain_text("live", timeout=3000)
    attempt = claim["attempt"]
    await _ok(
        await site.agent.post(
            f"{site.base}/attempts/{attempt['id']}/submit",
            json={"generation": attempt["generation"], "summary": "done"},
        ),
        201,
    )
    await expect(page.locator("ul.attention")).to_contain_text("review.waiting", timeout=2000)
    assert watch.dialogs == [] and watch.violations == []


async def test_a_decision_answered_in_the_browser_moves_the_task_on(context, site):
    task = await _task(site, "parked work")
    decision = await _ok(
        await site.agent.post(
            f"{site.base}/tasks/{task['id']}/decisions",
            json={"question": "Which database?", "options": ["sqlite", "postgres"]},
        ),
        201,
    )
    page = await context.new_page()
    await sign_in(page, site, site.owner_name)
    await page.goto(site.page_url(f"/ui/spaces/{site.space['id']}/decisions"))
    await page.get_by_label("postgres").check()
    await page.get_by_label("Comment (optional)").fill("we scale out")
    await page.get_by_role("button", name="Answer").click()
    await expect(page.get_by_role("status")).to_contain_text(decision["id"])
    shown = await _ok(await site.owner.get(f"{site.base}/decisions", params={"state": "all"}))
    [answered] = shown["items"]
    assert (answered["state"], answered["answer"], answered["comment"]) == (
        "answered",
        "postgres",
        "we scale out",
    )
    after = await _ok(await site.owner.get(f"{site.base}/tasks/{task['id']}"))
    assert after["parked"] is False


DIFF = b"""--- a/src/parser.py
+++ b/src/parser.py
@@ -1,3 +1,4 @@
 import re
-PATTERN = re.compile("a+")
+PATTERN = re.compile("a*")
+LIMIT = 10
 def parse(text):
"""


async def _handed_in(site: Site) -> dict[str, Any]:
    """A task handed in by the agent with a diff; its review work waits."""
    task = await _task(site, "parse more", criteria="- accepts empty input")
    claim = await _ok(await site.agent.post(f"{site.base}/tasks/{task['id']}/claim", json={}), 201)
    attempt = claim["attempt"]
    artifact = await _ok(
        await site.agent.post(
            f"{site.base}/artifacts",
            params={
                "name": "change.diff",
                "attempt": attempt["id"],
                "generation": str(attempt["generation"]),
            },
            content=DIFF,
            headers={"Content-Type": "text/x-diff"},
        ),
        201,
    )
    await _ok(
        await site.agent.post(
            f"{site.base}/attempts/{attempt['id']}/submit",
            json={
                "generation": attempt["generation"],
                "summary": "done",
                "artifacts": [artifact["id"]],
            },
        ),
        201,
    )
    items = await _ok(await site.owner.get(f"{site.base}/reviews", params={"subject": task["id"]}))
    return {"task": task, "work": items["items"][0]["task_id"]}


async def test_a_human_review_with_a_finding_on_a_diff_line(context, site):
    done = await _handed_in(site)
    page = await context.new_page()
    await sign_in(page, site, site.owner_name)
    await page.goto(site.page_url(f"/ui/spaces/{site.space['id']}/reviews/{done['work']}"))
    await page.get_by_role("button", name="Add a finding on src/parser.py line 3").click()
    await expect(page.locator("input[name=finding_line]").first).to_have_value("3")
    await page.keyboard.type("LIMIT is never used")
    await page.locator("select[name=finding_severity]").first.select_option("major")
    await page.get_by_label("Request changes").check()
    await page.get_by_label("Summary").fill("one thing")
    await page.get_by_role("button", name="Record review").click()
    await expect(page.get_by_role("heading", name="Recorded")).to_be_visible()
    await expect(page.locator("table.diff")).to_contain_text("LIMIT is never used")

    item = await _ok(await site.owner.get(f"{site.base}/reviews/{done['work']}"))
    assert (item["review"]["decision"], item["review"]["human"]) == ("request_changes", True)
    assert [(f["path"], f["line"], f["severity"]) for f in item["findings"]] == [
        ("src/parser.py", 3, "major")
    ]
    subject = await _ok(await site.owner.get(f"{site.base}/tasks/{done['task']['id']}"))
    assert subject["state"] == "ready"  # back for the changes, as through the API
    trail = await _ok(
        await site.owner.get(f"{site.base}/audit", params={"action": "review.", "limit": "50"})
    )
    [recorded] = trail["items"]
    assert recorded["actor"] == {"id": item["review"]["reviewer_id"], "kind": "human"}
    assert recorded["request_id"].startswith("ui/")
    # The task's own trail, on its page, shows the human's hand-in of the work item.
    await page.goto(site.page_url(f"/ui/spaces/{site.space['id']}/tasks/{done['work']}"))
    audit = page.locator("section[aria-labelledby=audit]")
    await expect(audit).to_contain_text("task.claimed")
    await expect(audit).to_contain_text("ada (human)")


async def test_hostile_text_is_shown_as_text_and_runs_nothing(context, site):
    task = await _task(site, HOSTILE, criteria='<img src="x" onerror="alert(2)">')
    page = await context.new_page()
    watch = Watch(page)
    await sign_in(page, site, site.owner_name)
    await page.goto(site.page_url(f"/ui/spaces/{site.space['id']}/projects/{site.project['id']}/"))
    await expect(_column(page, "ready")).to_contain_text(HOSTILE)
    await page.goto(site.page_url(f"/ui/spaces/{site.space['id']}/tasks/{task['id']}"))
    await expect(page.get_by_role("heading", level=1)).to_have_text(HOSTILE)
    await expect(page.locator("pre.text")).to_contain_text('<img src="x" onerror="alert(2)">')
    assert await page.locator("main img").count() == 0
    await page.wait_for_timeout(300)
    assert watch.dialogs == []
    assert watch.violations == []


async def test_the_viewer_sees_no_answer_form_and_a_forged_answer_is_refused(context, site):
    task = await _task(site, "parked work")
    decision = await _ok(
        await site.agent.post(
            f"{site.base}/tasks/{task['id']}/decisions",
            json={"question": "Ship it?", "options": ["yes"]},
        ),
        201,
    )
    page = await context.new_page()
    await sign_in(page, site, site.viewer_name)
    await page.goto(site.page_url(f"/ui/spaces/{site.space['id']}/decisions"))
    await expect(page.get_by_role("button", name="Answer")).to_have_count(0)
    # The viewer's own session, with its own CSRF token, posting the form anyway.
    csrf = await page.locator("input[name=csrf]").first.get_attribute("value")
    forged = await page.request.post(
        site.page_url(f"/ui/spaces/{site.space['id']}/decisions/{decision['id']}/answer"),
        form={"csrf": csrf or "", "answer": "yes"},
    )
    assert forged.status == 403
    shown = await _ok(await site.owner.get(f"{site.base}/decisions"))
    assert [d["state"] for d in shown["items"]] == ["pending"]


async def test_every_page_is_accessible_and_fits_from_320_px_light_and_dark(browser, site):
    task = await _task(site, "a task with a rather long title that has to wrap on a phone")
    claim = await _ok(await site.agent.post(f"{site.base}/tasks/{task['id']}/claim", json={}), 201)
    await _ok(
        await site.agent.post(
            f"{site.base}/tasks/{task['id']}/decisions",
            json={"question": "Which way?", "options": ["left", "right"]},
        ),
        201,
    )
    review = await _handed_in(site)
    space = f"/ui/spaces/{site.space['id']}"
    pages = {
        "review": f"{space}/reviews/{review['work']}",
        "overview": "/ui/",
        "space": f"{space}/",
        "board": f"{space}/projects/{site.project['id']}/",
        "task": f"{space}/tasks/{task['id']}",
        "decisions": f"{space}/decisions",
        "not-found": f"{space}/tasks/ta_nothing",
    }
    problems = await every_variant(
        browser,
        site,
        site.owner_name,
        pages,
        signed_out={"sign-in": "/ui/sign-in"},
        statuses={"not-found": 404},
    )
    assert claim["attempt"]["id"]
    assert problems == [], "\n".join(problems)


async def test_a_viewer_gets_no_task_action_and_a_stranger_gets_404_everywhere(
    browser, context, site
):
    task = await _task(site, "guarded work")
    page = await context.new_page()
    await sign_in(page, site, site.viewer_name)
    space = f"/ui/spaces/{site.space['id']}"
    await page.goto(site.page_url(f"{space}/tasks/{task['id']}"))
    await expect(page.get_by_role("heading", name="guarded work")).to_be_visible()
    await expect(page.get_by_role("heading", name="Actions")).to_have_count(0)
    csrf = await page.locator("input[name=csrf]").first.get_attribute("value")
    for action, form in (
        ("cancel", {"reason": "x"}),
        ("hold", {"strength": "stopped", "reason": "x"}),
    ):
        forged = await page.request.post(
            site.page_url(f"{space}/tasks/{task['id']}/{action}"), form={"csrf": csrf or "", **form}
        )
        assert forged.status == 403, action
    after = await _ok(await site.owner.get(f"{site.base}/tasks/{task['id']}"))
    assert (after["state"], after["held_by"]) == ("ready", [])

    await _ok(
        await site.admin.post(
            "/v1/principals", json={"kind": "human", "name": "eve", "password": PASSWORD}
        ),
        201,
    )
    stranger = await browser.new_context()
    try:
        eve = await stranger.new_page()
        await sign_in(eve, site, "eve")
        for path in (
            f"{space}/",
            f"{space}/projects/{site.project['id']}/",
            f"{space}/tasks/{task['id']}",
            f"{space}/decisions",
        ):
            answer = await eve.goto(site.page_url(path))
            assert answer is not None and answer.status == 404, path
            await expect(eve.locator("main")).not_to_contain_text("guarded work")
    finally:
        await stranger.close()


async def test_typing_pauses_a_live_page_and_without_its_stream_it_polls(context, site):
    task = await _task(site, "typed on")
    page = await context.new_page()
    await sign_in(page, site, site.owner_name)
    await page.goto(site.page_url(f"/ui/spaces/{site.space['id']}/tasks/{task['id']}"))
    freshness = page.locator("#freshness")
    await expect(freshness).to_contain_text("live", timeout=3000)
    reason = page.get_by_label("Reason").first
    await reason.fill("the customer withdrew the request")
    await page.get_by_role("heading", level=1).click()  # the field keeps its text, not the focus
    await _task(site, "an event in the space")
    await page.wait_for_timeout(1500)
    assert await reason.input_value() == "the customer withdrew the request"
    await expect(freshness).to_contain_text("paused while you edit")

    polled = await context.new_page()
    await polled.route("**/events", lambda route: route.abort())
    await polled.goto(
        site.page_url(f"/ui/spaces/{site.space['id']}/projects/{site.project['id']}/")
    )
    await expect(polled.locator("#freshness")).to_contain_text("refreshing every 5 s")
    await _task(site, "arrives by polling")
    await expect(_column(polled, "ready")).to_contain_text("arrives by polling", timeout=7000)
