"""Two ``buildmax serve`` processes on one PostgreSQL database."""

from __future__ import annotations

import json
import re
import threading

import httpx
import pytest

from buildmax.config import Config
from buildmax.testing import start_server

pytestmark = pytest.mark.postgres_only

TOKEN = re.compile(r"bmx_[A-Za-z0-9_-]{43}")


@pytest.fixture
def two_servers(buildmax_database_url, tmp_path):
    settings = Config(data_dir=str(tmp_path / "data"), database_url=buildmax_database_url)
    first = start_server(settings, tmp_path / "a.log")
    second = None
    try:
        second = start_server(settings, tmp_path / "b.log")
        token = TOKEN.findall(first.log())[0]
        yield first, second, {"Authorization": f"Bearer {token}"}
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_a_token_revoked_through_one_process_fails_on_the_other(two_servers):
    a, b, admin = two_servers
    created = httpx.post(a.url + "/v1/tokens", json={"name": "agent"}, headers=admin).json()
    headers = {"Authorization": f"Bearer {created['token']}"}
    assert httpx.get(b.url + "/v1/principals/me", headers=headers).status_code == 200
    assert httpx.delete(f"{a.url}/v1/tokens/{created['id']}", headers=admin).status_code == 204
    refused = httpx.get(b.url + "/v1/principals/me", headers=headers)
    assert refused.status_code == 401
    assert refused.json()["detail"] == "the token was revoked"


def test_an_event_committed_through_one_process_reaches_a_subscriber_on_the_other(two_servers):
    a, b, admin = two_servers
    space = httpx.post(a.url + "/v1/spaces", json={"slug": "shared"}, headers=admin).json()
    received: list[dict] = []
    connected = threading.Event()

    def subscribe() -> None:
        url = f"{b.url}/v1/spaces/{space['id']}/events"
        with httpx.stream("GET", url, headers=admin, timeout=15) as response:
            event: dict = {}
            for line in response.iter_lines():
                if line.startswith(": connected"):
                    connected.set()
                elif line.startswith(("id:", "event:", "data:")):
                    field, _, value = line.partition(": ")
                    event[field] = value
                elif line == "" and event:
                    received.append(event)
                    return

    thread = threading.Thread(target=subscribe, daemon=True)
    thread.start()
    assert connected.wait(10)
    renamed = httpx.patch(
        f"{a.url}/v1/spaces/{space['id']}", json={"name": "Shared"}, headers=admin
    )
    assert renamed.status_code == 200
    thread.join(10)
    assert len(received) == 1
    assert received[0]["event"] == "space.updated"
    assert json.loads(received[0]["data"])["data"] == {"name": "Shared"}
