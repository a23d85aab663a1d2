"""The HTTP transport to a BuildMax server, and typed calls for the kernel's routes.

:class:`Client` (and its twin :class:`AsyncClient`) knows the base URL and
token, retries what is safe to retry, sends every mutation with an
``Idempotency-Key`` that stays the same across its retries, turns
``application/problem+json`` answers into typed exceptions and follows paging
cursors. Plugins add typed methods for their routes in their own packages::

    with Client() as bmx:
        space = bmx.create_space("web")
        for token in bmx.paginate("/v1/tokens"):
            ...

The URL and token come from the arguments, else ``BUILDMAX_URL`` and
``BUILDMAX_TOKEN``, else the login file written by ``buildmax login``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json as jsonlib
import os
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Generic, Self, TypeVar, cast
from urllib.parse import quote

import httpx

from . import __version__, problems
from .problems import Problem

DEFAULT_URL = "http://127.0.0.1:8420"
URL_ENV = "BUILDMAX_URL"
TOKEN_ENV = "BUILDMAX_TOKEN"
IDEMPOTENCY_HEADER = "Idempotency-Key"
PROBLEM_TYPE_PREFIX = "urn:buildmax:problem:"

MUTATING_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
RETRY_STATUSES = frozenset({502, 503, 504})
MAX_BACKOFF_SECONDS = 5.0
_TRANSIENT = (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError)


# -- errors -------------------------------------------------------------------


class BuildMaxError(Exception):
    """An error answer from the server.

    ``slug`` is the stable part of a problem's ``type``
    (``urn:buildmax:problem:<slug>``), or ``http-<status>`` when the answer
    was not a problem document; ``body`` is the parsed answer.
    """

    #: The server's declaration of the problem this class is raised for
    #: (``class StaleGeneration(Conflict, answers=problems.StaleGeneration)``):
    #: its slug, status and title are written there only.
    answers: ClassVar[type[Problem] | None] = None

    def __init_subclass__(cls, *, answers: type[Problem] | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.answers = answers
        if answers is not None:
            said = cls.__doc__ or answers.__doc__ or f"{answers.title}."
            cls.__doc__ = f"{answers.status} ``{answers.slug}``: {said}"

    def __init__(self, status: int, slug: str, title: str, detail: str, body: Any) -> None:
        self.status = status
        self.slug = slug
        self.title = title
        self.detail = detail
        self.body = body
        super().__init__(f"{status} {slug}: {detail}")


class Unauthenticated(BuildMaxError):
    """401: no token, or one that is unknown, revoked, expired or disabled."""


class Forbidden(BuildMaxError):
    """403: the principal or the token's scope may not do this."""


class TokenScopeRefused(Forbidden, answers=problems.TokenScopeRefused):
    """a scoped token used outside its scope."""


class NotFound(BuildMaxError):
    """404: no such thing, or one you may not see."""


class Conflict(BuildMaxError):
    """409: the current state does not allow this."""


class NameTaken(Conflict, answers=problems.NameTaken):
    """the name is already used (a principal's, or a project's or agent's in its space)."""


class IdempotencyInProgress(Conflict, answers=problems.IdempotencyInProgress):
    """the first request with this key still runs."""


class PayloadTooLarge(BuildMaxError):
    """413: the body exceeds the server's limit."""


class ValidationError(BuildMaxError):
    """422: the request did not validate; ``errors`` maps fields to messages."""

    @property
    def errors(self) -> dict[str, Any]:
        """Per-field messages, as the server sent them."""
        errors = self.body.get("errors") if isinstance(self.body, dict) else None
        return errors if isinstance(errors, dict) else {}

    def __str__(self) -> str:
        fields = "; ".join(f"{name}: {_messages(value)}" for name, value in self.errors.items())
        return f"{super().__str__()} ({fields})" if fields else super().__str__()


class IdempotencyKeyReused(ValidationError, answers=problems.IdempotencyKeyReused):
    """the key was used with another body."""


class TooManyRequests(BuildMaxError):
    """429: slow down."""


class BlobCorrupted(BuildMaxError, answers=problems.BlobCorrupted):
    """the server's stored bytes of what was asked
    for no longer match their recorded size or sha256 (it sent none)."""


class BlobMissing(BuildMaxError, answers=problems.BlobMissing):
    """the stored bytes of what was asked for (an
    artifact's, a release package's) are gone from the server's blob store."""


class ServerError(BuildMaxError):
    """5xx: the server (or a proxy in front of it) failed."""


class BlobStoreUnavailable(ServerError, answers=problems.BlobStoreDown):
    """the server's blob store does not answer; retry later."""


class DiskReserveReached(ServerError, answers=problems.DiskReserveReached):
    """the server keeps its free disk in reserve and this upload would cross
    it: nothing was stored; retry once space is freed."""


class Redirected(BuildMaxError):
    """3xx: the server (or a proxy in front of it, say from ``http`` to
    ``https``) sends the client elsewhere. Never followed, so the token goes
    to the client's own server only: point the client at the URL named."""


class Unreachable(Exception):
    """No answer from the server at ``url`` (refused, unresolvable, timed out)."""

    def __init__(self, url: str, reason: Exception) -> None:
        self.url = url
        self.reason = reason
        super().__init__(f"cannot reach BuildMax at {url}: {str(reason) or type(reason).__name__}")


class IncompleteDownload(Unreachable):
    """A streamed answer broke off before its declared length: the server
    cut it short (it found the stored bytes corrupted while sending them,
    and logged why) or the connection broke mid-body. (An
    :class:`Unreachable`, so code that handles a lost server handles it.)"""

    def __init__(self, url: str, reason: Exception) -> None:
        self.url = url
        self.reason = reason
        Exception.__init__(
            self,
            f"incomplete download from {url}: the answer ended before its declared length "
            f"({str(reason) or type(reason).__name__}); the server cut it short (its stored "
            "bytes may be corrupted: see its log) or the connection broke",
        )


class ForeignOrigin(ValueError):
    """A request for a URL on another server than the client's own (another
    scheme, host or port), or for no URL at all: nothing is sent, so the
    client's token never reaches another server."""

    def __init__(self, url: str, server: str, reason: str = "") -> None:
        self.url = url
        self.server = server
        super().__init__(
            f"refused to send a request to {url!r}: "
            + (reason or f"it is not on the server this client talks to ({server})")
        )


class LoginFileError(ValueError):
    """The login file exists but cannot be used."""


_BY_STATUS: dict[int, type[BuildMaxError]] = {
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: ValidationError,
    429: TooManyRequests,
}


def _messages(value: Any) -> str:
    return ", ".join(str(v) for v in value) if isinstance(value, list) else str(value)


def _status_class(status: int) -> type[BuildMaxError]:
    """The class of an error answer that has no class of its own."""
    if status >= 500:
        return ServerError
    if 300 <= status < 400:
        return Redirected
    return _BY_STATUS.get(status, BuildMaxError)


class ProblemErrors:
    """Which exception a client raises for each problem slug: the class
    declared for the slug (``answers=``), else the class of the status.

    Every client has its own: the kernel's problems are in it from the
    start, and a plugin's client adds its own when it wraps a kernel client
    (:class:`OverClient`), so two clients never share a registration."""

    def __init__(self, *classes: type[BuildMaxError]) -> None:
        self._by_slug: dict[str, type[BuildMaxError]] = {}
        self.add(*classes)

    def add(self, *classes: type[BuildMaxError]) -> None:
        """Raise each class for the problem it answers. A class whose base
        is not its problem's status class, or a slug another class already
        answers here, is a ``ValueError``."""
        for kind in classes:
            problem = kind.answers
            if problem is None:
                raise ValueError(f"{kind.__qualname__} answers no problem (answers=...)")
            base = _status_class(problem.status)
            if not issubclass(kind, base):
                raise ValueError(
                    f"{kind.__qualname__} answers {problem.status} {problem.slug!r}, so it "
                    f"derives from {base.__qualname__}"
                )
            known = self._by_slug.setdefault(problem.slug, kind)
            if known is not kind:
                raise ValueError(f"problem {problem.slug!r} already raises {known.__qualname__}")

    def error_class(self, status: int, slug: str) -> type[BuildMaxError]:
        """The exception class for an error answer: by slug, else by status."""
        return self._by_slug.get(slug) or _status_class(status)

    def error_from(self, response: httpx.Response) -> BuildMaxError:
        """The typed exception for an error answer (problem document or not)."""
        status = response.status_code
        body = _decode(response)
        kind = body.get("type") if isinstance(body, dict) else None
        if isinstance(body, dict) and isinstance(kind, str):
            slug = kind.removeprefix(PROBLEM_TYPE_PREFIX)
            title = str(body.get("title") or response.reason_phrase)
            detail = str(body.get("detail") or title)
        else:
            slug = f"http-{status}"
            title = response.reason_phrase
            detail = (body.strip()[:200] if isinstance(body, str) else "") or title
        if _refused(response) and not response.is_error:
            location = response.headers.get("location", "")[:200]
            detail = f"{detail}: it redirects to {location!r}, which this client does not follow"
        return self.error_class(status, slug)(status, slug, title, detail, body)


#: The kernel's problems that have a class of their own.
KERNEL_ERRORS = (
    TokenScopeRefused,
    NameTaken,
    IdempotencyInProgress,
    IdempotencyKeyReused,
    BlobCorrupted,
    BlobMissing,
    BlobStoreUnavailable,
    DiskReserveReached,
)


def _refused(response: httpx.Response) -> bool:
    """Whether the answer is not the one asked for: an error, or a redirect
    (never followed)."""
    return response.status_code >= 300


def _decode(response: httpx.Response) -> Any:
    """The answer's JSON (``None`` when empty), or its text when it is not
    JSON (or nested too deeply to decode)."""
    if not response.content:
        return None
    if "json" in response.headers.get("content-type", ""):
        try:
            return response.json()
        except (ValueError, RecursionError):
            pass
    return response.text


# -- where and who --------------------------------------------------------------


@dataclass(frozen=True)
class Login:
    """What ``buildmax login`` saved: a server and a token for it."""

    url: str
    token: str


def login_path() -> Path:
    """``$XDG_CONFIG_HOME/buildmax/login.json`` (default ``~/.config``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "buildmax" / "login.json"


def save_login(url: str, token: str) -> Path:
    """Write the login file, readable by its owner only (0600); its path."""
    path = login_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        jsonlib.dump({"url": _normal_url(url), "token": token}, file)
    os.replace(temporary, path)
    return path


def load_login() -> Login | None:
    """The saved login, or ``None`` when there is none."""
    path = login_path()
    try:
        data = jsonlib.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise LoginFileError(f"{path} is not valid JSON ({exc}); run `buildmax login`") from None
    if not (
        isinstance(data, dict)
        and isinstance(data.get("url"), str)
        and isinstance(data.get("token"), str)
    ):
        raise LoginFileError(f"{path} lacks a url and a token; run `buildmax login`")
    return Login(_normal_url(data["url"]), data["token"])


def _normal_url(url: str) -> str:
    return url.strip().rstrip("/")


def resolve(url: str | None = None, token: str | None = None) -> tuple[str, str | None]:
    """The base URL and token to use: arguments, else environment, else login file.

    The login file's token is used only for the login file's URL, so a
    token never travels to another server.
    """
    login = load_login() if url is None or token is None else None
    chosen = _normal_url(url or os.environ.get(URL_ENV) or (login.url if login else DEFAULT_URL))
    if token is None:
        token = os.environ.get(TOKEN_ENV) or (
            login.token if login is not None and login.url == chosen else None
        )
    return chosen, token


# -- the transport ----------------------------------------------------------------

_One = TypeVar("_One")
_Many = TypeVar("_Many")
_Done = TypeVar("_Done")


def _segment(ref: str) -> str:
    return quote(ref, safe="")


def present(**fields: Any) -> dict[str, Any]:
    """The fields that are not ``None`` (left out, the server's defaults apply)."""
    return {name: value for name, value in fields.items() if value is not None}


def space_path(space: str, *parts: str) -> str:
    """``/v1/spaces/<space>/<parts...>``, each segment quoted."""
    return "/".join(["/v1/spaces", *(_segment(p) for p in (space, *parts))])


def _where(request: httpx.Request) -> str:
    """The request's URL without its query, to name it in an error."""
    return str(request.url.copy_with(query=None))


_DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    """Scheme, host and port (the scheme's default when none is given)."""
    return url.scheme, url.host, url.port or _DEFAULT_PORTS.get(url.scheme)


def _page_params(params: dict[str, Any] | None, cursor: str | None) -> dict[str, Any]:
    merged = dict(params or {})
    if cursor:
        merged["cursor"] = cursor
    return merged


class Calls(ABC, Generic[_One, _Many, _Done]):
    """The three ways a typed call reaches the server, shared by a sync and
    an async client of the same routes (the kernel's, or a plugin's on top
    of :class:`OverClient` / :class:`OverAsyncClient`).

    ``_One``, ``_Many`` and ``_Done`` are what a call returns: a dict, a list
    of dicts and nothing for a sync client; awaitables of those for an async
    one.
    """

    @abstractmethod
    def _one(self, method: str, path: str, json: Any = None) -> _One: ...

    @abstractmethod
    def _many(self, path: str, params: dict[str, Any] | None = None) -> _Many: ...

    @abstractmethod
    def _done(self, method: str, path: str) -> _Done: ...


class _KernelRoutes(Calls[_One, _Many, _Done]):
    """Typed calls for the kernel's routes, shared by both clients."""

    _http: httpx.Client | httpx.AsyncClient

    def __init__(self, url: str | None, token: str | None, retries: int, backoff: float) -> None:
        self.url, self.token = resolve(url, token)
        self.retries = retries
        self.backoff = backoff
        #: The exception classes this client raises (plugin clients add theirs).
        self.errors = ProblemErrors(*KERNEL_ERRORS)

    def url_for(self, path: str) -> str:
        """The absolute URL a request for ``path`` (a path, or a full URL)
        goes to; :class:`ForeignOrigin` when it is not on this client's
        server, which no request of this client is ever sent to."""
        try:
            request = self._http.build_request("GET", path)
        except httpx.InvalidURL as exc:
            raise ForeignOrigin(path, self.url, f"not a URL ({exc})") from None
        return str(self._own(request).url)

    def _own(self, request: httpx.Request) -> httpx.Request:
        """``request`` if it goes to this client's server (its scheme, host
        and port); else :class:`ForeignOrigin`: the request carries the
        token, whichever path or URL it was built from."""
        if _origin(request.url) != _origin(self._http.base_url):
            raise ForeignOrigin(str(request.url.copy_with(query=None)), self.url)
        return request

    def _headers(self, method: str, idempotency_key: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": f"buildmax-client/{__version__}"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if idempotency_key is None and method.upper() in MUTATING_METHODS:
            idempotency_key = str(uuid.uuid4())
        if idempotency_key is not None:
            headers[IDEMPOTENCY_HEADER] = idempotency_key
        return headers

    def _stream_headers(
        self, method: str, idempotency_key: str | None, extra: Mapping[str, str] | None
    ) -> dict[str, str]:
        """A streamed request's headers: the usual ones and the caller's."""
        return {**self._headers(method, idempotency_key), **(extra or {})}

    def _delay(
        self, attempt: int, retries: int, outcome: httpx.Response | httpx.TransportError
    ) -> float | None:
        """Seconds to wait before attempt ``attempt + 1``, or ``None`` to stop."""
        if attempt >= retries:
            return None
        if isinstance(outcome, httpx.Response) and outcome.status_code not in RETRY_STATUSES:
            return None
        if isinstance(outcome, httpx.TransportError) and not isinstance(outcome, _TRANSIENT):
            return None
        return float(min(self.backoff * 2**attempt, MAX_BACKOFF_SECONDS))

    def _result(self, outcome: httpx.Response | httpx.TransportError) -> Any:
        """The decoded answer, or the exception it stands for."""
        if isinstance(outcome, httpx.TransportError):
            raise Unreachable(self.url, outcome) from outcome
        if _refused(outcome):
            raise self.errors.error_from(outcome)
        return _decode(outcome)

    # -- principals and sessions --

    def me(self) -> _One:
        """The principal of this client's token."""
        return self._one("GET", "/v1/principals/me")

    def create_principal(
        self,
        kind: str,
        name: str,
        display_name: str = "",
        system_role: str | None = None,
        password: str | None = None,
    ) -> _One:
        """Create a principal (admins); ``password`` only for humans."""
        body = {
            "kind": kind,
            "name": name,
            "display_name": display_name,
            "system_role": system_role,
            **present(password=password),
        }
        return self._one("POST", "/v1/principals", json=body)

    def list_principals(self) -> _Many:
        """Every principal, by name (admins and operators)."""
        return self._many("/v1/principals")

    def get_principal(self, ref: str) -> _One:
        """A principal by id or name."""
        return self._one("GET", f"/v1/principals/{_segment(ref)}")

    def update_principal(self, ref: str, **changes: Any) -> _One:
        """Change ``display_name``, ``password``, ``system_role`` or ``disabled``."""
        return self._one("PATCH", f"/v1/principals/{_segment(ref)}", json=changes)

    def sign_out(self) -> _Done:
        """Revoke the token this client uses."""
        return self._done("DELETE", "/v1/sessions/current")

    # -- tokens --

    def create_token(
        self,
        name: str = "",
        principal_id: str | None = None,
        expires_in_seconds: int | None = None,
        scope: str | None = None,
    ) -> _One:
        """A new token (for yourself, or for ``principal_id`` as an admin); the
        secret is in ``token`` of this answer only. ``scope="metrics"``: a
        token that reads ``/metrics`` and nothing else."""
        body = {
            "name": name,
            "principal_id": principal_id,
            "expires_in_seconds": expires_in_seconds,
            "scope": scope,
        }
        return self._one("POST", "/v1/tokens", json=body)

    def diagnostics(self) -> _One:
        """The server's facts and attention list (system admins and operators)."""
        return self._one("GET", "/v1/diagnostics")

    def space_attention(self, space: str) -> _One:
        """What needs a person in ``space``, as far as your role sees."""
        return self._one("GET", f"/v1/spaces/{_segment(space)}/attention")

    def list_tokens(self, principal: str | None = None) -> _Many:
        """Your tokens, newest first (admins: ``principal``'s), revoked ones included."""
        return self._many("/v1/tokens", present(principal=principal))

    def get_token(self, id: str) -> _One:
        """A token's details (never its secret)."""
        return self._one("GET", f"/v1/tokens/{_segment(id)}")

    def revoke_token(self, id: str) -> _Done:
        """Revoke a token; it stops working on the next request."""
        return self._done("DELETE", f"/v1/tokens/{_segment(id)}")

    def rotate_token(self, id: str) -> _One:
        """Revoke a token and return its twin with a new secret (in ``token``)."""
        return self._one("POST", f"/v1/tokens/{_segment(id)}/rotate")

    # -- spaces and members --

    def list_spaces(self) -> _Many:
        """The spaces you are a member of (admins and operators: all), by slug."""
        return self._many("/v1/spaces")

    def create_space(self, slug: str, name: str | None = None, owner_id: str | None = None) -> _One:
        """Create a space (admins and operators); you, or ``owner_id``, own it."""
        body = present(slug=slug, name=name, owner_id=owner_id)
        return self._one("POST", "/v1/spaces", json=body)

    def get_space(self, ref: str) -> _One:
        """A space by id or slug."""
        return self._one("GET", f"/v1/spaces/{_segment(ref)}")

    def rename_space(self, ref: str, name: str) -> _One:
        """Change a space's display name (space admins); the slug stays."""
        return self._one("PATCH", f"/v1/spaces/{_segment(ref)}", json={"name": name})

    def list_members(self, space: str) -> _Many:
        """A space's members, by name."""
        return self._many(f"/v1/spaces/{_segment(space)}/members")

    def put_member(self, space: str, principal: str, role: str) -> _One:
        """Add ``principal`` to ``space`` with ``role``, or change its role."""
        path = f"/v1/spaces/{_segment(space)}/members/{_segment(principal)}"
        return self._one("PUT", path, json={"role": role})

    def remove_member(self, space: str, principal: str) -> _Done:
        """Remove ``principal`` from ``space``."""
        return self._done("DELETE", f"/v1/spaces/{_segment(space)}/members/{_segment(principal)}")


class Client(_KernelRoutes[dict[str, Any], list[dict[str, Any]], None]):
    """A synchronous client; use it as a context manager or call :meth:`close`."""

    _http: httpx.Client

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.2,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        super().__init__(url, token, retries, backoff)
        self._http = httpx.Client(base_url=self.url, timeout=timeout, transport=transport)

    def request(
        self,
        method: str,
        path: str,
        json: Any = None,
        params: Any = None,
        idempotency_key: str | None = None,
        retries: int | None = None,
    ) -> Any:
        """Send a request and return its decoded answer (``None`` when empty).

        Mutations carry ``idempotency_key`` (a fresh UUID when not given),
        the same on every retry. Connection failures, timeouts and 502/503/504
        are retried ``retries`` times with exponential backoff. Raises a
        :class:`BuildMaxError` subclass for an error answer (and
        :class:`Redirected` for a redirect, never followed),
        :class:`Unreachable` when the server never answers and
        :class:`ForeignOrigin` (sending nothing) when ``path`` is a URL on
        another server.
        """
        headers = self._headers(method, idempotency_key)
        request = self._own(
            self._http.build_request(method, path, json=json, params=params, headers=headers)
        )
        limit = self.retries if retries is None else retries
        attempt = 0
        while True:
            outcome = self._send(request)
            delay = self._delay(attempt, limit, outcome)
            if delay is None:
                return self._result(outcome)
            time.sleep(delay)
            attempt += 1

    def _send(self, request: httpx.Request) -> httpx.Response | httpx.TransportError:
        try:
            return self._http.send(request)
        except httpx.TransportError as exc:
            return exc

    @contextlib.contextmanager
    def stream(
        self,
        method: str,
        path: str,
        *,
        params: Any = None,
        content: bytes | Iterator[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> Iterator[httpx.Response]:
        """Send a request whose body or answer streams (an upload, a
        download); yields the open response, closed on exit.

        Not retried: a streamed body cannot be sent twice. Raises like
        :meth:`request` for an error answer or an unreachable server, and
        :class:`IncompleteDownload` when the answer breaks off mid-body."""
        request = self._own(
            self._http.build_request(
                method,
                path,
                params=params,
                content=content,
                headers=self._stream_headers(method, idempotency_key, headers),
            )
        )
        try:
            response = self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise Unreachable(self.url, exc) from exc
        try:
            if _refused(response):
                response.read()
                raise self.errors.error_from(response)
            yield response
        except httpx.TransportError as exc:  # the answer broke off mid-body
            raise IncompleteDownload(_where(request), exc) from exc
        finally:
            response.close()

    def paginate(self, path: str, params: dict[str, Any] | None = None) -> Iterator[dict[str, Any]]:
        """Every item of a list endpoint, following ``next_cursor`` page by page."""
        cursor: str | None = None
        while True:
            page = self.request("GET", path, params=_page_params(params, cursor))
            yield from page["items"]
            cursor = page.get("next_cursor")
            if not cursor:
                return

    def _one(self, method: str, path: str, json: Any = None) -> dict[str, Any]:
        return cast(dict[str, Any], self.request(method, path, json=json))

    def _many(self, path: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return list(self.paginate(path, params))

    def _done(self, method: str, path: str) -> None:
        self.request(method, path)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncClient(
    _KernelRoutes[Awaitable[dict[str, Any]], Awaitable[list[dict[str, Any]]], Awaitable[None]]
):
    """The asynchronous twin of :class:`Client`: the same calls, awaited."""

    _http: httpx.AsyncClient

    def __init__(
        self,
        url: str | None = None,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.2,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        super().__init__(url, token, retries, backoff)
        self._http = httpx.AsyncClient(base_url=self.url, timeout=timeout, transport=transport)

    async def request(
        self,
        method: str,
        path: str,
        json: Any = None,
        params: Any = None,
        idempotency_key: str | None = None,
        retries: int | None = None,
    ) -> Any:
        """Like :meth:`Client.request`, awaited."""
        headers = self._headers(method, idempotency_key)
        request = self._own(
            self._http.build_request(method, path, json=json, params=params, headers=headers)
        )
        limit = self.retries if retries is None else retries
        attempt = 0
        while True:
            outcome = await self._send(request)
            delay = self._delay(attempt, limit, outcome)
            if delay is None:
                return self._result(outcome)
            await asyncio.sleep(delay)
            attempt += 1

    async def _send(self, request: httpx.Request) -> httpx.Response | httpx.TransportError:
        try:
            return await self._http.send(request)
        except httpx.TransportError as exc:
            return exc

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        params: Any = None,
        content: bytes | AsyncIterator[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
    ) -> AsyncIterator[httpx.Response]:
        """Like :meth:`Client.stream`, awaited."""
        request = self._own(
            self._http.build_request(
                method,
                path,
                params=params,
                content=content,
                headers=self._stream_headers(method, idempotency_key, headers),
            )
        )
        try:
            response = await self._http.send(request, stream=True)
        except httpx.TransportError as exc:
            raise Unreachable(self.url, exc) from exc
        try:
            if _refused(response):
                await response.aread()
                raise self.errors.error_from(response)
            yield response
        except httpx.TransportError as exc:  # the answer broke off mid-body
            raise IncompleteDownload(_where(request), exc) from exc
        finally:
            await response.aclose()

    async def paginate(
        self, path: str, params: dict[str, Any] | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Like :meth:`Client.paginate`, as an async iterator."""
        cursor: str | None = None
        while True:
            page = await self.request("GET", path, params=_page_params(params, cursor))
            for item in page["items"]:
                yield item
            cursor = page.get("next_cursor")
            if not cursor:
                return

    async def _one(self, method: str, path: str, json: Any = None) -> dict[str, Any]:
        return cast(dict[str, Any], await self.request(method, path, json=json))

    async def _many(self, path: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return [item async for item in self.paginate(path, params)]

    async def _done(self, method: str, path: str) -> None:
        await self.request(method, path)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def sign_in(url: str, name: str, password: str, **options: Any) -> dict[str, Any]:
    """Sign in with a name and password (``POST /v1/sessions``, no token needed).

    Returns the issued session token's body; the secret is in ``token``.
    ``options`` go to :class:`Client`.
    """
    with Client(url, token="", **options) as anonymous:
        body = {"name": name, "password": password}
        return cast(dict[str, Any], anonymous.request("POST", "/v1/sessions", json=body))


class OverClient:
    """Base of a plugin's synchronous client: its calls go through a kernel
    :class:`Client` (which the caller opens and closes), so they share its
    connection, retries, idempotency keys and paging. Wrapping a client
    makes it raise the plugin's exceptions (``ERRORS``) for its problems."""

    #: The plugin's exception classes, each declared with ``answers=``.
    ERRORS: ClassVar[tuple[type[BuildMaxError], ...]] = ()

    def __init__(self, client: Client) -> None:
        self.client = client
        client.errors.add(*self.ERRORS)

    def _one(self, method: str, path: str, json: Any = None) -> dict[str, Any]:
        return cast(dict[str, Any], self.client.request(method, path, json=json))

    def _many(self, path: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return list(self.client.paginate(path, params))

    def _done(self, method: str, path: str) -> None:
        self.client.request(method, path)


class OverAsyncClient:
    """The asynchronous twin of :class:`OverClient`, over an :class:`AsyncClient`."""

    ERRORS: ClassVar[tuple[type[BuildMaxError], ...]] = ()

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        client.errors.add(*self.ERRORS)

    async def _one(self, method: str, path: str, json: Any = None) -> dict[str, Any]:
        return cast(dict[str, Any], await self.client.request(method, path, json=json))

    async def _many(self, path: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        return [item async for item in self.client.paginate(path, params)]

    async def _done(self, method: str, path: str) -> None:
        await self.client.request(method, path)
