"""Background work of an app (sweepers, reapers): started on startup,
cancelled and awaited on shutdown."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from buildmax_hookspecs import App


def start_background(app: App, key: str, work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` as a task of ``app`` (call from ``buildmax_startup``)
    until :func:`stop_background` with the same ``key``."""
    app.extensions[key] = asyncio.get_running_loop().create_task(work, name=key)


async def stop_background(app: App, key: str) -> None:
    """Cancel the task started under ``key`` (if any) and wait until it has
    stopped (call from ``buildmax_shutdown``)."""
    task = app.extensions.pop(key, None)
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
