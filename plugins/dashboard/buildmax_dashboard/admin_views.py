"""What the administration pages show, read through the API as the
signed-in person: the principals, one principal and its tokens, the
person's own tokens, a space's members, a space's holds.

Each list is one page of its API route (``cursor`` for the next); a token
is marked revoked or expired as the API's times say.
"""

from __future__ import annotations

import asyncio
from typing import Any

from buildmax.clock import from_rfc3339
from buildmax.current import current_buildmax
from buildmax.internal import InternalApi
from buildmax.problems import Problem

from .web import seg

#: Principals, tokens and members a page lists before "next page".
PAGE_SIZE = 50
#: Live holds a page lists before "next page".
HOLDS_PAGE = 100
#: The newest holds, live or lifted, read for "recently lifted".
RECENT_HOLDS = 50
#: Projects (to name a hold's) and members (to name who placed it) read.
NAMES = 200


def _paging(size: int, cursor: str | None) -> dict[str, str]:
    params = {"limit": str(size)}
    if cursor:
        params["cursor"] = cursor
    return params


async def principals_view(api: InternalApi, cursor: str | None) -> dict[str, Any]:
    """A page of principals, by name."""
    page = await api.get("/v1/principals", _paging(PAGE_SIZE, cursor))
    return {"principals": page["items"], "next_cursor": page.get("next_cursor"), "cursor": cursor}


async def principal_view(api: InternalApi, ref: str, cursor: str | None) -> dict[str, Any]:
    """A principal and a page of its tokens; ``tokens`` is ``None`` for a
    reader the API does not show them to (an operator)."""
    principal = await api.get(f"/v1/principals/{seg(ref)}")
    try:
        tokens = await _tokens(api, {"principal": principal["id"]}, cursor)
    except Problem as refused:
        if refused.status != 403:
            raise
        tokens = {"tokens": None, "next_cursor": None, "cursor": cursor}
    return {"principal": principal, **tokens}


async def tokens_view(api: InternalApi, cursor: str | None) -> dict[str, Any]:
    """A page of the person's own tokens, newest first."""
    return await _tokens(api, {}, cursor)


async def _tokens(api: InternalApi, params: dict[str, str], cursor: str | None) -> dict[str, Any]:
    page = await api.get("/v1/tokens", {**params, **_paging(PAGE_SIZE, cursor)})
    now = current_buildmax().clock.now_ms()
    tokens = [{**token, "status": token_status(token, now)} for token in page["items"]]
    return {"tokens": tokens, "next_cursor": page.get("next_cursor"), "cursor": cursor}


def token_status(token: dict[str, Any], now: int) -> str:
    """``revoked``, ``expired`` or ``active``, at ``now`` (epoch ms)."""
    if token.get("revoked_at"):
        return "revoked"
    expires = token.get("expires_at")
    if expires and from_rfc3339(expires) <= now:
        return "expired"
    return "active"


async def members_view(api: InternalApi, space: str, cursor: str | None) -> dict[str, Any]:
    """A space and a page of its members, by name."""
    base = f"/v1/spaces/{seg(space)}"
    shown, members = await asyncio.gather(
        api.get(base), api.get(f"{base}/members", _paging(PAGE_SIZE, cursor))
    )
    return {
        "space": shown,
        "members": members["items"],
        "next_cursor": members.get("next_cursor"),
        "cursor": cursor,
    }


async def holds_view(api: InternalApi, space: str, cursor: str | None) -> dict[str, Any]:
    """A space, a page of its live holds (newest first), the holds lifted
    among its :data:`RECENT_HOLDS` newest, its projects (by id: a hold's
    scope and the form's choices) and its members' names (who placed and
    lifted each)."""
    base = f"/v1/spaces/{seg(space)}"
    shown, live, recent, projects, members = await asyncio.gather(
        api.get(base),
        api.get(f"{base}/holds", _paging(HOLDS_PAGE, cursor)),
        api.get(f"{base}/holds", {"all": "true", "limit": str(RECENT_HOLDS)}),
        api.get(f"{base}/projects", {"limit": str(NAMES)}),
        api.get(f"{base}/members", {"limit": str(NAMES)}),
    )
    return {
        "space": shown,
        "holds": live["items"],
        "lifted": [hold for hold in recent["items"] if hold.get("lifted_at")],
        "projects": {project["id"]: project for project in projects["items"]},
        "names": {member["principal_id"]: member["name"] for member in members["items"]},
        "next_cursor": live.get("next_cursor"),
        "cursor": cursor,
    }
