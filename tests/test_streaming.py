"""Request bodies are pulled from the connection as the handler reads them
(``buildmax.streaming``): a slow reader does not make the server buffer the
body, a streamed body has its own limit, and a client that goes away
mid-body cancels the handler. Driven at the ASGI level, like a server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from buildmax_hookspecs import hookimpl
from quart import Blueprint, Response

from buildmax.app import create_app
from buildmax.bodies import json_body, json_response
from buildmax.config import Config
from buildmax.problems import PayloadTooLarge
from buildmax.streaming import allow_body

pytestmark = pytest.mark.engine_independent

CHUNK = 64 * 1024


class Streamer:
    """``POST /v1/streamprobe?limit=N`` reads its body chunk by chunk, slowly."""

    def __init__(self) -> None:
        self.consumed = 0
        self.cancelled = False
        self.started = asyncio.Event()
        blueprint = Blueprint("streamprobe", __name__)

        @blueprint.post("/v1/streamprobe")
        async def read_slowly() -> Response:
            from quart import request
            from werkzeug.exceptions import RequestEntityTooLarge

            body = allow_body(int(request.args.get("limit", 10 * 2**20)))
            self.started.set()
            size = 0
            try:
                async for chunk in body:
                    size += len(chunk)
                    self.consumed += 1
                    await asyncio.sleep(0.002)
            except RequestEntityTooLarge:
                raise PayloadTooLarge("the body exceeds its limit") from None
            except asyncio.CancelledError:
                self.cancelled = True
                raise
            return json_response({"size": size})

        @blueprint.post("/v1/streamprobe/json")
        async def whole() -> Response:
            return json_response({"keys": sorted(await json_body())})

        @blueprint.post("/v1/streamprobe/ignore")
        async def ignore() -> Response:
            return json_response({"ignored": True})

        self.blueprint = blueprint

    @hookimpl
    def buildmax_blueprints(self, app: Any) -> list[Any]:
        return [self.blueprint]


@pytest.fixture
async def served(tmp_path):
    streamer = Streamer()
    app = create_app(
        Config(data_dir=str(tmp_path), load_plugins=""),
        extra_plugins=[("streamer", streamer)],
        auto_migrate=True,
    )
    async with app.test_app():
        yield app, streamer


class Client:
    """An ASGI client sending ``chunks`` messages of body, counting how many
    the server has asked for."""

    def __init__(self, chunks: int, *, disconnect_after: int | None = None) -> None:
        self.chunks, self.disconnect_after = chunks, disconnect_after
        self.asked = 0
        self.expect_drain = disconnect_after is None
        self.asked_at_response: int | None = None
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        self.asked += 1
        if self.disconnect_after is not None and self.asked > self.disconnect_after:
            return {"type": "http.disconnect"}
        if self.asked <= self.chunks:
            return {"type": "http.request", "body": b"x" * CHUNK, "more_body": True}
        if self.asked == self.chunks + 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Future()  # no disconnect until the response is sent
        raise AssertionError("unreachable")

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.asked_at_response = self.asked
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            # Like Hypercorn: the exchange ends only once the request's body
            # has been read (an unread body would block the connection).
            for _ in range(500):
                if self.asked > self.chunks or not self.expect_drain:
                    return
                await asyncio.sleep(0.01)
            raise AssertionError("the response ended with the request body unread")

    def status(self) -> int | None:
        start = [m for m in self.sent if m["type"] == "http.response.start"]
        return start[0]["status"] if start else None

    def closes(self) -> bool:
        """Whether the answer told the client not to reuse the connection."""
        [start] = [m for m in self.sent if m["type"] == "http.response.start"]
        return (b"connection", b"close") in [(k.lower(), v) for k, v in start["headers"]]


def scope(path: str, query: bytes = b"") -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query,
        "root_path": "",
        "headers": [(b"host", b"test"), (b"transfer-encoding", b"chunked")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8420),
    }


async def test_a_slow_reader_pulls_the_body_only_as_fast_as_it_reads(served):
    app, streamer = served
    client = Client(chunks=40)
    ahead = []

    async def watch() -> None:
        while True:
            ahead.append(client.asked - streamer.consumed)
            await asyncio.sleep(0.001)

    watcher = asyncio.create_task(watch())
    await app(scope("/v1/streamprobe"), client.receive, client.send)
    watcher.cancel()
    assert client.status() == 200
    assert streamer.consumed == 40
    # Never more than the chunk being read and one prefetched message ahead.
    assert max(ahead) <= 2, max(ahead)


async def test_a_streamed_body_past_its_limit_is_refused_as_it_arrives(served):
    app, _ = served
    client = Client(chunks=40)
    await app(scope("/v1/streamprobe", b"limit=200000"), client.receive, client.send)
    assert client.status() == 413
    # It answered at the first chunk past the limit (then dropped the rest).
    assert client.asked_at_response is not None and client.asked_at_response <= 5


async def test_a_client_that_goes_away_mid_body_cancels_the_handler(served):
    app, streamer = served
    client = Client(chunks=40, disconnect_after=5)
    await asyncio.wait_for(app(scope("/v1/streamprobe"), client.receive, client.send), 10)
    assert streamer.cancelled
    assert client.status() is None


async def test_a_handler_that_never_reads_the_body_answers(served):
    app, _ = served
    client = Client(chunks=40)
    await asyncio.wait_for(app(scope("/v1/streamprobe/ignore"), client.receive, client.send), 10)
    assert client.status() == 200
    # The rest of the body was read and dropped, so the server can end the
    # exchange (an unread body would block the connection for good).
    assert client.asked >= 41


async def test_a_refusal_before_the_body_is_read_still_ends_the_exchange(served):
    app, _ = served
    client = Client(chunks=40)
    await asyncio.wait_for(
        app(scope("/v1/streamprobe", b"limit=100"), client.receive, client.send), 10
    )
    assert client.status() == 413
    assert client.asked >= 41
    # The rest of the body was dropped: the client must not reuse the connection.
    assert client.closes()


async def test_an_answer_after_the_whole_body_keeps_the_connection(served):
    app, _ = served
    client = Client(chunks=4)
    await asyncio.wait_for(app(scope("/v1/streamprobe"), client.receive, client.send), 10)
    assert client.status() == 200 and not client.closes()
    bodiless = app.test_client()
    got = await bodiless.get("/livez")
    assert got.status_code == 200
    assert "close" not in got.headers.get("Connection", "")


async def test_a_client_silent_mid_body_gets_408(served):
    app, _ = served
    app.config["BODY_TIMEOUT"] = 0.2
    client = Client(chunks=3)
    client.expect_drain = False  # it stalls: the server gives up on it
    stalled = client.receive

    async def receive() -> dict[str, Any]:
        if client.asked == 2:
            await asyncio.sleep(5)
        return await stalled()

    await asyncio.wait_for(app(scope("/v1/streamprobe"), receive, client.send), 10)
    assert client.status() == 408


async def test_whole_bodies_keep_the_server_wide_limit(served):
    app, _ = served
    client = app.test_client()
    fine = await client.post("/v1/streamprobe/json", json={"a": 1, "b": "x" * 1000})
    assert (fine.status_code, await fine.get_json()) == (200, {"keys": ["a", "b"]})
    big = b'{"a": "' + b"x" * (2 * 2**20) + b'"}'
    refused = await client.post(
        "/v1/streamprobe/json", data=big, headers={"Content-Type": "application/json"}
    )
    assert refused.status_code == 413
