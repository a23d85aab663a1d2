"""The pages' own event stream over real HTTP: the session cookie opens it
(``EventSource`` sends no header), it tells a page what changed from now
on, and it ends when the session does."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from buildmax.testing import call

from .conftest import PASSWORD, csrf_of, make_task


async def _events(
    response: httpx.Response, count: int, within: float = 2.0
) -> list[dict[str, Any]]:
    """The next ``count`` named events of a stream (comments skipped)."""
    got: list[dict[str, Any]] = []
    lines = response.aiter_lines()

    async def read() -> None:
        event: dict[str, Any] = {}
        async for line in lines:
            if line == "":
                if "event" in event:
                    got.append(event)
                    if len(got) == count:
                        return
                event = {}
            elif not line.startswith(":"):
                field, _, value = line.partition(": ")
                event[field] = json.loads(value) if field == "data" else value

    await asyncio.wait_for(read(), within)
    return got


@pytest.fixture
async def signed_in(live_server: str) -> AsyncIterator[Any]:
    """``await signed_in(who)``: an HTTP client holding ``who``'s session."""
    clients: list[httpx.AsyncClient] = []

    async def sign_in(who: Any) -> httpx.AsyncClient:
        session = httpx.AsyncClient(base_url=live_server, timeout=10)
        clients.append(session)
        form = await session.get("/ui/sign-in")
        answer = await session.post(
            "/ui/sign-in",
            data={
                "csrf": csrf_of(form.text),
                "name": who.name,
                "password": PASSWORD,
                "next": "/ui/",
            },
        )
        assert answer.status_code == 303, answer.text
        return session

    yield sign_in
    for session in clients:
        await session.aclose()


async def test_a_claim_reaches_the_open_page_within_two_seconds(client, team, signed_in):
    task = await make_task(client, team, "before the page opened")
    session = await signed_in(team.owner)
    path = f"/ui/spaces/{team.space.id}/events"
    async with session.stream("GET", path, headers={"Accept": "text/event-stream"}) as stream:
        assert stream.status_code == 200
        assert stream.headers["content-type"].startswith("text/event-stream")
        await call(
            client,
            "POST",
            f"{team.base}/tasks/{task['id']}/claim",
            team.agent,
            json={},
            expect=201,
        )
        [event] = await _events(stream, 1)
    # From now on: the task's creation, before the page opened, is not replayed.
    assert event["event"] == "changed"
    assert event["data"] == {"type": "task.claimed"}
    assert int(event["id"]) > 0


async def test_a_stranger_gets_no_stream(client, team, signed_in, person):
    stranger = await person()
    session = await signed_in(stranger)
    answer = await session.get(f"/ui/spaces/{team.space.id}/events")
    assert answer.status_code == 404
    assert answer.headers["content-type"].startswith("text/html")


async def test_the_stream_ends_when_the_session_is_revoked(client, team, signed_in):
    session = await signed_in(team.owner)
    csrf = csrf_of((await session.get("/ui/")).text)
    async with session.stream("GET", f"/ui/spaces/{team.space.id}/events") as stream:
        assert stream.status_code == 200
        other = httpx.AsyncClient(base_url=str(session.base_url), cookies=session.cookies)
        async with other:
            out = await other.post("/ui/sign-out", data={"csrf": csrf})
            assert out.status_code == 303
        await make_task(client, team, "after sign-out")
        [event] = await _events(stream, 1)
    assert event["event"] == "access-ended"


async def test_a_last_event_id_that_is_no_event_id_starts_from_now(client, team, signed_in):
    session = await signed_in(team.owner)
    path = f"/ui/spaces/{team.space.id}/events"
    for resume in ("\u00b2".encode(), b"-1", b"9" * 40):
        headers = {"Last-Event-ID": resume}
        async with session.stream("GET", path, headers=headers) as stream:
            assert stream.status_code == 200, resume
