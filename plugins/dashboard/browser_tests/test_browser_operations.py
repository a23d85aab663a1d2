"""The dashboard as an operator surface, in a real browser: editing the
board (a new task with a prerequisite, a stale edit, a drag to another
column), a space's plugins (activation, curation, suspension), publishing
with a progress bar, and a viewer who gets none of it."""

from __future__ import annotations

import io
import re
import secrets
import tarfile
from pathlib import Path
from typing import Any

import httpx
from playwright.async_api import Page, expect

from .conftest import Site, _ok, sign_in


async def _task(site: Site, title: str, **extra: Any) -> dict[str, Any]:
    body = {"project": "main", "title": title, **extra}
    task: dict[str, Any] = await _ok(await site.owner.post(f"{site.base}/tasks", json=body), 201)
    return task


def release(name: str, version: str) -> bytes:
    """A release archive of ``name`` at ``version`` with one skill."""
    files = {
        "buildmax-plugin.toml": f'name = "{name}"\nversion = "{version}"\n'
        'description = "helps"\n[contributes]\nskills = ["fix-lint"]\n',
        # Big enough for the progress bar to move; random, so it does not
        # compress like a bomb.
        "skills/fix-lint/SKILL.md": "# Fix lint\n" + secrets.token_hex(150_000),
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


async def _audited(site: Site, action: str) -> list[dict[str, Any]]:
    page = await _ok(await site.owner.get(f"{site.base}/audit", params={"action": action}))
    items: list[dict[str, Any]] = page["items"]
    return items


async def _name_of(site: Site, name: str) -> str:
    found = await _ok(await site.admin.get(f"/v1/principals/{name}"))
    principal_id: str = found["id"]
    return principal_id


async def test_a_task_with_a_prerequisite_is_made_in_the_browser_and_a_stale_edit_is_refused(
    context, site
):
    first = await _task(site, "lay the foundation")
    page = await context.new_page()
    await sign_in(page, site, site.owner_name)
    space = f"/ui/spaces/{site.space['id']}"
    await page.goto(site.page_url(f"{space}/projects/{site.project['id']}/"))
    await page.get_by_role("link", name="New task").click()
    await page.get_by_label("Title").fill("build the walls")
    await page.get_by_label("Body").fill("first line\nsecond line")
    await page.get_by_label("Acceptance criteria").fill("they stand")
    await page.get_by_label(re.compile("lay the foundation")).check()
    await page.get_by_role("button", name="Create the task").click()
    await expect(page.get_by_role("status")).to_contain_text("Done: created.")
    task_id = page.url.split("/tasks/")[1].split("?")[0]
    made = await _ok(await site.owner.get(f"{site.base}/tasks/{task_id}"))
    assert (made["title"], made["criteria"], made["state"]) == (
        "build the walls",
        "they stand",
        "open",
    )
    deps = await _ok(await site.owner.get(f"{site.base}/tasks/{task_id}/dependencies"))
    assert [p["id"] for p in deps["prerequisites"]] == [first["id"]]

    await page.get_by_role("link", name="Edit the task and its prerequisites").click()
    await page.get_by_role("button", name="Save").click()  # untouched: nothing to save
    await expect(page.get_by_role("status")).to_contain_text("Nothing changed")
    await _ok(
        await site.owner.patch(
            f"{site.base}/tasks/{task_id}",
            json={"expected_revision": 1, "title": "build the walls first"},
        )
    )
    await page.get_by_label("Title").fill("build the roof")
    await page.get_by_role("button", name="Save").click()
    await expect(
        page.get_by_role("heading", name="This task changed since you opened it")
    ).to_be_visible()
    await expect(page.locator("main")).to_contain_text("not saved")
    after = await _ok(await site.owner.get(f"{site.base}/tasks/{task_id}"))
    assert (after["title"], after["revision"]) == ("build the walls first", 2)
    assert await page.get_by_label("Title").input_value() == "build the roof"


async def test_a_card_dragged_to_canceled_asks_its_reason_and_cancels(context, site):
    task = await _task(site, "drag me")
    page = await context.new_page()
    await sign_in(page, site, site.owner_name)
    board = f"/ui/spaces/{site.space['id']}/projects/{site.project['id']}/"
    await page.goto(site.page_url(board))
    card = page.locator("li.card", has_text="drag me")
    await card.drag_to(page.locator("section.column[data-state=canceled]"))
    reason = card.get_by_label("Reason")
    await expect(reason).to_be_focused()
    await reason.fill("not needed after all")
    await reason.press("Enter")
    await page.wait_for_url(re.compile(r"done=cancel"))
    shown = await _ok(await site.owner.get(f"{site.base}/tasks/{task['id']}"))
    assert (shown["state"], shown["outcome_reason"]) == ("canceled", "not needed after all")
    await expect(
        page.locator("section.column[data-state=canceled]").locator("li.card", has_text="drag me")
    ).to_be_visible()


async def test_plugins_are_activated_curated_and_suspended_in_the_browser(context, site):
    await _ok(
        await site.admin.post(
            "/v1/catalog/lint-helpers/releases", content=release("lint-helpers", "1.0.0")
        ),
        201,
    )
    page = await context.new_page()
    await sign_in(page, site, site.owner_name)
    await page.goto(site.page_url(f"/ui/spaces/{site.space['id']}/plugins"))
    await page.get_by_role("button", name="Activate lint-helpers").click()
    await expect(page.get_by_role("status")).to_contain_text("The release is activated.")
    await expect(page.locator("main")).to_contain_text("activated, unused")
    await page.get_by_role("button", name="Switch to curated").click()
    await expect(page.get_by_role("heading", name="Curation: curated")).to_be_visible()
    await page.get_by_role("button", name="Suspend lint-helpers").click()
    await expect(page.get_by_role("button", name="Resume lint-helpers")).to_be_visible()

    shown = await _ok(await site.owner.get(f"{site.base}/plugins"))
    assert shown["mode"] == "curated"
    [activation] = shown["items"]
    assert (activation["version"], activation["enabled"]) == ("1.0.0", False)
    ada = await _name_of(site, site.owner_name)
    for action in ("activation.created", "curation.changed", "activation.suspended"):
        [event] = await _audited(site, action)
        assert event["actor"]["id"] == ada, (action, event)
        assert event["request_id"].startswith("ui/"), (action, event)


async def test_a_release_is_published_with_a_progress_bar(context, site, tmp_path: Path):
    archive = tmp_path / "lint-helpers-2.0.0.tar.gz"
    archive.write_bytes(release("lint-helpers", "2.0.0"))
    page = await context.new_page()
    await sign_in(page, site, site.admin_name, "/ui/catalog")
    await page.get_by_label("Plugin name").fill("lint-helpers")
    await page.get_by_label("Release archive").set_input_files(str(archive))
    await page.get_by_role("button", name="Publish").click()
    await page.wait_for_url(re.compile(r"/ui/catalog/lint-helpers\?done=published"))
    await expect(page.get_by_role("status")).to_contain_text("Published: lint-helpers 2.0.0.")
    shown = await _ok(await site.admin.get("/v1/catalog/lint-helpers"))
    assert [r["version"] for r in shown["releases"]] == ["2.0.0"]

    await page.goto(site.page_url("/ui/catalog"))
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes(b"not an archive")
    await page.get_by_label("Plugin name").fill("lint-helpers")
    await page.get_by_label("Release archive").set_input_files(str(broken))
    await page.get_by_role("button", name="Publish").click()
    await expect(page.locator("#p-status")).to_contain_text("Not published (422)")
    await expect(page.locator("#p-progress")).to_have_attribute("value", "100")


async def _csrf(page: Page) -> str:
    token = await page.locator("input[name=csrf]").first.get_attribute("value")
    assert token
    return token


async def test_a_viewer_sees_no_editing_or_plugin_control_and_forged_posts_are_refused(
    context, site
):
    task = await _task(site, "guarded")
    await _ok(
        await site.admin.post(
            "/v1/catalog/lint-helpers/releases", content=release("lint-helpers", "1.0.0")
        ),
        201,
    )
    page = await context.new_page()
    await sign_in(page, site, site.viewer_name)
    space = f"/ui/spaces/{site.space['id']}"
    await page.goto(site.page_url(f"{space}/projects/{site.project['id']}/"))
    await expect(page.get_by_role("link", name="New task")).to_have_count(0)
    await expect(page.locator("details.move")).to_have_count(0)
    await expect(page.locator("form#bulk")).to_have_count(0)
    await page.goto(site.page_url(f"{space}/plugins"))
    await expect(page.get_by_role("button")).to_have_count(1)  # "Sign out" only
    await page.goto(site.page_url("/ui/catalog"))
    await expect(page.get_by_role("heading", name="Publish a release")).to_have_count(0)
    csrf = await _csrf(page)
    forged = {
        f"{space}/projects/{site.project['id']}/tasks/new": {"title": "sneaky"},
        f"{space}/tasks/{task['id']}/edit": {"expected_revision": "1", "title": "x"},
        f"{space}/projects/{site.project['id']}/bulk": {"action": "cancel", "task": task["id"]},
        f"{space}/plugins/activate": {"name": "lint-helpers", "version": "1.0.0"},
        f"{space}/curation": {"mode": "curated"},
    }
    for path, form in forged.items():
        answer = await page.request.post(site.page_url(path), form={"csrf": csrf, **form})
        assert answer.status == 403, path
        without = await page.request.post(site.page_url(path), form=form)
        assert without.status == 403, path
    published = await page.request.post(
        site.page_url("/ui/catalog/publish?name=lint-helpers"),
        data=release("lint-helpers", "9.0.0"),
        headers={"X-CSRF-Token": csrf, "Content-Type": "application/octet-stream"},
    )
    assert published.status == 403
    assert (await _ok(await site.owner.get(f"{site.base}/plugins")))["items"] == []
    tasks = await _ok(await site.owner.get(f"{site.base}/tasks"))
    assert [(t["title"], t["state"]) for t in tasks["items"]] == [("guarded", "ready")]


async def test_a_principal_and_its_token_are_made_in_the_browser_shown_once_and_revoked(
    context, site
):
    page = await context.new_page()
    await sign_in(page, site, site.admin_name, "/ui/principals")
    await page.get_by_label("Kind").select_option("agent")
    await page.get_by_label(re.compile("^Name")).fill("ci-bot")
    await page.get_by_role("button", name="Create the principal").click()
    await expect(page.get_by_role("heading", level=1)).to_have_text("ci-bot")
    made = await _ok(await site.admin.get("/v1/principals/ci-bot"))
    assert made["kind"] == "agent"

    await page.get_by_label("Name", exact=True).fill("deploy")
    await page.get_by_role("button", name="Create a token").click()
    secret = await page.get_by_label("Its secret").input_value()
    assert secret.startswith("bmx_")
    await context.grant_permissions(["clipboard-read", "clipboard-write"])
    await page.get_by_role("button", name="Copy the secret").click()
    await expect(page.get_by_role("button", name="Copied")).to_be_visible()
    assert await page.evaluate("navigator.clipboard.readText()") == secret
    await expect(page.locator("main")).to_contain_text("will not be shown again")
    async with httpx.AsyncClient(
        base_url=site.url, headers={"Authorization": f"Bearer {secret}"}
    ) as bot:
        assert (await _ok(await bot.get("/v1/principals/me")))["name"] == "ci-bot"
        await page.goto(site.page_url(f"/ui/principals/{made['id']}"))
        await expect(page.get_by_label("Its secret")).to_have_count(0)
        assert secret not in await page.content()
        await page.get_by_role("button", name="Revoke deploy").click()
        await expect(page.locator("main")).to_contain_text("revoked")
        assert (await bot.get("/v1/principals/me")).status_code == 401
    audited = await _ok(
        await site.admin.get("/v1/audit", params={"action": "token.", "limit": "10"})
    )
    sam = await _name_of(site, site.admin_name)
    actions = {(e["action"], e["actor"]["id"]) for e in audited["items"]}
    assert {("token.created", sam), ("token.revoked", sam)} <= actions


async def test_a_viewer_gets_no_administration_control_and_forged_posts_are_refused(context, site):
    page = await context.new_page()
    await sign_in(page, site, site.viewer_name)
    space = f"/ui/spaces/{site.space['id']}"
    await page.goto(site.page_url(f"{space}/members"))
    await expect(page.get_by_role("heading", name="Add a member")).to_have_count(0)
    await page.goto(site.page_url(f"{space}/holds"))
    await expect(page.get_by_role("heading", name="Place a hold")).to_have_count(0)
    answer = await page.goto(site.page_url("/ui/principals"))
    assert answer is not None and answer.status == 403
    await page.goto(site.page_url(f"{space}/members"))
    csrf = await _csrf(page)
    vic = await _name_of(site, site.viewer_name)
    forged = {
        f"{space}/members": {"principal": site.viewer_name, "role": "owner"},
        f"{space}/members/remove": {"principal": site.owner_name},
        f"{space}/holds": {"target": "", "strength": "stopped", "reason": "x"},
        "/ui/principals": {"kind": "human", "name": "mallory", "password": "x" * 20},
        f"/ui/principals/{vic}/disabled": {"disabled": "false"},
    }
    for path, form in forged.items():
        answer = await page.request.post(site.page_url(path), form={"csrf": csrf, **form})
        assert answer.status in (403, 404), (path, answer.status)
        without = await page.request.post(site.page_url(path), form=form)
        assert without.status == 403, path
    members = await _ok(await site.owner.get(f"{site.base}/members"))
    roles = {m["name"]: m["role"] for m in members["items"]}
    assert (roles[site.viewer_name], roles[site.owner_name]) == ("viewer", "owner")
    assert (await _ok(await site.owner.get(f"{site.base}/holds")))["items"] == []
    assert (await site.admin.get("/v1/principals/mallory")).status_code == 404


async def test_a_card_moves_by_keyboard_alone(context, site):
    task = await _task(site, "keyboard only")
    page = await context.new_page()
    await sign_in(page, site, site.owner_name)
    await page.goto(site.page_url(f"/ui/spaces/{site.space['id']}/projects/{site.project['id']}/"))
    card = page.locator("li.card", has_text="keyboard only")
    await card.locator("summary").focus()
    await page.keyboard.press("Enter")
    await page.keyboard.press("Tab")
    await expect(card.get_by_label("Reason")).to_be_focused()
    await page.keyboard.type("done by hand")
    await page.keyboard.press("Enter")
    await page.wait_for_url(re.compile(r"done=cancel"))
    shown = await _ok(await site.owner.get(f"{site.base}/tasks/{task['id']}"))
    assert shown["state"] == "canceled"
