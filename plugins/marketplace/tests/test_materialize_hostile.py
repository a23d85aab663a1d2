"""``buildmax run materialize`` against a server it must not trust.

A hostile proxy sits between the worker and the real server (anyone on a
plain-HTTP path, or a compromised server): it forwards everything but
rewrites the first listing of pins, varying every field the worker reads,
and can serve bytes of its own. A second server stands for "another host"
and records what reaches it. Each case must end in one ``error:`` line, no
file outside the staging directory (nothing under the worker's directory
but its empty home), the attempt marked failed on the real server, and no
request carrying the run token anywhere but the worker's own server.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import hashlib
import io
import json
import re
import tarfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from buildmax_marketplace.materialize import MaterializationFailed, materialize
from buildmax_marketplace.package import Limits
from buildmax_marketplace.tables import materialization_failures
from buildmax_tasks.tables import attempts
from click.testing import CliRunner

from buildmax.cli import _register_commands, cli
from buildmax.client import TOKEN_ENV, URL_ENV, Client

from .archives import SKILL_ONLY, tar_gz

# What is tried is the worker's reading of what comes back; the server's
# side (a failed run recorded) runs on both engines in test_materialize.py.
pytestmark = pytest.mark.engine_independent

SKILLS = "notes"
_LISTING = re.compile(r"^/v1/attempts/[^/]+/packages$")
#: The worker's own limits in these tests (what ``DEFAULT_LIMITS`` would be).
SMALL = Limits(max_entries=20, max_total_bytes=1024 * 1024, max_ratio=200)


@dataclass
class Hostile:
    """A server in the middle: forwards to ``upstream`` (when given),
    rewrites the first listing (or ``every`` one) with ``rewrite``, serves
    the ``served`` paths itself, and keeps every request's method, path and
    headers."""

    upstream: str | None = None
    rewrite: Callable[[dict[str, Any]], Any] | None = None
    #: Rewrite every listing, not only the first.
    every: bool = False
    served: dict[str, bytes] = field(default_factory=dict)
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    url: str = ""

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Any:
        """(status, content type, body) of one request."""
        self.seen.append((method, path, headers))
        if path in self.served or self.upstream is None:
            return 200, "application/octet-stream", self.served.get(path, b"not for you")
        forwarded = {
            k: v
            for k, v in headers.items()
            if k.lower() in ("authorization", "content-type", "idempotency-key", "accept")
        }
        got = httpx.request(method, self.upstream + path, headers=forwarded, content=body)
        content = got.content
        if method == "GET" and _LISTING.match(path) and self.rewrite is not None:
            tampered = self.rewrite(got.json())
            content = tampered if isinstance(tampered, bytes) else json.dumps(tampered).encode()
            if not self.every:
                self.rewrite = None
        return got.status_code, got.headers.get("content-type", ""), content

    def tokens_seen(self) -> list[str]:
        """The ``Authorization`` headers that reached this server."""
        return [h["Authorization"] for _, _, h in self.seen if "Authorization" in h]


@contextlib.contextmanager
def serving(hostile: Hostile) -> Iterator[Hostile]:
    """Serve ``hostile`` on a free local port in a thread."""

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            status, kind, content = hostile.answer(
                self.command, self.path, dict(self.headers.items()), body
            )
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        do_GET = do_POST = _any

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    hostile.url = f"http://127.0.0.1:{server.server_address[1]}"
    # It looks for a shutdown every 0.05 s (not 0.5 s: a wait of each test).
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield hostile
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch, tmp_path):
    for name in (URL_ENV, TOKEN_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


@dataclass
class Scene:
    """The real server behind a hostile proxy, another host, and a claim."""

    market: Any
    proxy: Hostile
    elsewhere: Hostile
    claim: dict[str, Any]
    worker: Path
    outside: Path

    @property
    def home(self) -> Path:
        return self.worker / "home"

    async def materialize_command(self) -> Any:
        """``buildmax run materialize`` through the proxy; its result."""
        _register_commands()
        argv = ["run", "materialize", "--attempt", self.claim["attempt"]["id"]]
        argv += ["--home", str(self.home), "--url", self.proxy.url, "--token", self.claim["token"]]
        return await asyncio.to_thread(CliRunner().invoke, cli, argv, catch_exceptions=False)

    def left_in_the_worker(self) -> list[str]:
        """Everything under the worker's directory but its (empty) home."""
        found = sorted(str(p.relative_to(self.worker)) for p in self.worker.rglob("*"))
        return [path for path in found if path != "home"]


@pytest.fixture
async def scene(market, live_server, tmp_path) -> Any:
    base = f"/v1/spaces/{market.space.id}"
    await market.publish(tar_gz(tmp_path / "s.tar.gz", SKILL_ONLY), SKILLS)
    await market.call("PUT", f"{base}/plugins/{SKILLS}", market.owner, json={"version": "0.1"})
    await market.call("POST", f"{base}/projects", market.owner, json={"name": "main"}, expect=201)
    body = {"name": "scribe", "instructions": "", "plugins": [SKILLS]}
    await market.call("POST", f"{base}/agents", market.owner, json=body, expect=201)
    claim = await market.claim_new(base, "write", "scribe")
    worker = tmp_path / "worker"
    worker.mkdir()
    with serving(Hostile(upstream=live_server)) as proxy, serving(Hostile()) as elsewhere:
        yield Scene(market, proxy, elsewhere, claim, worker, tmp_path / "outside")


def _pin(listing: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """The listing with its one pin changed (a value of ``...`` removes the field)."""
    (pin,) = listing["pins"]
    changed = {**pin, **changes}
    return {**listing, "pins": [{k: v for k, v in changed.items() if v is not ...}]}


#: Past the largest listing a worker reads (1 MiB): before, any size was
#: read into memory, and what it padded taken for a listing.
HUGE = 2 * 1024 * 1024

#: How the proxy rewrites the listing, given the scene, and a word of the error.
ATTACKS: dict[str, tuple[Callable[[Scene, dict[str, Any]], Any], str]] = {
    "a name climbing out": (lambda s, got: _pin(got, name="../../outside"), "not a plugin name"),
    "an absolute name": (lambda s, got: _pin(got, name=str(s.outside)), "not a plugin name"),
    "a name with a slash": (lambda s, got: _pin(got, name="notes/x"), "not a plugin name"),
    "a name of dots": (lambda s, got: _pin(got, name=".."), "not a plugin name"),
    "a name too long": (lambda s, got: _pin(got, name="n" * 65), "not a plugin name"),
    "a name of another case": (lambda s, got: _pin(got, name="Notes"), "not a plugin name"),
    "a name with a NUL": (lambda s, got: _pin(got, name="no\x00tes"), "not a plugin name"),
    "a name that is a number": (lambda s, got: _pin(got, name=7), "not a plugin name"),
    "no name": (lambda s, got: _pin(got, name=...), "not a plugin name"),
    "one name twice": (lambda s, got: {**got, "pins": got["pins"] * 2}, "pins notes twice"),
    "a version with a newline": (
        lambda s, got: _pin(got, version="0.1\nevil 1 " + "0" * 64),
        "not a normalised PEP 440 version",
    ),
    "a version not normalised": (lambda s, got: _pin(got, version="0.01"), "not a normalised"),
    "a version that is a number": (lambda s, got: _pin(got, version=0.1), "is not a version"),
    "a version too long": (lambda s, got: _pin(got, version="1." + "0" * 200), "is not a version"),
    "an upper-case digest": (
        lambda s, got: _pin(got, sha256=got["pins"][0]["sha256"].upper()),
        "not 64 lowercase hex",
    ),
    "a short digest": (lambda s, got: _pin(got, sha256=got["pins"][0]["sha256"][:63]), "not 64"),
    "no digest": (lambda s, got: _pin(got, sha256=...), "not 64 lowercase hex"),
    "a package on another host": (
        lambda s, got: _pin(got, package_url=s.elsewhere.url + got["pins"][0]["package_url"]),
        "not on the server this client talks to",
    ),
    "a package on another scheme": (
        lambda s, got: _pin(
            got, package_url=s.proxy.url.replace("http:", "https:") + got["pins"][0]["package_url"]
        ),
        "not on the server this client talks to",
    ),
    "a package url that is not a URL": (
        lambda s, got: _pin(got, package_url="http://[::1/x"),
        "not a URL",
    ),
    "a package url that is a list": (lambda s, got: _pin(got, package_url=["/x"]), "not a URL"),
    "a listing that is a list": (lambda s, got: [got], "not a JSON object"),
    "a listing that is not JSON": (lambda s, got: b"<html>pins</html>", "not a JSON object"),
    "a listing nested too deeply": (lambda s, got: b"[" * 100_000 + b"]" * 100_000, "JSON object"),
    "a listing of 2 MiB": (lambda s, got: {**got, "x": "x" * HUGE}, "larger than 1048576 bytes"),
    "pins that are text": (lambda s, got: {**got, "pins": "notes"}, "not a list of at most 50"),
    "pins that are numbers": (lambda s, got: {**got, "pins": [1, 2]}, "not a JSON object"),
    "too many pins": (
        lambda s, got: {**got, "pins": [{**got["pins"][0], "name": f"p{i}"} for i in range(51)]},
        "not a list of at most 50",
    ),
    "limits that are text": (lambda s, got: {**got, "limits": "none"}, "limits are not"),
    "a limit that is text": (
        lambda s, got: {**got, "limits": {**got["limits"], "max_entries": "9999999"}},
        "max_entries '9999999' is not a non-negative integer",
    ),
    "a negative limit": (
        lambda s, got: {**got, "limits": {**got["limits"], "max_total_bytes": -1}},
        "max_total_bytes -1 is not",
    ),
    "a limit that is a boolean": (
        lambda s, got: {**got, "limits": {**got["limits"], "max_ratio": True}},
        "max_ratio True is not",
    ),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
async def test_a_tampered_listing_fails_the_run_before_anything_is_fetched(scene, attack):
    """Each field the worker reads, varied: a clear refusal, nothing written
    outside staging, the run token nowhere else, the attempt failed.
    (Mutations: drop a check of ``_pin``/``_pins``/``_stricter_limits`` and
    its cases write files outside the home, fetch from the other host, or
    end in a traceback; drop the size bound of ``read_listing`` and the
    2 MiB listing is read and materialized.)"""
    tamper, said = ATTACKS[attack]
    scene.proxy.rewrite = lambda listing: tamper(scene, listing)
    result = await scene.materialize_command()

    assert result.exit_code == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: materialization failed: ") and said in line, line
    assert "Traceback" not in result.output
    assert scene.left_in_the_worker() == []
    assert not scene.outside.exists()
    assert scene.elsewhere.seen == []
    packages = [path for _, path, _ in scene.proxy.seen if f"/packages/{SKILLS}" in path]
    assert packages == []  # refused before any download
    (row,) = await scene.market.rows(attempts)
    assert row["state"] == "failed" and said in row["end_reason"]
    (failure,) = await scene.market.rows(materialization_failures)
    assert (failure["attempt_id"], failure["reason"]) == (row["public_id"], "listing")


def _gzip_tar(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return gzip.compress(out.getvalue(), 9)


#: 3 MiB of zeros in a release (the worker's own limit is 1 MiB), and
#: bytes past any archive within the worker's limits.
BOMB = _gzip_tar(
    {
        "buildmax-plugin.toml": SKILL_ONLY["buildmax-plugin.toml"].encode(),
        "skills/note/SKILL.md": b"\0" * (3 * 1024 * 1024),
    }
)
OVERSIZED = b"\x1f\x8b" + b"\0" * (2 * 1024 * 1024)


@pytest.mark.parametrize(
    "served, said, reason",
    [
        (BOMB, "more than 1048576 bytes when extracted", "package"),
        (OVERSIZED, "the server sent more than the", "download"),
    ],
    ids=["an expansion bomb", "a download past any archive"],
)
async def test_limits_a_server_lifts_are_the_workers_own_still(
    scene, monkeypatch, served, said, reason
):
    """The server advertises limits a thousand times the worker's and serves
    a package, with its digest, that only they would admit: the worker's own
    limits refuse it (mutation: let the server's limits replace the
    worker's, as before, and the bomb is extracted)."""
    monkeypatch.setattr("buildmax_marketplace.materialize.DEFAULT_LIMITS", SMALL)
    lifted = {"max_entries": 10**9, "max_total_bytes": 10**12, "max_ratio": 10**9}
    scene.proxy.served["/hostile/package"] = served
    scene.proxy.rewrite = lambda listing: {
        **_pin(listing, sha256=hashlib.sha256(served).hexdigest(), package_url="/hostile/package"),
        "limits": lifted,
    }
    result = await scene.materialize_command()

    assert result.exit_code == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: materialization failed: notes 0.1") and said in line, line
    assert scene.left_in_the_worker() == []
    (row,) = await scene.market.rows(attempts)
    assert row["state"] == "failed" and said in row["end_reason"]
    (failure,) = await scene.market.rows(materialization_failures)
    assert failure["reason"] == reason


async def test_the_run_token_never_reaches_another_host(scene):
    """Before, an absolute ``package_url`` to another host was fetched with
    ``Authorization: Bearer <run token>``: the other host sees nothing now,
    through the Python API too (mutation: drop the origin check of the
    client and materialize's, and the other host receives the token)."""
    scene.elsewhere.served["/steal"] = BOMB
    scene.proxy.rewrite = lambda listing: _pin(listing, package_url=scene.elsewhere.url + "/steal")

    def run() -> None:
        with Client(scene.proxy.url, scene.claim["token"], retries=0) as client:
            materialize(client, scene.claim["attempt"]["id"], scene.home, SMALL)

    with pytest.raises(MaterializationFailed, match="not on the server this client talks to"):
        await asyncio.to_thread(run)
    assert scene.elsewhere.seen == []
    assert set(scene.proxy.tokens_seen()) == {f"Bearer {scene.claim['token']}"}
    assert scene.left_in_the_worker() == []


@pytest.mark.parametrize(
    "tamper",
    [
        lambda listing: [listing],
        lambda listing: {**listing, "pins": "x", "space_id": ["../.."], "generation": "1"},
        lambda listing: {**listing, "x": "x" * HUGE},
    ],
    ids=["a list", "a space that is not an id", "a listing of 2 MiB"],
)
async def test_a_listing_tampered_with_every_time_ends_in_words_not_a_traceback(scene, tamper):
    """When the listing read again to mark the attempt failed is hostile too,
    the command cannot mark it, and says so (mutation: read ``space_id`` and
    ``generation`` unchecked, as before, and this is a traceback)."""
    scene.proxy.rewrite, scene.proxy.every = tamper, True
    result = await scene.materialize_command()

    assert result.exit_code == 1 and "Traceback" not in result.output
    warning, error = result.stderr.splitlines()
    assert warning.startswith("warning: could not mark the attempt failed: the server's listing")
    assert error.startswith("error: materialization failed: the server's")
    # The failure is reported on the attempt the worker was given; nothing
    # is posted to a path built from the hostile listing.
    attempt = scene.claim["attempt"]["id"]
    posted = [path for method, path, _ in scene.proxy.seen if method == "POST"]
    assert posted == [f"/v1/attempts/{attempt}/materialization-failures"]
    assert scene.left_in_the_worker() == []
