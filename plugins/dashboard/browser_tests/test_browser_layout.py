"""Every page of the dashboard's operator surface in a real browser:
accessible (axe: no serious or critical violation), no sideways scrolling
from 320 px wide, light and dark, with a screenshot of each at desktop and
phone width kept as evidence under ``.artifacts/dashboard/<engine>/``."""

from __future__ import annotations

from typing import Any

from .conftest import Site, _ok, every_variant
from .test_browser_operations import release


async def _setting(site: Site) -> dict[str, str]:
    """A space with some of everything, and the path of each page."""
    admin = await _ok(await site.admin.get(f"/v1/principals/{site.admin_name}"))
    bot = await _ok(await site.admin.get("/v1/principals/bot"))
    await _ok(await site.owner.put(f"{site.base}/members/{admin['id']}", json={"role": "admin"}))
    first: dict[str, Any] = await _ok(
        await site.owner.post(
            f"{site.base}/tasks",
            json={"project": "main", "title": "a task whose long title has to wrap on a phone"},
        ),
        201,
    )
    await _ok(
        await site.owner.post(
            f"{site.base}/tasks",
            json={"project": "main", "title": "then this", "prerequisites": [first["id"]]},
        ),
        201,
    )
    await _ok(
        await site.admin.post(
            "/v1/catalog/lint-helpers/releases", content=release("lint-helpers", "1.0.0")
        ),
        201,
    )
    await _ok(
        await site.owner.put(f"{site.base}/plugins/lint-helpers", json={"version": "1.0.0"}),
        201,
    )
    await _ok(
        await site.owner.post(
            f"{site.base}/holds",
            json={
                "scope": "project",
                "target": site.project["id"],
                "strength": "suspended",
                "reason": "a release freeze",
            },
        ),
        201,
    )
    await _ok(
        await site.admin.post("/v1/tokens", json={"principal_id": bot["id"], "name": "ci"}), 201
    )
    space = f"/ui/spaces/{site.space['id']}"
    return {
        "new-task": f"{space}/projects/{site.project['id']}/tasks/new",
        "edit-task": f"{space}/tasks/{first['id']}/edit",
        "board-editable": f"{space}/projects/{site.project['id']}/",
        "plugins": f"{space}/plugins",
        "catalog": "/ui/catalog",
        "catalog-plugin": "/ui/catalog/lint-helpers",
        "audit": f"{space}/audit",
        "server-audit": "/ui/audit",
        "diagnostics": "/ui/diagnostics",
        "principals": "/ui/principals",
        "principal": f"/ui/principals/{bot['id']}",
        "tokens": "/ui/tokens",
        "members": f"{space}/members",
        "holds": f"{space}/holds",
    }


async def test_every_operator_page_is_accessible_and_fits_from_320_px_light_and_dark(browser, site):
    pages = await _setting(site)
    problems = await every_variant(browser, site, site.admin_name, pages)
    assert problems == [], "\n".join(problems)
