"""``buildmax serve`` as a user runs it: a real process on a real port."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import httpx
import pytest

from buildmax.config import Config
from buildmax.testing import start_server

TOKEN = re.compile(r"bmx_[A-Za-z0-9_-]{43}")


@pytest.mark.engine_independent
def test_a_fresh_data_dir_comes_up_with_a_working_admin_token(tmp_path):
    """J01: serve on an empty directory creates the database, bootstraps an
    admin, prints its token once, and is ready."""
    data = tmp_path / "fresh"
    server = start_server(Config(data_dir=str(data)), tmp_path / "serve.log")
    try:
        tokens = TOKEN.findall(server.log())
        assert len(tokens) == 1
        headers = {"Authorization": f"Bearer {tokens[0]}"}
        assert httpx.get(server.url + "/readyz").json()["checks"] == {
            "database": "ok",
            "migrations": "current",
        }
        created = httpx.post(server.url + "/v1/spaces", json={"slug": "first"}, headers=headers)
        assert created.status_code == 201
        listed = httpx.get(server.url + "/v1/spaces", headers=headers).json()
        assert [s["slug"] for s in listed["items"]] == ["first"]
        assert (data / "buildmax.db").is_file()
        # In-flight work finishes and the process exits cleanly on SIGTERM.
        assert server.stop() == 0
    finally:
        server.stop()
    again = start_server(Config(data_dir=str(data)), tmp_path / "again.log")
    try:
        assert TOKEN.findall(again.log()) == []  # no second admin, no second token
        headers = {"Authorization": f"Bearer {tokens[0]}"}
        listed = httpx.get(again.url + "/v1/spaces", headers=headers).json()
        assert [s["slug"] for s in listed["items"]] == ["first"]  # nothing lost
    finally:
        again.stop()


@pytest.mark.engine_independent
def test_sigterm_lets_an_in_flight_request_finish(tmp_path):
    import threading

    server = start_server(Config(data_dir=str(tmp_path / "d")), tmp_path / "serve.log")
    try:
        token = TOKEN.findall(server.log())[0]
        headers = {"Authorization": f"Bearer {token}"}
        space = httpx.post(server.url + "/v1/spaces", json={"slug": "s1"}, headers=headers).json()
        result: dict = {}

        def slow() -> None:
            url = f"{server.url}/v1/spaces/{space['id']}/testplugin/slow-increment?hold=1"
            result["response"] = httpx.post(url, headers=headers, timeout=10)

        worker = threading.Thread(target=slow)
        worker.start()
        import time

        time.sleep(0.3)
        server.process.send_signal(signal.SIGTERM)
        worker.join(10)
        assert result["response"].status_code == 200
        assert result["response"].json() == {"value": 1}
        assert server.process.wait(20) == 0
    finally:
        server.stop()


@pytest.mark.engine_independent
def test_two_workers_on_sqlite_are_refused_with_a_pointer_to_postgresql(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "buildmax", "serve", "--workers", "2", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "PostgreSQL" in done.stderr
    assert not (tmp_path / "buildmax.db").exists()
