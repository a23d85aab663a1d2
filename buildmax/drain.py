"""Draining: how a server process stops without dropping work.

On SIGTERM (:mod:`buildmax.serving`) the process drains before it stops:
``/readyz`` answers 503 ``draining`` at once (a load balancer sends new
work elsewhere) while ``/livez`` stays 200; every response carries
``Connection: close``, so a kept-alive connection takes no further
request; every open event stream gets a last ``server-closing`` event and
ends; the requests in flight finish. The listener closes when none is left,
or when ``shutdown_grace_seconds`` have passed.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

#: ASGI scope types that are requests (the lifespan scope is not one).
_REQUEST_SCOPES = frozenset({"http", "websocket"})


class Drain:
    """The drain state of one server process (``app.drain``) and its
    count of requests in flight."""

    def __init__(self) -> None:
        self.draining = False
        #: When the drain began (``time.monotonic()``), once it has.
        self.since: float | None = None
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def in_flight(self) -> int:
        """Requests this process is answering now."""
        return self._in_flight

    def begin(self) -> None:
        """Start draining (idempotent)."""
        if not self.draining:
            self.draining = True
            self.since = time.monotonic()

    async def wait_idle(self, seconds: float) -> bool:
        """Wait until no request is in flight, for at most ``seconds``;
        whether that happened."""
        try:
            async with asyncio.timeout(seconds):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def counting(self, app: Any) -> Any:
        """``app`` (an ASGI application) with its requests counted."""

        async def counted(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] not in _REQUEST_SCOPES:
                await app(scope, receive, send)
                return
            self._in_flight += 1
            self._idle.clear()
            try:
                await app(scope, receive, send)
            finally:
                self._in_flight -= 1
                if self._in_flight == 0:
                    self._idle.set()

        return counted
