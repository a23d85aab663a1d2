"""Artifacts as pages show them: a diff rendered as a diff, short text
inline, an image as an image (served by the dashboard's download route),
everything else a download. Bytes are read through the artifacts plugin's
own download route as the signed-in person, bounded, never whole."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

from buildmax.internal import InternalApi
from buildmax.problems import Problem

from . import diffs

#: Largest text artifact shown inline.
TEXT_PREVIEW_BYTES = 256 * 1024
#: Largest diff rendered as a diff.
DIFF_PREVIEW_BYTES = 1024 * 1024
#: Bytes of artifacts a review page (whose diffs are its point) and a task
#: page (which refreshes itself) read to show inline, in all.
REVIEW_PAGE_BYTES = 2 * 1024 * 1024
TASK_PAGE_BYTES = 512 * 1024
#: Image types shown inline (the artifacts plugin serves these inline too).
IMAGES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
#: Text types shown inline besides ``text/*``.
_TEXTUAL = frozenset({"application/json", "application/x-ndjson", "application/xml"})


def content_path(space: str, artifact: str) -> str:
    """The API route of an artifact's bytes."""
    return f"/v1/spaces/{quote(space, safe='')}/artifacts/{quote(artifact, safe='')}/content"


async def _read(api: InternalApi, space: str, artifact: str, limit: int) -> bytes:
    """At most ``limit`` bytes of an artifact."""
    got = bytearray()
    async with api.stream(content_path(space, artifact)) as answer:
        async for chunk in answer.body:
            got += chunk[: limit - len(got)]
            if len(got) >= limit:
                break
    return bytes(got)


async def previews(
    api: InternalApi, space: str, found: list[dict[str, Any]], budget: int
) -> list[dict[str, Any]]:
    """Each of ``found`` as :func:`preview` shows it, diffs first, reading at
    most ``budget`` bytes for the page in all: past it, an artifact is a
    download that says why."""
    ordered = sorted(found, key=lambda a: not diffs.is_diff(a["name"], a["media_type"]))
    allowed = []
    for artifact in ordered:
        size = int(artifact["size"])
        allowed.append(size <= budget)
        if _read_inline(artifact) and size <= budget:
            budget -= size
    return list(
        await asyncio.gather(
            *(preview(api, space, a, within) for a, within in zip(ordered, allowed, strict=True))
        )
    )


def _read_inline(artifact: dict[str, Any]) -> bool:
    media_type = artifact["media_type"]
    textual = media_type.startswith("text/") or media_type in _TEXTUAL
    return textual or diffs.is_diff(artifact["name"], media_type)


async def preview(
    api: InternalApi, space: str, artifact: dict[str, Any], within_budget: bool = True
) -> dict[str, Any]:
    """``artifact`` with how a page shows it: ``kind`` is ``diff`` (with
    ``diff``), ``text`` (with ``text``), ``image`` or ``download``, and
    ``note`` says why a textual one is not shown inline."""
    name, media_type, size = artifact["name"], artifact["media_type"], int(artifact["size"])
    shown: dict[str, Any] = {**artifact, "kind": "download", "note": None}
    if media_type in IMAGES:
        return {**shown, "kind": "image"}
    if not _read_inline(artifact):
        return shown
    as_diff = diffs.is_diff(name, media_type)
    limit = DIFF_PREVIEW_BYTES if as_diff else TEXT_PREVIEW_BYTES
    if size > limit:
        return {**shown, "note": f"too large to show here ({size:,} bytes): download it"}
    if not within_budget:
        return {**shown, "note": "not shown: this page shows no more artifacts inline; download it"}
    try:
        text = (await _read(api, space, artifact["id"], limit)).decode("utf-8", errors="replace")
    except Problem as refused:
        return {**shown, "note": f"cannot be shown: {refused.detail}"}
    if as_diff:
        return {**shown, "kind": "diff", "diff": diffs.parse(text)}
    return {**shown, "kind": "text", "text": text}
