"""A space's plugins and the catalog in the browser: activations with
their facts and capability reports, activation, pin moves, suspension,
curation, publishing relayed to the catalog, and eligibility. Each change
is the marketplace plugin's route as the person (its role check, its
audit); a refused form changes nothing."""

from __future__ import annotations

import io
import tarfile
from typing import Any

from buildmax.testing import call

from .conftest import Team, set_password, signed_in


def release(name: str, version: str, hooks: bool = False) -> bytes:
    """A release archive of ``name`` at ``version`` with one skill (and a
    hook, which makes it start a process)."""
    manifest = f'name = "{name}"\nversion = "{version}"\ndescription = "helps"\n'
    manifest += '[contributes]\nskills = ["fix-lint"]\n'
    files = {"skills/fix-lint/SKILL.md": "# Fix lint\n"}
    if hooks:
        manifest += "hooks = true\n"
        files["hooks/hooks.toml"] = '[[hooks]]\nevent = "PreToolUse"\ncommand = "bin/check"\n'
        files["hooks/bin/check"] = "#!/bin/sh\n"
    files["buildmax-plugin.toml"] = manifest
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as archive:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


async def _admin(app: Any, make_principal: Any) -> Any:
    admin = await make_principal("human", system_role="admin")
    await set_password(app, admin)
    return admin


async def _publish(client: Any, who: Any, name: str, version: str, **kw: Any) -> Any:
    return await call(
        client,
        "POST",
        f"/v1/catalog/{name}/releases",
        who,
        data=release(name, version, **kw),
        expect=201,
    )


async def _plugins(client: Any, team: Team) -> dict[str, Any]:
    shown: dict[str, Any] = await call(
        client, "GET", f"{team.base}/plugins", team.owner, expect=200
    )
    return shown


async def _activated(client: Any, team: Team, admin: Any) -> None:
    """lint-helpers 1.0.0, published and activated in the team's space."""
    await _publish(client, admin, "lint-helpers", "1.0.0")
    await call(
        client,
        "PUT",
        f"{team.base}/plugins/lint-helpers",
        team.owner,
        json={"version": "1.0.0"},
        expect=201,
    )


def _ui(team: Team, *rest: str) -> str:
    return "/".join([f"/ui/spaces/{team.space.id}", *rest])


async def test_an_owner_activates_switches_curation_suspends_and_resumes(
    app, client, team, browser, make_principal, audit_log
):
    admin = await _admin(app, make_principal)
    first = await _publish(client, admin, "lint-helpers", "1.0.0")
    b = await signed_in(browser, team.owner)
    page = await b.text(_ui(team, "plugins"))
    assert "Activate lint-helpers" in page and "Curation: open" in page

    answer = await b.post(
        _ui(team, "plugins", "activate"),
        {"csrf": b.csrf, "name": "lint-helpers", "version": "1.0.0"},
    )
    assert answer.status_code == 303 and answer.headers["Location"].endswith("?done=activated")
    [activation] = (await _plugins(client, team))["items"]
    assert (activation["version"], activation["sha256"], activation["origin"]) == (
        "1.0.0",
        first["sha256"],
        "curated",
    )
    [event] = audit_log.of("activation.created")
    assert event.actor_id == team.owner.id and (event.request_id or "").startswith("ui/")

    await _publish(client, admin, "lint-helpers", "1.1.0")
    page = await b.text(_ui(team, "plugins"))
    for fact in (
        f"sha256:{first['sha256'][:12]}",
        "activated, unused",
        "newer release available: 1.1.0",
        "fix-lint",
        f"by {team.owner.name}",
        "Move the pin to 1.1.0",
    ):
        assert fact in page, fact

    curated = await b.post(_ui(team, "curation"), {"csrf": b.csrf, "mode": "curated"})
    assert curated.status_code == 303
    assert (await _plugins(client, team))["mode"] == "curated"
    [changed] = audit_log.of("curation.changed")
    assert changed.actor_id == team.owner.id

    suspended = await b.post(_ui(team, "plugins", "lint-helpers", "suspend"), {"csrf": b.csrf})
    assert suspended.status_code == 303
    assert (await _plugins(client, team))["items"][0]["enabled"] is False
    [stopped] = audit_log.of("activation.suspended")
    assert stopped.actor_id == team.owner.id
    assert "suspended" in await b.text(_ui(team, "plugins"))
    resumed = await b.post(_ui(team, "plugins", "lint-helpers", "resume"), {"csrf": b.csrf})
    assert resumed.status_code == 303
    assert (await _plugins(client, team))["items"][0]["enabled"] is True

    moved = await b.post(
        _ui(team, "plugins", "activate"),
        {"csrf": b.csrf, "name": "lint-helpers", "version": "1.1.0"},
    )
    assert moved.status_code == 303
    assert (await _plugins(client, team))["items"][0]["version"] == "1.1.0"
    assert len(audit_log.of("activation.pin_moved")) == 1


async def test_a_refused_activation_shows_why_and_changes_nothing(
    app, client, team, browser, make_principal
):
    admin = await _admin(app, make_principal)
    await _publish(client, admin, "runner", "1.0.0", hooks=True)
    b = await signed_in(browser, team.owner)
    page = await b.text(_ui(team, "plugins"))
    assert "1.0.0 (not eligible)" in page
    refused = await b.post(
        _ui(team, "plugins", "activate"), {"csrf": b.csrf, "name": "runner", "version": "1.0.0"}
    )
    assert refused.status_code == 422
    assert "activation" in (await refused.get_data(as_text=True)).lower()
    assert (await _plugins(client, team))["items"] == []
    bad_name = await b.post(
        _ui(team, "plugins", "activate"), {"csrf": b.csrf, "name": "../x", "version": "1"}
    )
    assert bad_name.status_code == 422


async def test_a_viewer_sees_no_control_and_forged_posts_change_nothing(
    app, client, team, browser, make_principal, audit_log
):
    admin = await _admin(app, make_principal)
    await _activated(client, team, admin)
    b = await signed_in(browser, team.viewer)
    page = await b.text(_ui(team, "plugins"))
    assert "lint-helpers" in page
    for control in ("Switch to", "Suspend", "Activate a release"):
        assert control not in page, control
    catalog = await b.text("/ui/catalog")
    assert "Publish a release" not in catalog
    before = (await _plugins(client, team), len(audit_log.events))
    forged = [
        (_ui(team, "plugins", "activate"), {"name": "lint-helpers", "version": "1.0.0"}),
        (_ui(team, "plugins", "lint-helpers", "suspend"), {}),
        (_ui(team, "curation"), {"mode": "curated"}),
    ]
    for path, form in forged:
        answer = await b.post(path, {"csrf": b.csrf, **form})
        assert answer.status_code == 403, path
    published = await b.client.post(
        "/ui/catalog/publish?name=lint-helpers",
        data=release("lint-helpers", "9.0.0"),
        headers={"X-CSRF-Token": b.csrf, "Content-Type": "application/octet-stream"},
    )
    assert published.status_code == 403
    shown = await call(client, "GET", "/v1/catalog/lint-helpers", admin, expect=200)
    assert [r["version"] for r in shown["releases"]] == ["1.0.0"]
    assert (await _plugins(client, team), len(audit_log.events)) == before


async def test_every_plugin_form_refuses_a_missing_or_wrong_csrf_token(
    app, client, team, browser, make_principal, audit_log
):
    admin = await _admin(app, make_principal)
    await _publish(client, admin, "lint-helpers", "1.0.0", hooks=True)
    b = await signed_in(browser, admin)
    before = len(audit_log.events)
    forms = [
        (_ui(team, "plugins", "activate"), {"name": "lint-helpers", "version": "1.0.0"}),
        (_ui(team, "plugins", "lint-helpers", "suspend"), {}),
        (_ui(team, "curation"), {"mode": "curated"}),
        ("/ui/catalog/lint-helpers/releases/1.0.0/eligibility", {"eligible": "true"}),
    ]
    for path, form in forms:
        for token in ({}, {"csrf": "0" * 64}):
            answer = await b.post(path, {**form, **token})
            assert answer.status_code == 403, (path, token)
    for headers in ({}, {"X-CSRF-Token": "0" * 64}):
        answer = await b.client.post(
            "/ui/catalog/publish?name=lint-helpers",
            data=release("lint-helpers", "2.0.0"),
            headers={"Content-Type": "application/octet-stream", **headers},
        )
        assert answer.status_code == 403
    assert len(audit_log.events) == before


async def test_an_admin_publishes_through_the_page_and_marks_a_release_eligible(
    app, client, team, browser, make_principal, audit_log
):
    admin = await _admin(app, make_principal)
    b = await signed_in(browser, admin)
    assert "Publish a release" in await b.text("/ui/catalog")
    archive = release("runner", "1.0.0", hooks=True)
    answer = await b.client.post(
        "/ui/catalog/publish?name=runner",
        data=archive,
        headers={"X-CSRF-Token": b.csrf, "Content-Type": "application/octet-stream"},
    )
    assert answer.status_code == 303
    assert answer.headers["Location"] == "/ui/catalog/runner?done=published&version=1.0.0"
    [published] = (await call(client, "GET", "/v1/catalog/runner", admin, expect=200))["releases"]
    [event] = audit_log.of("catalog.release.published")
    assert event.actor_id == admin.id and (event.request_id or "").startswith("ui/")
    page = await b.text(answer.headers["Location"])
    assert "Published: runner 1.0.0." in page and "PreToolUse" in page and "not eligible" in page

    stale = await b.post(
        "/ui/catalog/runner/releases/1.0.0/eligibility",
        {"csrf": b.csrf, "eligible": "true", "sha256": "0" * 64},
    )
    assert stale.status_code == 409
    marked = await b.post(
        "/ui/catalog/runner/releases/1.0.0/eligibility",
        {"csrf": b.csrf, "eligible": "true", "sha256": published["sha256"]},
    )
    assert marked.status_code == 303
    shown = await call(client, "GET", "/v1/catalog/runner/releases/1.0.0", admin, expect=200)
    assert shown["eligible"] is True

    broken = await b.client.post(
        "/ui/catalog/publish?name=runner",
        data=b"not an archive",
        headers={"X-CSRF-Token": b.csrf, "Content-Type": "application/octet-stream"},
    )
    assert broken.status_code == 422
    assert "package" in (await broken.get_data(as_text=True)).lower()
    bad_name = await b.client.post(
        "/ui/catalog/publish?name=Bad%20Name",
        data=archive,
        headers={"X-CSRF-Token": b.csrf, "Content-Type": "application/octet-stream"},
    )
    assert bad_name.status_code == 422


async def test_an_operator_publishes_but_may_not_mark_eligibility(
    app, client, team, browser, make_principal, audit_log
):
    operator = await make_principal("human", system_role="operator")
    await set_password(app, operator)
    b = await signed_in(browser, operator)
    answer = await b.client.post(
        "/ui/catalog/publish?name=runner",
        data=release("runner", "1.0.0", hooks=True),
        headers={"X-CSRF-Token": b.csrf, "Content-Type": "application/octet-stream"},
    )
    assert answer.status_code == 303
    page = await b.text("/ui/catalog/runner")
    assert "mark 1.0.0 eligible" not in page
    shown = await call(client, "GET", "/v1/catalog/runner/releases/1.0.0", operator, expect=200)
    forged = await b.post(
        "/ui/catalog/runner/releases/1.0.0/eligibility",
        {"csrf": b.csrf, "eligible": "true", "sha256": shown["sha256"]},
    )
    assert forged.status_code == 403
    again = await call(client, "GET", "/v1/catalog/runner/releases/1.0.0", operator, expect=200)
    assert again["eligible"] is False


async def test_a_publish_from_another_site_or_an_unknown_move_is_refused(
    app, client, team, browser, make_principal, audit_log
):
    admin = await _admin(app, make_principal)
    b = await signed_in(browser, admin)
    answer = await b.client.post(
        "/ui/catalog/publish?name=lint-helpers",
        data=release("lint-helpers", "1.0.0"),
        headers={
            "X-CSRF-Token": b.csrf,
            "Content-Type": "application/octet-stream",
            "Origin": "https://evil.test",
        },
    )
    assert answer.status_code == 403
    assert (await call(client, "GET", "/v1/catalog", admin, expect=200))["items"] == []
    await _activated(client, team, admin)
    before = len(audit_log.events)
    unknown = await b.post(_ui(team, "plugins", "lint-helpers", "delete"), {"csrf": b.csrf})
    assert unknown.status_code == 422
    assert len(audit_log.events) == before
