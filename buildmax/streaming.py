"""Request bodies pulled from the connection only as fast as the handler
reads them.

Quart's own HTTP connection reads every incoming body message as it arrives
and appends it to the request's buffer, whether or not the handler has read
it: a client that sends faster than the handler writes (an upload to a blob
store) grows the server's memory by the whole body. Here the body is read
from the ASGI ``receive`` channel only when the handler asks for the next
chunk (``async for chunk in request.body``) or for all of it (``await
request.get_data()``), so the server holds at most one message per request
and the transport's flow control slows the client down.

A handler that streams a large body raises its own limit first with
:func:`allow_body`. A client that disconnects while its body is being read
cancels the handler, as Quart does; after the body is complete, a watcher
task reads ``receive`` for the disconnect.

A response body that finds it cannot send what its headers promised (a
stored blob that changed) raises :class:`ResponseAborted`: the answer ends
there, without its last message, and the server closes the connection, so
the client sees a body shorter than its ``Content-Length``. No traceback is
logged; whoever raised it logs why.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Any

from quart import Request, request
from quart.asgi import ASGIHTTPConnection
from quart.utils import cancel_tasks, raise_task_exceptions
from quart.wrappers.request import Body
from werkzeug.exceptions import BadRequest, RequestEntityTooLarge, RequestTimeout


class ClientGone(Exception):
    """The client disconnected before its body was complete."""


class ResponseAborted(Exception):
    """Raised by a response body to end the answer before its declared
    length (see the module); the message says why."""


class PulledBody(Body):
    """A request body read from the connection on demand (see the module)."""

    def __init__(self, expected_content_length: int | None, max_content_length: int | None) -> None:
        super().__init__(expected_content_length, max_content_length)
        self._expected = expected_content_length
        self._receive: Any = None
        self._lock = asyncio.Lock()
        self._received = 0
        self._pending: bytes | None = None
        #: Seconds a client may take to send the next piece of its body.
        self.idle_timeout: float | None = None
        #: Set once the last body message has arrived.
        self.finished = asyncio.Event()
        #: Set when the client went away before the body was complete.
        self.disconnected = asyncio.Event()

    def attach(self, receive: Any, idle_timeout: float | None = None) -> None:
        """Read from ``receive`` from now on (the ASGI connection calls it);
        a client silent for ``idle_timeout`` seconds mid-body gets 408."""
        self._receive = receive
        self.idle_timeout = idle_timeout

    def allow(self, max_bytes: int) -> None:
        """Accept a body of up to ``max_bytes`` (instead of the server-wide
        limit) if it has not been read yet."""
        self._max_content_length = max_bytes
        if self._received == 0:
            too_long = self._expected is not None and self._expected > max_bytes
            self._must_raise = RequestEntityTooLarge() if too_long else None

    async def next_chunk(self) -> bytes | None:
        """The next piece of the body (possibly empty); ``None`` once the
        body is complete. Raises 413 past the limit. If the client goes away
        meanwhile, waits to be cancelled by the connection."""
        try:
            return await self.pull()
        except ClientGone:
            await asyncio.Future()  # the connection cancels this handler now
            raise

    async def pull(self) -> bytes | None:
        """:meth:`next_chunk`, raising :class:`ClientGone` on a disconnect."""
        if self._must_raise is not None:
            raise self._must_raise
        async with self._lock:
            if self._pending is not None:
                chunk, self._pending = self._pending, None
            elif self.disconnected.is_set():
                raise ClientGone()
            elif self.finished.is_set():
                return None
            else:
                chunk = await self._receive_chunk()
        self._received += len(chunk)
        limit = self._max_content_length
        if limit is not None and self._received > limit:
            self._must_raise = RequestEntityTooLarge()
            raise self._must_raise
        if (
            self.finished.is_set()
            and self._pending is None
            and self._expected is not None
            and self._received < self._expected
        ):
            self._must_raise = BadRequest(
                f"the body ended after {self._received} of its {self._expected} declared bytes"
            )
            raise self._must_raise
        return chunk

    async def prefetch(self) -> None:
        """Receive the first message before the handler asks for it (so a
        bodiless request is complete at once); it is kept for the handler."""
        async with self._lock:
            if self._pending is None and not self.finished.is_set() and self._received == 0:
                self._pending = await self._receive_chunk()

    async def discard_rest(self) -> None:
        """Read and drop what is left of the body (after the handler
        answered without reading it all), so the server can finish the
        exchange; stops at the end of the body, a disconnect or a silence."""
        async with self._lock:
            self._pending = None
            while not self.finished.is_set():
                try:
                    await self._receive_chunk()
                except (ClientGone, RequestTimeout):
                    return

    async def _receive_chunk(self) -> bytes:
        # asyncio.timeout, not wait_for: wait_for wraps each receive() in a
        # task that runs a loop iteration later, even when the server has
        # the next message queued already (a large body is many messages).
        try:
            async with asyncio.timeout(self.idle_timeout):
                message = await self._receive()
        except TimeoutError:
            raise RequestTimeout() from None
        if message["type"] == "http.disconnect":
            self.disconnected.set()
            self.finished.set()
            raise ClientGone()
        if not message.get("more_body", False):
            self.finished.set()
        return bytes(message.get("body", b""))

    async def __anext__(self) -> bytes:
        if self._receive is None:
            return await super().__anext__()
        while True:
            chunk = await self.next_chunk()
            if chunk is None:
                raise StopAsyncIteration
            if chunk:
                return chunk

    def __await__(self) -> Generator[Any, None, Any]:
        if self._receive is None:
            return super().__await__()
        return self._read_all().__await__()

    async def _read_all(self) -> bytes:
        # Kept, like Quart's body, so that every later await returns it too.
        while (chunk := await self.next_chunk()) is not None:
            self._data.extend(chunk)
        return bytes(self._data)


class PulledRequest(Request):
    """A Quart request whose body is a :class:`PulledBody`."""

    body_class = PulledBody


def allow_body(max_bytes: int) -> PulledBody:
    """Let the current request's body be up to ``max_bytes``; the body, to
    read with ``async for chunk in body`` (one message in memory at a time)."""
    body = request.body
    if not isinstance(body, PulledBody):
        raise TypeError("the app does not pull request bodies (see buildmax.streaming)")
    body.allow(max_bytes)
    request.max_content_length = max_bytes
    return body


def _unread(request: Request, body: PulledBody) -> bool:
    """Whether the request has a body the handler did not read to its end."""
    if body.finished.is_set():
        return False
    chunked = "chunked" in request.headers.get("Transfer-Encoding", "").lower()
    return chunked or (request.content_length or 0) > 0


class PullingHTTPConnection(ASGIHTTPConnection):
    """Quart's HTTP connection, with bodies pulled on demand."""

    async def __call__(self, receive: Any, send: Any) -> None:
        request = self._create_request_from_scope(send)
        body = request.body
        assert isinstance(body, PulledBody)
        body.attach(receive, self.app.config["BODY_TIMEOUT"])
        drains: list[asyncio.Task[None]] = []

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start" and _unread(request, body):
                # An answer before the body was read (a refusal): this
                # connection cannot carry another request, so the client must
                # not send one on it.
                headers = [*message.get("headers", []), (b"connection", b"close")]
                message = {**message, "headers": headers}
            if (
                message["type"] == "http.response.body"
                and not message.get("more_body", False)
                and not body.finished.is_set()
                and not drains
            ):
                # The answer is complete but the body was not read whole (a
                # refusal): the server cannot end the exchange while the
                # client is still sending, so read the rest and drop it.
                drains.append(asyncio.ensure_future(body.discard_rest()))
            await send(message)

        handler = asyncio.ensure_future(self._answer(request, sending))
        watcher = asyncio.ensure_future(self._watch(body, receive))
        try:
            done, pending = await asyncio.wait(
                [handler, watcher], return_when=asyncio.FIRST_COMPLETED
            )
        except asyncio.CancelledError:
            # Whoever made the request gave up on it (a caller's timeout, a
            # server stopping): the handler ends with it, not after it.
            for task in (handler, watcher, *drains):
                task.cancel()
            await asyncio.gather(handler, watcher, *drains, return_exceptions=True)
            raise
        await cancel_tasks({*pending, *drains})
        raise_task_exceptions(done)

    async def _answer(self, request: Request, send: Any) -> None:
        """Handle the request; a body that raises :class:`ResponseAborted`
        ends the answer short, and the server closes the connection."""
        try:
            await self.handle_request(request, send)
        except ResponseAborted:
            return

    async def _watch(self, body: PulledBody, receive: Any) -> None:
        """Return when the client disconnects: while the body is being read
        the body notices it; afterwards this reads ``receive`` itself."""
        try:
            await body.prefetch()
        except ClientGone:
            return
        if not (body.finished.is_set() or body.disconnected.is_set()):
            # A body still coming (most are read whole by the prefetch).
            finished = asyncio.ensure_future(body.finished.wait())
            gone = asyncio.ensure_future(body.disconnected.wait())
            try:
                await asyncio.wait([finished, gone], return_when=asyncio.FIRST_COMPLETED)
            finally:
                await cancel_tasks({finished, gone})
        if body.disconnected.is_set():
            return
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
