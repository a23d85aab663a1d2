"""Steps that drive the dashboard in a real browser: Playwright for Python
with Debian's Chromium, launched by its path (``BUILDMAX_CHROMIUM``, by
default ``/usr/bin/chromium``), against the journey's server.

The agent's side goes over HTTP with the agent's token, as an agent's
would; the person's side only through the browser."""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

from buildmax_graders.run import JourneyRun, StepFailed

CHROMIUM = os.environ.get("BUILDMAX_CHROMIUM", "/usr/bin/chromium")
#: The diff the agent hands in: LIMIT is line 3 of the new file.
DIFF = """--- a/src/parser.py
+++ b/src/parser.py
@@ -1,3 +1,4 @@
 import re
-PATTERN = re.compile("a+")
+PATTERN = re.compile("a*")
+LIMIT = 10
 def parse(text):
"""


async def _ok(answer: Any, status: int, what: str) -> Any:
    if answer.status_code != status:
        raise StepFailed(f"{what}: {answer.status_code} {answer.text[:300]}")
    return answer.json() if answer.content else None


async def dashboard_review(
    run: JourneyRun,
    *,
    space: str,
    person: str,
    password: str,
    author: str,
    task: str,
    parked: str,
    finding: str,
    live_within_ms: int = 2000,
) -> dict[str, Any]:
    """``person`` signs in with ``password`` and opens the board of
    ``task``'s project; ``author`` claims ``task`` over HTTP and the card
    must move to the claimed column without a reload within
    ``live_within_ms``; the author hands in a diff; the person records an
    approving human review with ``finding`` on line 3 of the diff (through
    the line's button); the author asks a decision on ``parked`` and the
    person answers it ("yes") in the browser.

    Saves what the browser showed: ``claim_seen_ms``, ``work`` (the review
    work item), ``decision``, and ``dialogs`` (a dialog would be a script
    that should not have run)."""
    from playwright.async_api import async_playwright, expect

    if shutil.which(CHROMIUM) is None:
        raise StepFailed(
            f"no Chromium at {CHROMIUM}: install Debian's chromium or set BUILDMAX_CHROMIUM"
        )
    run.secret(password)
    base, url = f"/v1/spaces/{space}", run.url()
    agent = {"Authorization": f"Bearer {run.token(author)}"}
    http = run.http
    shown = await _ok(await http.get(f"{url}{base}/tasks/{task}", headers=agent), 200, "task")
    dialogs: list[str] = []
    result: dict[str, Any] = {"dialogs": dialogs}
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox"], headless=True
        )
        try:
            page = await (await browser.new_context()).new_page()
            page.on("dialog", lambda dialog: dialogs.append(dialog.message))
            await page.goto(f"{url}/ui/sign-in")
            await page.get_by_label("Name").fill(person)
            await page.get_by_label("Password").fill(password)
            await page.get_by_role("button", name="Sign in").click()
            await page.wait_for_url(f"{url}/ui/")

            board = f"{url}/ui/spaces/{space}/projects/{shown['project_id']}/"
            await page.goto(board)
            await expect(page.locator("#freshness")).to_contain_text("live", timeout=5000)
            claimed = page.locator("section.column[aria-labelledby='col-claimed']")
            started = time.monotonic()
            claim = await _ok(
                await http.post(f"{url}{base}/tasks/{task}/claim", json={}, headers=agent),
                201,
                "claim",
            )
            await expect(claimed).to_contain_text(shown["title"], timeout=live_within_ms)
            result["claim_seen_ms"] = round((time.monotonic() - started) * 1000)

            attempt = claim["attempt"]
            artifact = await _ok(
                await http.post(
                    f"{url}{base}/artifacts",
                    params={
                        "name": "change.diff",
                        "attempt": attempt["id"],
                        "generation": str(attempt["generation"]),
                    },
                    content=DIFF.encode(),
                    headers={**agent, "Content-Type": "text/x-diff"},
                ),
                201,
                "upload",
            )
            submitted = await _ok(
                await http.post(
                    f"{url}{base}/attempts/{attempt['id']}/submit",
                    json={
                        "generation": attempt["generation"],
                        "summary": "parses empty input",
                        "artifacts": [artifact["id"]],
                    },
                    headers=agent,
                ),
                201,
                "submit",
            )
            work = submitted["work_ids"][0]
            result["work"] = work

            await page.goto(f"{url}/ui/spaces/{space}/")
            await page.get_by_role("link", name=f"review of {task}").click()
            await page.get_by_role("button", name="Add a finding on src/parser.py line 3").click()
            await page.keyboard.type(finding)
            await page.get_by_label("Approve").check()
            await page.get_by_label("Summary").fill("reads well")
            await page.get_by_role("button", name="Record review").click()
            await expect(page.get_by_role("heading", name="Recorded")).to_be_visible()

            decision = await _ok(
                await http.post(
                    f"{url}{base}/tasks/{parked}/decisions",
                    json={"question": "Ship it on Friday?", "options": ["yes", "no"]},
                    headers=agent,
                ),
                201,
                "ask a decision",
            )
            result["decision"] = decision["id"]
            await page.goto(f"{url}/ui/spaces/{space}/decisions")
            await page.get_by_label("yes").check()
            await page.get_by_role("button", name="Answer").click()
            await expect(page.get_by_role("status")).to_contain_text(decision["id"])
        finally:
            await browser.close()
    return result
