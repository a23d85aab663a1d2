"""Test helpers: a local S3-compatible server (moto's server mode) on
loopback, started once per test session, and a bucket per test.

Import the fixtures into a ``conftest.py``::

    from buildmax_s3.testing import s3_bucket, s3_server  # noqa: F401

Needs the ``test`` extra (``pip install buildmax-s3[test]``).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from buildmax.testing import free_port

#: The environment of a client of the local server (it checks no credentials).
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "buildmax-test",
    "AWS_SECRET_ACCESS_KEY": "buildmax-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    # No cloud metadata service on a test machine: do not wait for one.
    "AWS_EC2_METADATA_DISABLED": "true",
}


@dataclass
class S3Server:
    """A running local S3 server."""

    endpoint_url: str

    def client(self) -> Any:
        """A synchronous boto3 client, to look inside buckets."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """moto's S3 server on a free loopback port, for the whole session.

    A server that does not come up fails the tests that need it; they never
    skip."""
    # Its log (a line per request) goes to a file: a pipe nobody reads fills
    # up after some thousand requests, and the server then stops answering.
    log = tempfile.TemporaryFile()  # noqa: SIM115 - open for the whole session
    process, port = _start(log)
    try:
        yield S3Server(f"http://127.0.0.1:{port}")
    finally:
        _stop(process)
        log.close()


#: Ports tried: another process may take a free port before moto binds it.
ATTEMPTS = 5


def _start(log: Any) -> tuple[subprocess.Popen[bytes], int]:
    """moto listening on a port of its own, and the port. The port is free
    when chosen, not when moto binds it: a server of another test process
    can take it meanwhile, so moto must be the one that answers there."""
    for _ in range(ATTEMPTS):
        port = free_port()
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
        if _answers(process, port):
            return process, port
        _stop(process)
    log.seek(0)
    raise RuntimeError(
        f"the local S3 server did not come up on any of {ATTEMPTS} ports: "
        f"{log.read().decode(errors='replace')[-2000:]}"
    )


def _answers(process: subprocess.Popen[bytes], port: int) -> bool:
    """Whether moto itself (its own API, on a process still running)
    answers on ``port`` within 30 s."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{port}/moto-api/data.json", timeout=2
            ) as answer:
                return answer.status == 200 and process.poll() is None
        except urllib.error.HTTPError:
            return False  # another server answers there
        except OSError:
            time.sleep(0.05)
    return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@dataclass
class S3Bucket:
    """A bucket of its own for one test."""

    server: S3Server
    name: str

    @property
    def url(self) -> str:
        """The ``blob_store_url`` of a store rooted at ``blobs/`` in it."""
        return f"s3://{self.name}/blobs"

    @property
    def settings(self) -> dict[str, Any]:
        """The ``[plugins.s3]`` table for it."""
        return {"endpoint_url": self.server.endpoint_url, "addressing_style": "path"}

    def stored(self) -> list[str]:
        """Every object in the bucket and every unfinished multipart upload."""
        client = self.server.client()
        found = [
            item["Key"]
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.name)
            for item in page.get("Contents", [])
        ]
        uploads = client.list_multipart_uploads(Bucket=self.name).get("Uploads", [])
        return sorted(found + [f"(unfinished) {u['Key']}" for u in uploads])


@pytest.fixture
def s3_bucket(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Bucket:
    """A fresh bucket, with the environment holding the test credentials."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    bucket = S3Bucket(s3_server, f"buildmax-{uuid.uuid4().hex[:12]}")
    s3_server.client().create_bucket(Bucket=bucket.name)
    return bucket


__all__ = ["CREDENTIALS", "S3Bucket", "S3Server", "s3_bucket", "s3_server"]
