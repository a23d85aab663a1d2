"""A BuildMax server as a child process, for tests of what only a real
process shows (signals, workers, the command line)."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..config import Config


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _wait_until_listening(host: str, port: int, within: float = 15) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            _reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        await writer.wait_closed()
        return
    raise TimeoutError(f"nothing listens on {host}:{port}")


@dataclass
class ServerProcess:
    """A ``buildmax serve`` child process."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        """Everything the server printed so far."""
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int:
        """SIGTERM, then wait; the exit code."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)


def start_server(
    settings: Config, log_path: Path, *, extra_env: dict[str, str] | None = None
) -> ServerProcess:
    """Start ``buildmax serve`` on a free port with ``settings``; wait for ``/readyz``."""
    import httpx

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUILDMAX_")}
    env.update(extra_env or {})
    args = [
        sys.executable,
        "-m",
        "buildmax",
        "serve",
        "--port",
        str(port),
        "--data-dir",
        settings.data_dir,
    ]
    if settings.database_url:
        args += ["--database-url", settings.database_url]
    log_file = open(log_path, "wb")  # noqa: SIM115 - handed to the child
    process = subprocess.Popen(args, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    log_file.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    server = ServerProcess(url, process, log_path)
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}:\n{server.log()}")
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    server.stop()
    raise TimeoutError(f"server did not become ready:\n{server.log()}")
