"""Steps for the space-isolation journey (J02).

An event stream never ends by itself, so a plain ``request`` step cannot
open one: a refused stream answers at once, but a stream the server wrongly
opens would hold the step until the journey times out, and what it leaked
would never be seen. :func:`open_stream` reads for a bounded time instead and
saves what came, so a check can show it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import httpx

#: Bytes of a stream kept as evidence.
KEPT = 16 * 1024


async def open_stream(run: Any, path: str, actor: str, seconds: float = 2.0) -> dict[str, Any]:
    """Open ``GET path`` as ``actor`` and read it for at most ``seconds``.

    Saves ``status``, ``headers`` (lower-cased), ``body`` (the decoded JSON
    of a problem answer, else ``None``) and ``streamed``: the text that
    arrived before the time ran out or the server closed the answer, as a
    ``request`` step saves an answer, so the ``status`` grader reads it."""
    headers = {"Accept": "text/event-stream"}
    token = run.token(actor)
    if token:
        headers["Authorization"] = f"Bearer {token}"
    received = bytearray()
    async with (
        httpx.AsyncClient(timeout=httpx.Timeout(seconds + 5.0)) as http,
        http.stream("GET", run.url() + path, headers=headers) as answer,
    ):

        async def read() -> None:
            async for chunk in answer.aiter_bytes():
                received.extend(chunk)
                if len(received) >= KEPT:
                    return

        with contextlib.suppress(TimeoutError):  # a live stream: keep what arrived
            await asyncio.wait_for(read(), seconds)
        status = answer.status_code
        kept = {k.lower(): v for k, v in answer.headers.items()}
    text = bytes(received[:KEPT]).decode("utf-8", "replace")
    body: Any = None
    if "json" in kept.get("content-type", ""):
        try:
            body = json.loads(text)
        except ValueError:
            body = None
    return {"status": status, "headers": kept, "body": body, "streamed": text}
