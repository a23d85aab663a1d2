"""The HTTP API, called in-process with a caller's identity.

This is how a plugin reads another plugin's views and performs its
operations (a board listing tasks, a tool claiming one, an importer
creating them): through the same routes as every client, so the same role
checks, validation, limits, idempotency, audit events and stream events
apply, and the acting principal is the caller, never the plugin::

    caller = await authenticate()
    api = InternalApi(current_buildmax(), caller)
    ready = await api.get(f"/v1/spaces/{space}/ready", params={"limit": "20"})
    claimed = await api.request("POST", f"/v1/spaces/{space}/claims", json={})

The request never leaves the process (no socket, no token secret): the
caller rides in the request's ASGI scope, which a request from the network
cannot set, and is checked again as its token and principal stand now. An
error answer raises the same :class:`~buildmax.problems.Problem`, so a route
that lets it propagate answers its own caller with it. A path whose
segment is a dot segment or holds an encoded ``/`` is refused (404): the
client or the router would turn it into another route's. Call it outside any
write transaction: each call is a request of its own, with its own (and
from the task that would hold one: a task it started cannot be told apart).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Mapping,
    MutableMapping,
)
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import httpx
from quart.globals import _cv_app

from .auth import ACTING_CALLER, Caller
from .database.base import refuse_nested
from .idempotency import HEADER
from .problems import PROBLEM_TYPE_PREFIX, BadRequest, NotFound, Problem

if TYPE_CHECKING:
    from hypercorn.typing import HTTPScope

    from .app import BuildMax

#: The base URL in-process requests are addressed to (they reach no network).
INTERNAL_URL = "http://buildmax.internal"
#: Members of a problem document that are not extra members.
_PROBLEM_MEMBERS = frozenset({"type", "title", "status", "detail", "instance", "request_id"})


#: The ASGI scope key giving an in-process request its request id.
REQUEST_ID_SCOPE = "buildmax.request_id"


class InternalApi:
    """The HTTP API of ``app``, called in-process as ``caller``.

    ``request_id`` is the request id its requests carry (in their answers,
    logs and audit events) instead of a fresh one: a plugin that serves
    another protocol marks the calls made through it (``mcp/...``). Like the
    caller, it rides in the ASGI scope, where a network request cannot put
    it; give it a ``/``, which an ``X-Request-Id`` from the network cannot
    hold, so that the mark cannot be forged.
    """

    def __init__(self, app: BuildMax, caller: Caller, *, request_id: str | None = None) -> None:
        self._app = app
        self.caller = caller
        self.request_id = request_id

    async def _asgi(
        self,
        scope: MutableMapping[str, Any],
        receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
        send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
    ) -> None:
        acting = cast(
            "HTTPScope",
            {**scope, ACTING_CALLER: self.caller, REQUEST_ID_SCOPE: self.request_id},
        )
        # An app context of its own, so a ``g`` of its own: the request that
        # makes this one keeps its request id, timing and caller.
        outer = _cv_app.set(None)  # type: ignore[arg-type]
        try:
            await self._app(acting, receive, send)  # type: ignore[arg-type]
        finally:
            _cv_app.reset(outer)

    async def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        content: bytes | AsyncIterable[bytes] | None = None,
        content_type: str = "application/octet-stream",
        content_length: int | None = None,
    ) -> Any:
        """The decoded answer of a 2xx (``None`` when empty); the answer's
        :class:`~buildmax.problems.Problem` for any other status. ``content``
        is the body of a route that takes raw bytes (an upload), sent as
        ``content_type``: bytes, or chunks the route reads as they come (a
        relayed upload, never held whole, whose declared ``content_length``
        the route then sees, as it would the client's); ``json`` that of
        every other route."""
        refuse_nested()
        _checked_path(path)
        headers: dict[bytes, bytes] = {}
        if content is not None:
            headers[b"content-type"] = _header_value("Content-Type", content_type)
        if content_length is not None:
            headers[b"content-length"] = str(content_length).encode()
        if idempotency_key is not None:
            headers[HEADER.lower().encode()] = _header_value(HEADER, idempotency_key)
        transport = httpx.ASGITransport(app=self._asgi)
        async with httpx.AsyncClient(transport=transport, base_url=INTERNAL_URL) as client:
            response = await client.request(
                method, path, json=json, content=content, params=params, headers=headers
            )
        if not response.is_success:
            raise _problem_of(response)
        if not response.content:
            return None
        if response.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise ValueError(
                f"{method} {path} answers {response.headers.get('content-type')!r}: the "
                "in-process API reads JSON routes only"
            )
        return response.json()

    @contextlib.asynccontextmanager
    async def stream(
        self, path: str, *, headers: Mapping[str, str] | None = None
    ) -> AsyncIterator[Streamed]:
        """``GET path`` whatever its media type (a download), its body
        streamed as the route sends it, never held whole: a plugin relays
        it chunk by chunk. An error answer raises its
        :class:`~buildmax.problems.Problem` before the block runs. Leaving
        the block early stops the route."""
        refuse_nested()
        url = httpx.URL(_checked_path(path))
        sent: list[tuple[bytes, bytes]] = [
            (b"host", b"buildmax.internal"),
            *(
                (k.lower().encode("latin-1"), _header_value(k, v))
                for k, v in (headers or {}).items()
            ),
        ]
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": url.path,
            "raw_path": url.raw_path.split(b"?")[0],
            "query_string": url.query,
            "root_path": "",
            "headers": sent,
            "client": ("127.0.0.1", 0),
            "server": ("buildmax.internal", 80),
            "extensions": {},
        }
        chunks: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue(maxsize=_STREAM_AHEAD)
        ended = asyncio.Event()

        async def receive() -> MutableMapping[str, Any]:
            if not ended.is_set():
                ended.set()
                return {"type": "http.request", "body": b"", "more_body": False}
            await asyncio.Event().wait()  # the request has no more body: wait to be stopped
            raise AssertionError("unreachable")

        async def send(message: MutableMapping[str, Any]) -> None:
            await chunks.put(message)

        route = asyncio.create_task(self._asgi(scope, receive, send))
        try:
            start = await _next_message(chunks, route)
            status = int(start["status"])
            answer = Streamed(
                status,
                httpx.Headers(
                    [(k.decode("latin-1"), v.decode("latin-1")) for k, v in start["headers"]]
                ),
                _body(chunks, route),
            )
            if not 200 <= status < 300:
                body = b"".join([chunk async for chunk in answer.body][:_ERROR_CHUNKS])
                raise _problem_of(httpx.Response(status, headers=answer.headers, content=body))
            yield answer
        finally:
            if not route.done():
                route.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await route

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """``GET path``: the decoded answer."""
        return await self.request("GET", path, params=params)

    async def paginate(
        self, path: str, params: Mapping[str, str] | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Every item of a list route, page after page (``next_cursor``)."""
        query = dict(params or {})
        while True:
            page = await self.get(path, query)
            for item in page["items"]:
                yield item
            if not page.get("next_cursor"):
                return
            query["cursor"] = page["next_cursor"]


#: Messages of a streamed answer the route may send ahead of its reader.
_STREAM_AHEAD = 4
#: Body chunks of an error answer read to build its problem.
_ERROR_CHUNKS = 16


@dataclass(frozen=True)
class Streamed:
    """A streamed answer: its status, headers and body chunks."""

    status: int
    headers: httpx.Headers
    body: AsyncIterator[bytes]


async def _next_message(
    chunks: asyncio.Queue[MutableMapping[str, Any]], route: asyncio.Task[None]
) -> MutableMapping[str, Any]:
    """The route's next message; if the route ended without sending one,
    its error (or a 500 problem)."""
    getting = asyncio.ensure_future(chunks.get())
    done, _ = await asyncio.wait({getting, route}, return_when=asyncio.FIRST_COMPLETED)
    if getting in done:
        return getting.result()
    getting.cancel()
    route.result()  # raises what the route raised
    raise Problem("the route ended without an answer")


async def _body(
    chunks: asyncio.Queue[MutableMapping[str, Any]], route: asyncio.Task[None]
) -> AsyncIterator[bytes]:
    while True:
        message = await _next_message(chunks, route)
        if message["type"] != "http.response.body":
            continue
        if message.get("body"):
            yield bytes(message["body"])
        if not message.get("more_body", False):
            return


#: What no in-process path may hold: a dot segment (an HTTP client folds it
#: into the segment before) or an encoded ``/`` or ``\\`` (the router decodes
#: it before matching), either of which would reach another route.
_SEGMENT_TRICKS = frozenset({".", "..", "%2e", "%2e%2e", ".%2e", "%2e."})


def _checked_path(path: str) -> str:
    """``path`` if each of its segments names one thing; else 404, as a
    route the path does not name would answer."""
    raw = path.split("?", 1)[0]
    lowered = raw.lower()
    if "%2f" in lowered or "%5c" in lowered or "\\" in raw:
        raise NotFound("no such resource")
    if any(segment.lower() in _SEGMENT_TRICKS for segment in raw.split("/")):
        raise NotFound("no such resource")
    return path


def _header_value(name: str, value: str) -> bytes:
    """``value`` as a header from the network arrives (latin-1, no control
    characters; the route checks the rest), or 400."""
    try:
        encoded = value.encode("latin-1")
    except UnicodeEncodeError:
        encoded = b"\x00"
    if any(byte < 0x20 or byte == 0x7F for byte in encoded):
        raise BadRequest(f"{name} must be latin-1 text without control characters")
    return encoded


#: Headers of an error answer its problem keeps (when to retry; what a
#: range request may ask instead).
_KEPT_HEADERS = ("Retry-After", "Content-Range")


def _problem_of(response: httpx.Response) -> Problem:
    """The problem an error answer stands for, extra members and
    :data:`_KEPT_HEADERS` kept."""
    try:
        body = response.json()
    except ValueError:
        body = None
    headers = {name: response.headers[name] for name in _KEPT_HEADERS if name in response.headers}
    if not isinstance(body, dict) or not str(body.get("type", "")).startswith(PROBLEM_TYPE_PREFIX):
        return Problem(
            status=response.status_code, slug=f"http-{response.status_code}", headers=headers
        )
    extra = {key: value for key, value in body.items() if key not in _PROBLEM_MEMBERS}
    return Problem(
        str(body.get("detail") or ""),
        status=response.status_code,
        slug=str(body["type"]).removeprefix(PROBLEM_TYPE_PREFIX),
        title=str(body.get("title") or ""),
        headers=headers,
        **extra,
    )
