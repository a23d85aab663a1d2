"""SIGTERM drains a real ``buildmax serve``: readiness goes red at once,
event streams end promptly, requests in flight finish, every worker too."""

from __future__ import annotations

import re
import signal
import threading
import time
from typing import Any

import httpx
import pytest

from buildmax.config import Config
from buildmax.testing import start_server

TOKEN = re.compile(r"bmx_[A-Za-z0-9_-]{43}")

#: Long, so that a stream held until the grace period ends would show.
GRACE = "30"


def _slow(url: str, headers: dict[str, str], results: list[Any], hold: float) -> threading.Thread:
    def run() -> None:
        try:
            results.append(httpx.post(url + f"?hold={hold}", headers=headers, timeout=30))
        except httpx.HTTPError as exc:
            results.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.engine_independent
def test_one_worker_drains_on_sigterm(tmp_path):
    server = start_server(
        Config(data_dir=str(tmp_path / "d")),
        tmp_path / "serve.log",
        extra_env={"BUILDMAX_SHUTDOWN_GRACE_SECONDS": GRACE},
    )
    try:
        token = TOKEN.findall(server.log())[0]
        headers = {"Authorization": f"Bearer {token}"}
        space = httpx.post(server.url + "/v1/spaces", json={"slug": "s1"}, headers=headers).json()
        kept = httpx.Client(base_url=server.url, headers=headers)
        assert kept.get("/v1/spaces").headers.get("connection", "") != "close"

        stream_lines: list[str] = []
        stream_ended: list[float] = []

        def follow() -> None:
            with httpx.stream(
                "GET", f"{server.url}/v1/spaces/s1/events", headers=headers, timeout=60
            ) as response:
                for line in response.iter_lines():
                    stream_lines.append(line)
            stream_ended.append(time.monotonic())

        follower = threading.Thread(target=follow)
        follower.start()
        deadline = time.monotonic() + 10
        while not stream_lines and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stream_lines, "the event stream did not start"

        results: list[Any] = []
        slow = _slow(
            f"{server.url}/v1/spaces/{space['id']}/testplugin/slow-increment", headers, results, 3
        )
        time.sleep(0.5)
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.3)

        ready = httpx.get(server.url + "/readyz")
        assert ready.status_code == 503
        assert ready.json()["type"] == "urn:buildmax:problem:server-draining"
        assert httpx.get(server.url + "/livez").status_code == 200
        # A kept-alive connection is told to close after this answer.
        assert kept.get("/v1/spaces").headers["connection"] == "close"

        follower.join(10)
        assert stream_ended, "the event stream was not ended"
        assert stream_ended[0] - signalled < 5  # promptly, not after the 30 s grace
        assert "event: server-closing" in stream_lines

        slow.join(20)
        assert results and isinstance(results[0], httpx.Response), results
        assert results[0].status_code == 200 and results[0].json() == {"value": 1}
        assert server.process.wait(20) == 0
        log = server.log()
        assert "Traceback" not in log and "CancelledError" not in log, log
        assert token not in log.replace(f"      {token}", "")  # printed once, at bootstrap
    finally:
        server.stop()


@pytest.mark.postgres_only
def test_two_workers_drain_and_drop_no_request_in_flight(buildmax_database_url, tmp_path):
    settings = Config(data_dir=str(tmp_path / "d"), database_url=buildmax_database_url)
    server = start_server(
        settings,
        tmp_path / "serve.log",
        extra_env={"BUILDMAX_WORKERS": "2", "BUILDMAX_SHUTDOWN_GRACE_SECONDS": GRACE},
    )
    try:
        # The server answers once its first worker does; wait for the second
        # too, so that each has requests in flight when the signal comes.
        deadline = time.monotonic() + 30
        while server.log().count("Running on") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.log().count("Running on") == 2, server.log()
        token = TOKEN.findall(server.log())[0]
        headers = {"Authorization": f"Bearer {token}"}
        spaces = [
            httpx.post(server.url + "/v1/spaces", json={"slug": f"s{i}"}, headers=headers).json()
            for i in range(6)
        ]
        results: list[Any] = []
        # One long request and a few short ones: the worker without the long
        # one is idle soon after the signal, and must not take the other
        # worker (and its request in flight) down with it when it exits.
        threads = [
            _slow(
                f"{server.url}/v1/spaces/{s['id']}/testplugin/slow-increment",
                headers,
                results,
                5 if i == 0 else 0.5,
            )
            for i, s in enumerate(spaces)
        ]
        time.sleep(0.3)
        server.process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(30)
        assert len(results) == 6
        assert all(isinstance(r, httpx.Response) and r.status_code == 200 for r in results), results
        assert server.process.wait(30) == 0
        log = server.log()
        assert log.count("draining:") == 2, log  # each worker drained
        assert "Traceback" not in log, log
    finally:
        server.stop()
