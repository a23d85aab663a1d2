"""The plugin releases agent runs load, in the browser: a space's
activations and curation mode, and the catalog with its capability reports
and publishing.

Read through the marketplace plugin's routes as the signed-in person, and
changed through them: space owners and admins activate a release, move a
pin, suspend, resume and switch curation; system admins and operators
publish (the page's script streams the archive here, with a progress bar,
and this relays it chunk by chunk to the publish route); system admins
mark a release eligible for unattended use after reading its report. Each
is the route's decision and its audit event, with the person as actor.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any
from urllib.parse import quote, urlencode

from quart import Response, request

from buildmax.internal import InternalApi
from buildmax.problems import Problem, ValidationFailed
from buildmax.streaming import allow_body

from .session import checked_form, checked_upload
from .web import (
    api,
    blueprint,
    html,
    page,
    principal_names,
    redirect,
    render,
    signed_in,
    space_path,
    ui_path,
)

#: Plugins of the catalog a page lists.
CATALOG_PAGE = 100
#: The most an upload may bring through the dashboard; the publish route
#: refuses sooner, at its own limit (``max_package_bytes``).
MAX_UPLOAD_BYTES = 1024 * 1024 * 1024
#: A plugin's name as the catalog writes it (a manifest's rule).
_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
#: What the plugins page says was just done.
_DONE = ("activated", "suspended", "resumed", "curation")


def _catalog_path(name: str, *rest: str) -> str:
    return "/".join([f"/v1/catalog/{quote(name, safe='')}", *(quote(r, safe="") for r in rest)])


async def _names(space: str) -> dict[str, str]:
    """Who is who in ``space`` (principal id to name), for "who and when"."""
    members = await api().get(space_path(space, "members"), {"limit": "200"})
    return {m["principal_id"]: m["name"] for m in members["items"]}


async def _report(reader: InternalApi, name: str, version: str) -> dict[str, Any] | None:
    """A release's capability report, or ``None`` when the catalog does not
    answer it (a release gone from it)."""
    try:
        release = await reader.get(_catalog_path(name, "releases", version))
    except Problem:
        return None
    report: dict[str, Any] = release["report"]
    return report


@blueprint.get("/ui/spaces/<space>/plugins")
@page
async def plugins_page(space: str) -> Response:
    """A space's curation mode and activations (version, digest, origin,
    who and when, the capability report, unused, newer release, yanked or
    archived), its agents' names, and the catalog to activate from."""
    return await _plugins_page(space, problem=None)


async def _plugins_page(space: str, problem: Problem | None) -> Response:
    reader = api()
    shown_space, activations, catalog, names = await asyncio.gather(
        reader.get(space_path(space)),
        reader.get(space_path(space, "plugins")),
        reader.get("/v1/catalog", {"limit": str(CATALOG_PAGE)}),
        _names(space),
    )
    reports = await asyncio.gather(
        *(_report(reader, a["name"], a["version"]) for a in activations["items"])
    )
    done = request.args.get("done")
    body = await render(
        "plugins.html",
        space=shown_space,
        mode=activations["mode"],
        activations=list(zip(activations["items"], reports, strict=True)),
        agents=activations["agents"],
        catalog=catalog["items"],
        activated={a["name"] for a in activations["items"]},
        names=names,
        problem=problem,
        done=done if done in _DONE else None,
    )
    return html(body, problem.status if problem else 200)


async def _space_change(
    space: str, method: str, path: str, body: dict[str, Any] | None, done: str
) -> Response:
    """Make one change to the space's plugins through its route: back to
    the page, or the page with the route's refusal."""
    try:
        await api().request(method, path, json=body)
    except Problem as refused:
        return await _plugins_page(space, refused)
    return redirect(ui_path(space, "plugins") + "?" + urlencode({"done": done}), 303)


@blueprint.post("/ui/spaces/<space>/plugins/activate")
@page
async def activate(space: str) -> Response:
    """Activate a release of a plugin in the space, or move its pin there
    (space owners and admins)."""
    form = await checked_form(signed_in())
    name = form.get("name", "")
    if not _NAME.fullmatch(name):
        return await _plugins_page(space, _bad("name", "a plugin of the catalog"))
    return await _space_change(
        space,
        "PUT",
        space_path(space, "plugins", name),
        {"version": form.get("version", "")},
        "activated",
    )


@blueprint.post("/ui/spaces/<space>/plugins/<name>/<move>")
@page
async def suspend_or_resume(space: str, name: str, move: str) -> Response:
    """Suspend or resume an activation (space owners and admins); the pin
    stays."""
    await checked_form(signed_in())
    if move not in ("suspend", "resume"):
        return await _plugins_page(space, _bad("action", "suspend or resume"))
    done = "suspended" if move == "suspend" else "resumed"
    return await _space_change(space, "POST", space_path(space, "plugins", name, move), None, done)


@blueprint.post("/ui/spaces/<space>/curation")
@page
async def set_curation(space: str) -> Response:
    """Switch the space between open and curated (space owners and admins)."""
    form = await checked_form(signed_in())
    return await _space_change(
        space, "PUT", space_path(space, "curation"), {"mode": form.get("mode", "")}, "curation"
    )


def _bad(field: str, expected: str) -> Problem:
    return ValidationFailed(f"invalid fields: {field}", errors={field: [expected]})


# ----------------------------------------------------------------------------- catalog


@blueprint.get("/ui/catalog")
@page
async def catalog_page() -> Response:
    """The catalog: every plugin with its latest release, and for system
    admins and operators the publish form."""
    shown = await api().get(
        "/v1/catalog",
        {
            "limit": str(CATALOG_PAGE),
            "archived": "true" if request.args.get("archived") == "true" else "false",
            **({"cursor": request.args["cursor"]} if request.args.get("cursor") else {}),
        },
    )
    body = await render(
        "catalog.html",
        plugins=shown["items"],
        next_cursor=shown.get("next_cursor"),
        archived=request.args.get("archived") == "true",
    )
    return html(body)


@blueprint.get("/ui/catalog/<name>")
@page
async def catalog_plugin(name: str) -> Response:
    """A plugin: every release with its digest, who published it, its
    capability report and its eligibility (the system admin's decision)."""
    return await _plugin_page(name, problem=None)


async def _plugin_page(name: str, problem: Problem | None) -> Response:
    shown = await api().get(_catalog_path(name))
    done = request.args.get("done")
    body = await render(
        "catalog_plugin.html",
        plugin=shown,
        names=await principal_names(
            {r["published_by"] for r in shown["releases"]}
            | {r["eligible_by"] for r in shown["releases"] if r["eligible_by"]}
        ),
        problem=problem,
        done=done if done in ("published", "eligible", "ineligible") else None,
        version=request.args.get("version"),
    )
    return html(body, problem.status if problem else 200)


@blueprint.post("/ui/catalog/<name>/releases/<version>/eligibility")
@page
async def eligibility(name: str, version: str) -> Response:
    """Mark a release eligible for unattended use, or not (system admins),
    naming the digest of the release whose report the page showed."""
    form = await checked_form(signed_in())
    eligible = form.get("eligible") == "true"
    try:
        await api().request(
            "POST",
            _catalog_path(name, "releases", version, "eligibility"),
            json={"eligible": eligible, "sha256": form.get("sha256", "")},
        )
    except Problem as refused:
        return await _plugin_page(name, refused)
    done = "eligible" if eligible else "ineligible"
    return redirect(
        f"/ui/catalog/{quote(name, safe='')}?" + urlencode({"done": done, "version": version}),
        303,
    )


@blueprint.post("/ui/catalog/publish")
@page
async def publish() -> Response:
    """Publish a release (system admins and operators): the archive is the
    request's body, sent by the page's script with the CSRF token in its
    header and the plugin's name in the query, and relayed as it arrives to
    the publish route. Answers the plugin's page (303), or the refusal's
    error page with its status (the script shows its text)."""
    checked_upload(signed_in())
    name = request.args.get("name", "")
    if not _NAME.fullmatch(name):
        raise _bad("name", "the plugin's name, as in its buildmax-plugin.toml")
    body = allow_body(MAX_UPLOAD_BYTES)
    released = await api().request(
        "POST",
        _catalog_path(name, "releases"),
        content=body.__aiter__(),
        content_length=request.content_length,
    )
    target = f"/ui/catalog/{quote(name, safe='')}?" + urlencode(
        {"done": "published", "version": released["version"]}
    )
    return redirect(target, 303)
