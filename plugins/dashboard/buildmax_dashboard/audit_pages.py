"""The audit viewer and the diagnostics page.

``/ui/spaces/{space}/audit`` is a space's trail, ``/ui/audit`` the server's
(every chain): the audit plugin's own routes, read as the signed-in person,
so who may read which trail is the plugin's rule (a space's owners and
admins; system admins for the server's), and a refusal is its status on an
error page. Each event's target links to its page in the dashboard where
there is one, and each chain shows whether it verifies, through the
plugin's verify route (system admins; "not permitted" for anyone else).

``/ui/diagnostics`` is ``GET /v1/diagnostics``: the server's facts and what
needs a person in every space (system admins and operators).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Iterable, Mapping
from typing import Any

from quart import Response, request

from buildmax.auth import Caller
from buildmax.clock import to_rfc3339
from buildmax.internal import InternalApi
from buildmax.problems import Problem

from .web import (
    api,
    blueprint,
    html,
    page,
    principal_names,
    render,
    seg,
    signed_in,
    space_path,
    ui_path,
)

#: Events an audit page shows.
PAGE_SIZE = 50
#: A space trail's filters, as the audit plugin's routes name them.
FILTERS = ("action", "actor", "target", "target_type", "since", "until")
#: The server trail's filters: those, and the chain (``space``).
SERVER_FILTERS = (*FILTERS, "space")
#: The server's own chain (events that belong to no space).
SYSTEM_CHAIN = "system"
#: What the target-type filter suggests (a plugin may add others).
TARGET_TYPES = (
    "task",
    "attempt",
    "project",
    "decision",
    "hold",
    "review",
    "integration",
    "finding",
    "artifact",
    "agent",
    "principal",
    "token",
    "space",
    "catalog_plugin",
)
#: What the action filter suggests (each a prefix of the actions it finds).
ACTION_PREFIXES = (
    "task.",
    "attempt.",
    "decision.",
    "hold.",
    "review.",
    "integration.",
    "artifact.",
    "activation.",
    "catalog.",
    "curation.",
    "project.",
    "space.",
    "principal.",
    "token.",
    "session.",
)

# ----------------------------------------------------------------------------- routes


@blueprint.get("/ui/spaces/<space>/audit")
@page
async def space_audit_page(space: str) -> Response:
    """A space's audit trail, filtered and paged as the query asks, with
    the verification of its chain (and of the server's, for those who may
    read it)."""
    caller = signed_in().caller
    shown_space = await api().get(space_path(space))
    space_id = shown_space["id"]
    chains = [(space_id, "This space's chain")]
    if caller.is_admin:
        chains.append((SYSTEM_CHAIN, "The server's chain"))
    shown = await _trail(
        f"{space_path(space)}/audit", FILTERS, _chain_checks(api(), chains), space_id
    )
    return await _audit_page(space=shown_space, server=False, **shown)


@blueprint.get("/ui/audit")
@page
async def server_audit_page() -> Response:
    """Every chain's events (system admins), filtered and paged as the
    query asks, with the verification of the chain the filter names, or of
    every chain."""
    named = request.args.get("space")
    shown = await _trail("/v1/audit", SERVER_FILTERS, _verify_all(api(), named), None)
    return await _audit_page(space=None, server=True, **shown)


@blueprint.get("/ui/diagnostics")
@page
async def diagnostics_page() -> str:
    """The server's facts and the attention list of every space (system
    admins and operators: anyone else gets the API's 403)."""
    reading = await api().get("/v1/diagnostics")
    return await render("diagnostics.html", **diagnostics_view(reading))


async def _audit_page(**shown: Any) -> Response:
    problem = shown.get("problem")
    body = await render("audit.html", **shown)
    return html(body, problem.status if problem else 200)


# ----------------------------------------------------------------------------- the trail


async def _trail(
    path: str,
    names: Iterable[str],
    checks: Awaitable[list[dict[str, Any]]],
    space_id: str | None,
) -> dict[str, Any]:
    """One page of the trail at ``path`` with what the page shows about
    it: the events (with names and links), the filters as given, the next
    page's cursor, the chains' verification, the actors the actor filter
    suggests. A filter the API refuses (422) is shown on the page with no
    event; any other refusal is the error page."""
    caller = signed_in().caller
    filters = {key: request.args[key] for key in names if request.args.get(key)}
    params = {**filters, "limit": str(PAGE_SIZE)}
    if request.args.get("cursor"):
        params["cursor"] = request.args["cursor"]
    reading, chains, members = await asyncio.gather(
        _events(api(), path, params),
        checks,
        _members(api(), space_id),
    )
    events, next_cursor, problem = reading
    names_of = {caller.actor.principal_id: caller.actor.name, **members}
    names_of.update(await _names(api(), caller, _principals(events) - names_of.keys()))
    return {
        "events": [event_row(e, names_of, caller) for e in events],
        "next_cursor": next_cursor,
        "problem": problem,
        "filters": filters,
        "chains": chains,
        "members": members,
        "target_types": TARGET_TYPES,
        "action_prefixes": ACTION_PREFIXES,
        "cursor": request.args.get("cursor"),
    }


async def _events(
    api: InternalApi, path: str, params: Mapping[str, str]
) -> tuple[list[dict[str, Any]], str | None, Problem | None]:
    """The events of one page and the next page's cursor; a refused filter
    (422) as a problem with no event."""
    try:
        reading = await api.get(path, params)
    except Problem as refused:
        if refused.status != 422:
            raise
        return [], None, refused
    return reading["items"], reading.get("next_cursor"), None


async def _members(api: InternalApi, space_id: str | None) -> dict[str, str]:
    """The names of a space's members by principal id (none for the
    server's trail)."""
    if space_id is None:
        return {}
    page = await api.get(f"{space_path(space_id)}/members", {"limit": "200"})
    return {m["principal_id"]: m["name"] for m in page["items"]}


def _principals(events: Iterable[Mapping[str, Any]]) -> set[str]:
    """The principals the events name: their actors and the principals
    they are about."""
    found = set()
    for event in events:
        found.add(event["actor"]["id"])
        target = event.get("target") or {}
        if target.get("type") == "principal":
            found.add(target["id"])
    found.discard(None)
    return found


async def _names(api: InternalApi, caller: Caller, ids: set[str]) -> dict[str, str]:
    """The names of principals no member list named, for those who may
    read any principal (system admins and operators); nobody else's."""
    if not (caller.is_admin or caller.is_operator) or not ids:
        return {}
    return await principal_names(ids)


def event_row(event: Mapping[str, Any], names: Mapping[str, str], caller: Caller) -> dict[str, Any]:
    """An event as a row of the page: the actor's name, where its target
    is shown, whether the dashboard made it, its details as text."""
    actor = event["actor"]["id"]
    target = event.get("target")
    return {
        **event,
        "actor_name": names.get(actor) if actor else None,
        "target_name": names.get(target["id"]) if target else None,
        "href": target_href(event, caller),
        "from_dashboard": (event.get("request_id") or "").startswith("ui/"),
        "detail_lines": detail_lines(event["details"]),
    }


def detail_lines(details: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Each detail as ``(key, text)``: a string as itself, anything else as
    its JSON (the template escapes both)."""
    return [
        (key, value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
        for key, value in details.items()
    ]


def target_href(event: Mapping[str, Any], caller: Caller) -> str | None:
    """The dashboard page of an event's target, where there is one it can
    name: a task, review work, the decisions, holds, plugins or members of
    its space, a project's board, a principal (for system admins), the
    person's own tokens, a catalog plugin."""
    target = event.get("target")
    if not target:
        return None
    kind, ident, action = target["type"], target["id"], event["action"]
    details, space = event["details"], event.get("space")
    if kind == "principal":
        return _principal_href(ident, space, action, caller)
    if kind == "token":
        owner = details.get("principal_id") or event["actor"]["id"]
        return _token_href(owner, caller)
    if kind == "catalog_plugin" and not (space and action.startswith("activation.")):
        return f"/ui/catalog/{seg(ident)}"
    if not space:
        return None
    return _space_href(space, kind, ident, action, details)


def _principal_href(ident: str, space: str | None, action: str, caller: Caller) -> str | None:
    if caller.is_admin:
        return f"/ui/principals/{seg(ident)}"
    if space and action.startswith("space.member."):
        return ui_path(space, "members")
    return None


def _token_href(owner: Any, caller: Caller) -> str | None:
    if not isinstance(owner, str):
        return None
    if owner == caller.actor.principal_id:
        return "/ui/tokens"
    return f"/ui/principals/{seg(owner)}" if caller.is_admin else None


def _space_href(
    space: str, kind: str, ident: str, action: str, details: Mapping[str, Any]
) -> str | None:
    """A target's page in ``space``: its own, or that of the task its
    details name."""
    pages = {
        "task": ("tasks", ident),
        "decision": ("decisions",),
        "hold": ("holds",),
        "catalog_plugin": ("plugins",),
    }
    if kind in pages:
        return ui_path(space, *pages[kind])
    if kind == "project":
        return ui_path(space, "projects", ident) + "/"
    if kind == "space":
        return ui_path(space, "plugins") if action.startswith("curation.") else ui_path(space) + "/"
    task = details.get("subject_id" if kind == "finding" else "task_id")
    if not isinstance(task, str):
        return None
    return ui_path(space, "reviews" if kind == "review" else "tasks", task)


# ----------------------------------------------------------------------------- chains


async def _chain_checks(api: InternalApi, chains: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Each chain's verification, as the person: ``(chain, label)`` in,
    what to show of it out."""
    return list(await asyncio.gather(*(_chain_check(api, c, label) for c, label in chains)))


async def _chain_check(api: InternalApi, chain: str, label: str) -> dict[str, Any]:
    try:
        answer = await api.get("/v1/audit/verify", {"space": chain})
    except Problem as refused:
        return {"chain": chain, "label": label, "state": "refused", "problem": refused}
    reports = [r for r in answer["chains"] if r["chain"] == chain]
    return chain_status(chain, label, reports[0] if reports else None)


async def _verify_all(api: InternalApi, named: str | None) -> list[dict[str, Any]]:
    """The verification of the chain ``named`` (a space's slug or id, or
    ``system``), or of every chain; a refusal as one line."""
    try:
        answer = await api.get("/v1/audit/verify", {"space": named} if named else None)
    except Problem as refused:
        return [{"chain": named or "", "label": "", "state": "refused", "problem": refused}]
    return [chain_status(r["chain"], _chain_label(r["chain"]), r) for r in answer["chains"]]


def _chain_label(chain: str) -> str:
    return "The server's chain" if chain == SYSTEM_CHAIN else "Space"


def chain_status(chain: str, label: str, report: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a chain's verify report says: ``verified``, ``broken`` (at
    ``broken_seq``, with its cause) or ``empty`` (nothing recorded)."""
    if report is None or (report["ok"] and not report["events"]):
        state = "empty"
    else:
        state = "verified" if report["ok"] else "broken"
    return {"chain": chain, "label": label, "state": state, "report": report}


# ----------------------------------------------------------------------------- diagnostics


def diagnostics_view(reading: Mapping[str, Any]) -> dict[str, Any]:
    """What the diagnostics page shows of ``GET /v1/diagnostics``: the
    server, each fact with its value as a person reads it, the attention
    list by space (server-wide first), when it was read."""
    groups: dict[str | None, list[dict[str, Any]]] = {}
    for item in reading["attention"]:
        groups.setdefault(item.get("space"), []).append(item)
    server_wide = groups.pop(None, [])
    return {
        "server": reading["server"],
        "generated_at": to_rfc3339(reading["generated_at"]),
        "facts": [
            {**fact, "shown": fact_value(fact["name"], fact["value"])} for fact in reading["facts"]
        ],
        "server_attention": server_wide,
        "space_attention": list(groups.items()),
        "attention_count": len(reading["attention"]),
    }


def fact_value(name: str, value: float) -> str:
    """A fact's value as a person reads it: Unix times as UTC times, counts
    with separators, bytes with a larger unit too."""
    if name.endswith("_timestamp_seconds"):
        return (to_rfc3339(int(value * 1000)) or "").replace("T", " ").replace("Z", " UTC")
    number = f"{int(value):,}" if float(value).is_integer() else f"{value:,.3f}"
    if not name.endswith("_bytes"):
        return number
    scaled, unit = abs(value), 0
    while scaled >= 1024 and unit < len(_UNITS) - 1:
        scaled, unit = scaled / 1024, unit + 1
    return f"{number} bytes" + (f" ({scaled:,.1f} {_UNITS[unit]})" if unit else "")


#: The units a byte count is also shown in.
_UNITS = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB")


# ----------------------------------------------------------------------------- helpers
