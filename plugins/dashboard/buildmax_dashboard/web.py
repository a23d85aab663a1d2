"""The dashboard's plumbing every page module shares: the blueprint under
``/ui/``, the security headers of every answer, the error pages, the
``@page`` guard (a signed-in person first), the API as that person, and
rendering.

A page module (:mod:`.pages`, :mod:`.editing`, :mod:`.plugin_pages`,
:mod:`.audit_pages`, :mod:`.admin_pages`) adds its routes to
:data:`blueprint`; each reads and acts only through the API's own routes,
called in-process as the signed-in person.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any, ParamSpec, Protocol
from urllib.parse import quote, urlencode

from quart import Blueprint, Response, g, render_template, request

from buildmax.access import role_at_least
from buildmax.current import current_buildmax
from buildmax.internal import InternalApi
from buildmax.problems import NotFound, Problem, Unauthenticated

from .session import CSRF_FIELD, SESSION_COOKIE, NotSignedIn, Session, current_session, end_cookie

P = ParamSpec("P")

blueprint = Blueprint(
    "buildmax_dashboard",
    __name__,
    template_folder="templates",
    static_folder="static",
    static_url_path="/ui/static",
)
#: ``GET /``: a browser is sent to the dashboard, an API client gets the
#: JSON 404 it always got (a blueprint of its own: the pages' HTML error
#: handler is not its).
root = Blueprint("buildmax_dashboard_root", __name__)

#: The policy of every dashboard response: scripts, styles and images from
#: the dashboard itself only (no inline script or style, no other site), no
#: framing, forms posted here only.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
#: A ``next`` a sign-in keeps (where to go once signed in): a dashboard
#: path, printable ASCII but a backslash (which a browser reads as a slash),
#: at most 500 characters.
_NEXT = re.compile(r"/ui/[!-\[\]-~]{0,496}")


@root.get("/")
async def home() -> Response:
    """A browser asking for ``/`` is sent to the dashboard."""
    accepts = request.accept_mimetypes
    if accepts.best_match(["application/json", "text/html"]) == "text/html":
        return redirect("/ui/", 302)
    raise NotFound("no such resource; the API is under /v1/ and the dashboard under /ui/")


@blueprint.after_request
async def _protect(response: Response) -> Response:
    # A download keeps the stricter policy of its route (a sandbox).
    response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["X-Frame-Options"] = "DENY"
    if not request.path.startswith("/ui/static/"):
        response.headers["Cache-Control"] = "no-store"
    return response


@blueprint.errorhandler(NotSignedIn)
async def _sign_in_first(_: NotSignedIn) -> Response:
    if request.method != "GET":
        return await error_page(
            Unauthenticated("your session has ended: sign in again"), session=None
        )
    target = request.full_path.rstrip("?")
    response = redirect("/ui/sign-in?" + urlencode({"next": target}), 303)
    end_cookie(response, SESSION_COOKIE)
    return response


@blueprint.errorhandler(Problem)
async def _problem(problem: Problem) -> Response:
    return await error_page(problem, session=g.get("dashboard_session"))


async def error_page(problem: Problem, session: Session | None) -> Response:
    """The error page of ``problem``, with its status and headers."""
    body = await render_template(
        "dashboard/error.html",
        problem=problem,
        session=session,
        csrf_field=CSRF_FIELD,
        request_id=g.get("request_id"),
    )
    response = Response(body, status=problem.status, content_type="text/html; charset=utf-8")
    response.headers.update(problem.headers)
    return response


def redirect(target: str, status: int) -> Response:
    """Send the browser to ``target`` (a path of this site)."""
    return Response("", status=status, headers={"Location": target})


def page(view: Callable[P, Awaitable[Any]]) -> Callable[P, Awaitable[Any]]:
    """A dashboard view for a signed-in person: the session is checked
    first (not signed in: the sign-in page) and kept for the error page."""

    @wraps(view)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
        g.dashboard_session = await current_session()
        return await view(*args, **kwargs)

    return wrapper


def signed_in() -> Session:
    """The signed-in person of this request (set by :func:`page`)."""
    session: Session = g.dashboard_session
    return session


def api() -> InternalApi:
    """The API as the signed-in person, each call marked as the dashboard's."""
    return InternalApi(current_buildmax(), signed_in().caller, request_id=f"ui/{g.request_id}")


async def render(template: str, **context: Any) -> str:
    """A page with what every page shows (the person, the CSRF token) and
    ``can(space, role)``, which says whether to offer an action that needs
    ``role`` in ``space`` (the API route decides again when it is taken)."""
    return await render_template(
        f"dashboard/{template}",
        session=signed_in(),
        csrf_field=CSRF_FIELD,
        can=_can,
        request_key=new_request_key,
        **context,
    )


#: The form field carrying a form's own idempotency key, and its shape.
REQUEST_KEY_FIELD = "request_key"
_REQUEST_KEY = re.compile(r"[A-Za-z0-9_-]{16,64}")


def new_request_key() -> str:
    """A fresh idempotency key for one rendered form: posting that form
    again (a reload of its answer) replays the first answer, never a second
    change."""
    return secrets.token_urlsafe(16)


def request_key(form: dict[str, str]) -> str | None:
    """The idempotency key a posted form carries (``ui-`` and its field),
    ``None`` when it carries none that fits."""
    key = form.get(REQUEST_KEY_FIELD, "")
    return f"ui-{key}" if _REQUEST_KEY.fullmatch(key) else None


def _can(space: dict[str, Any], minimum: str) -> bool:
    return role_at_least(space.get("role"), minimum) or signed_in().caller.is_admin


def safe_next(target: str) -> str:
    """Where to go after signing in: a dashboard path of printable ASCII only
    (never another site, nothing a ``Location`` header cannot carry)."""
    if _NEXT.fullmatch(target):
        return target
    return "/ui/"


def html(body: str, status: int = 200) -> Response:
    """An HTML answer: a page shown again with a refusal keeps its status."""
    return Response(body, status=status, content_type="text/html; charset=utf-8")


def seg(value: str) -> str:
    """``value`` as one path segment, quoted whole (a typed id cannot reach
    another route)."""
    return quote(value, safe="")


async def optional(reading: Awaitable[Any]) -> Any:
    """What ``reading`` (an API call) answers, or ``None`` if the API
    refuses it."""
    try:
        return await reading
    except Problem:
        return None


async def principal_names(ids: set[str]) -> dict[str, str]:
    """The names of the principals ``ids`` the person may look up (a system
    admin or operator: any; anyone else: themselves); the others stay out."""
    reader = api()
    ordered = sorted(ids)
    found = await asyncio.gather(
        *(optional(reader.get(f"/v1/principals/{seg(i)}")) for i in ordered)
    )
    return {i: p["name"] for i, p in zip(ordered, found, strict=True) if p is not None}


def space_path(space: str, *segments: str) -> str:
    """The API path of ``space`` and what follows it, each segment quoted
    whole (a typed id cannot reach another route)."""
    return "/".join([f"/v1/spaces/{quote(space, safe='')}", *(quote(s, safe="") for s in segments)])


def ui_path(space: str, *segments: str) -> str:
    """The dashboard path of ``space`` and what follows it, quoted as
    :func:`space_path` quotes."""
    return "/".join([f"/ui/spaces/{quote(space, safe='')}", *(quote(s, safe="") for s in segments)])


class MultiForm(Protocol):
    """A posted form whose fields may repeat."""

    def getlist(self, key: str) -> list[str]:
        """Every value of ``key``, in order."""
        ...
