"""Who is looking: the session cookie, and the CSRF token of every form.

A browser cannot put a token in an ``Authorization`` header of a link, a
form or an event stream, so the dashboard keeps a session token (from
:func:`buildmax.sessions.sign_in`) in a cookie: ``HttpOnly`` (no script
reads it), ``SameSite=Strict`` (no other site's page sends it), scoped to
``/ui/`` (the ``/v1/`` API never accepts it) and ``Secure`` when the page
came over TLS. The server expires it (``session_ttl_seconds``) and signing
out revokes it.

Every state-changing request under ``/ui/`` carries a CSRF token in its form
(``csrf``) or in the ``X-CSRF-Token`` header of a fetch. For a session it is
an HMAC of the session's secret, so it needs no storage and changes with
each sign-in; the sign-in form, which has no session yet, pairs its token
with a cookie of its own (double submit). Either way a page of another site
can neither read nor guess it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import urlsplit

from quart import Response, request

from buildmax.auth import Caller, authenticate_secret
from buildmax.current import current_buildmax
from buildmax.problems import Forbidden, Unauthenticated

#: The session cookie: a BuildMax session token's secret.
SESSION_COOKIE = "buildmax_session"
#: The sign-in form's own CSRF cookie (there is no session yet).
SIGN_IN_COOKIE = "buildmax_sign_in"
#: Where both cookies are sent: the dashboard's pages only.
COOKIE_PATH = "/ui/"
#: The form field and the fetch header that carry the CSRF token.
CSRF_FIELD = "csrf"
CSRF_HEADER = "X-CSRF-Token"
_CSRF_PURPOSE = b"buildmax-dashboard-csrf"


@dataclass(frozen=True)
class Session:
    """A signed-in person: the caller their session token names, and the
    CSRF token their forms carry."""

    caller: Caller
    csrf: str


class NotSignedIn(Exception):
    """No session, or one that no longer authenticates: sign in again."""


def csrf_token_of(secret: str) -> str:
    """The CSRF token of the session whose token secret is ``secret``."""
    return hmac.new(secret.encode(), _CSRF_PURPOSE, hashlib.sha256).hexdigest()


def session_secret() -> str:
    """The session token's secret this request's cookie carries ("" when
    none; the token lookup bounds its length)."""
    return request.cookies.get(SESSION_COOKIE, "")


async def current_session() -> Session:
    """The session of this request, or :class:`NotSignedIn`. The token is
    checked as it stands now (revoked, expired, a disabled principal: not
    signed in), as a bearer token is."""
    secret = session_secret()
    if not secret:
        raise NotSignedIn()
    try:
        caller = await authenticate_secret(secret)
    except Unauthenticated:
        raise NotSignedIn() from None
    return Session(caller, csrf_token_of(secret))


async def checked_form(session: Session) -> dict[str, str]:
    """The posted form of a state-changing request, once its CSRF token
    (field or header) is the session's and the request came from this
    site; 403 otherwise, before anything is read or changed."""
    return await _form_carrying(session.csrf, header=True)


def checked_upload(session: Session) -> None:
    """A state-changing request whose body is not a form (an upload sent by
    the page's script): its CSRF token must be in the fetch header and it
    must come from this site; 403 otherwise, before a byte of the body is
    read."""
    _require_same_origin()
    given = request.headers.get(CSRF_HEADER, "")
    if not hmac.compare_digest(given.encode(), session.csrf.encode()):
        raise Forbidden("the upload's security token is missing or stale: reload the page")


async def _form_carrying(expected: str, *, header: bool) -> dict[str, str]:
    """The posted form if it carries ``expected`` as its CSRF token (in its
    field, or with ``header`` in the fetch header) and came from this site."""
    form = await request.form
    given = form.get(CSRF_FIELD) or (request.headers.get(CSRF_HEADER, "") if header else "")
    _require_same_origin()
    if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
        raise Forbidden("the form's security token is missing or stale: reload the page")
    return {key: form.get(key, "") for key in form}


def _require_same_origin() -> None:
    """A browser names the page a request comes from in ``Origin``: it must
    be this host. The port is compared when the request's ``Host`` names one
    (a proxy that passes the browser's ``Host`` whole); one that drops it
    leaves the host name to compare. The CSRF token is the check that
    counts; this one refuses a token carried off to another site."""
    origin = request.headers.get("Origin")
    if origin is None or origin == "null":
        return
    try:
        sent, here = urlsplit(origin), urlsplit(f"//{request.host}")
        same_host = (sent.hostname or "") == (here.hostname or "")
        port = here.port
        same_port = port is None or (sent.port or _DEFAULT_PORTS.get(sent.scheme)) == port
    except ValueError:  # a port that is not a number
        same_host = same_port = False
    if not (same_host and same_port):
        raise Forbidden("this form was posted from another site")


_DEFAULT_PORTS = {"http": 80, "https": 443}


def new_sign_in_token() -> str:
    """A fresh CSRF token for the sign-in form (and its cookie)."""
    return secrets.token_urlsafe(32)


async def checked_sign_in_form() -> dict[str, str]:
    """The posted sign-in form, once its CSRF token matches its cookie; 403
    otherwise."""
    return await _form_carrying(request.cookies.get(SIGN_IN_COOKIE, ""), header=False)


def _secure() -> bool:
    """Whether the page came over TLS (here or at a proxy in front). A
    client that claims TLS falsely only gets a cookie it cannot send back
    over plain HTTP."""
    return request.scheme == "https" or request.headers.get("X-Forwarded-Proto") == "https"


def set_cookie(response: Response, name: str, value: str, max_age: int | None) -> None:
    """Set one of the dashboard's cookies with its flags."""
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path=COOKIE_PATH,
        secure=_secure(),
        httponly=True,
        samesite="Strict",
    )


def start_session(response: Response, secret: str) -> None:
    """Hand the browser the new session's secret (and drop the sign-in
    form's cookie)."""
    set_cookie(response, SESSION_COOKIE, secret, current_buildmax().settings.session_ttl_seconds)
    end_cookie(response, SIGN_IN_COOKIE)


def end_cookie(response: Response, name: str) -> None:
    """Tell the browser to forget one of the dashboard's cookies."""
    response.delete_cookie(
        name, path=COOKIE_PATH, secure=_secure(), httponly=True, samesite="Strict"
    )
