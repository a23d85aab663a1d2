"""Run schemathesis against a real server: the `schema` tox env.

Starts ``buildmax serve`` on a fresh SQLite data directory, seeds it as the
admin it bootstraps (tests/contract/world.py: a space, project, tasks, an
attempt, an artifact, a review, a catalog release...), runs schemathesis
with tests/contract/schemathesis.toml against ``/v1/openapi.json``, and
fails unless:

- schemathesis found no failure (no 5xx, every answer as documented);
- the server logged no unhandled error;
- the admin's token still works afterwards (the run kept its credentials);
- at least ``--min-share`` of the operations called reached a 2xx at least
  once: a run where everything is refused (401, 404) proves nothing.

Prints the share, and the operations that never reached a 2xx.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
from world import World, seed

HERE = Path(__file__).resolve().parent
#: Why 0.7: with every path parameter naming a seeded record, a run reaches
#: a 2xx on about 80% of the operations (71 of 89); what cannot is refused by
#: design in the seeded state (claiming a task another attempt holds, an
#: attempt's generation schemathesis does not guess, a random archive, a
#: sign-in with a random password). A run whose token or seeding broke
#: lands far below (all-401: 0%; without the seeded ids about 35%).
MIN_SHARE = 0.7
#: Operations that would end the run's credentials: signing out, revoking or
#: rotating a token, changing (disabling) the run's own principal. (The
#: other principal and token routes name seeded records, never the admin.)
EXCLUDED = (
    "DELETE /v1/sessions/current",
    "DELETE /v1/tokens/{token_id}",
    "POST /v1/tokens/{token_id}/rotate",
    "PATCH /v1/principals/me",
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(data_dir: Path, log_path: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    """``buildmax serve`` on a fresh data directory; its URL and the token of
    the admin it bootstrapped."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BUILDMAX_")}
    log = open(log_path, "wb")  # noqa: SIM115 - handed to the child
    command = ["-m", "buildmax", "serve", "--data-dir", str(data_dir), "--port", str(port)]
    process = subprocess.Popen(
        [sys.executable, *command],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited:\n{log_path.read_text()}")
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                token = re.search(r"bmx_[A-Za-z0-9_-]+", log_path.read_text())
                if token is None:
                    raise RuntimeError("the server printed no admin token")
                return process, url, token.group(0)
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.terminate()
    raise TimeoutError(f"the server did not become ready:\n{log_path.read_text()}")


async def seed_over_http(url: str, token: str) -> World:
    """:func:`world.seed` through HTTP."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def http(
            method: str,
            path: str,
            *,
            token: str,
            json: Any = None,
            params: dict[str, str] | None = None,
            content: bytes | None = None,
            headers: dict[str, str] | None = None,
        ) -> tuple[int, Any]:
            sent = {"Authorization": f"Bearer {token}", **(headers or {})}
            answer = await client.request(
                method, path, json=json, params=params, content=content, headers=sent
            )
            try:
                return answer.status_code, answer.json()
            except ValueError:
                return answer.status_code, None

        return await seed(http, token)


def share_of_2xx(statuses_path: Path) -> tuple[float, list[str], int]:
    """The share of called operations that got a 2xx at least once, those
    that never did, and how many answers were 5xx."""
    seen: dict[str, set[int]] = defaultdict(set)
    server_errors = 0
    if statuses_path.exists():
        for line in statuses_path.read_text().splitlines():
            method, path, sent, status = json.loads(line)
            server_errors += status >= 500
            if sent == method:
                seen[f"{method} {path}"].add(status)
    never = sorted(op for op, codes in seen.items() if not any(200 <= c < 300 for c in codes))
    share = 1 - len(never) / len(seen) if seen else 0.0
    return share, never, server_errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-share", type=float, default=MIN_SHARE)
    args, extra = parser.parse_known_args()
    work = Path(tempfile.mkdtemp(prefix="buildmax-schema-"))
    log_path, statuses = work / "server.log", work / "statuses.jsonl"
    process, url, token = start_server(work / "data", log_path)
    problems: list[str] = []
    try:
        world = asyncio.run(seed_over_http(url, token))
        env = {
            **os.environ,
            "BUILDMAX_SCHEMA_TOKEN": token,
            "BUILDMAX_SCHEMA_HOOKS": str(HERE / "schemathesis_hooks.py"),
            "BUILDMAX_SCHEMA_STATUSES": str(statuses),
            **{f"BUILDMAX_SCHEMA_{k.upper()}": v for k, v in world.path_parameters().items()},
        }
        command = [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "--config-file",
            str(HERE / "schemathesis.toml"),
            "run",
            f"{url}/v1/openapi.json",
            "--report",
            "json",
            "--report-dir",
            str(work / "report"),
            "--no-color",
            *(f"--exclude-name={name}" for name in EXCLUDED),
            *extra,
        ]
        # In the scratch directory: schemathesis keeps a cache where it runs.
        ran = subprocess.run(command, env=env, cwd=work, check=False)
        if ran.returncode != 0:
            problems.append(f"schemathesis exited with {ran.returncode} (failures above)")
        me = httpx.get(f"{url}/v1/principals/me", headers={"Authorization": f"Bearer {token}"})
        if me.status_code != 200:
            problems.append(f"the run lost its credentials: /v1/principals/me is {me.status_code}")
    finally:
        process.terminate()
        process.wait(timeout=30)
    share, never, server_errors = share_of_2xx(statuses)
    print(f"\noperations that reached a 2xx: {share:.0%} (floor {args.min_share:.0%})")
    for operation in never:
        print(f"  never a 2xx: {operation}")
    if server_errors:
        problems.append(f"{server_errors} answers were 5xx")
    if share < args.min_share:
        problems.append(f"only {share:.0%} of the operations reached a 2xx")
    if "unhandled error" in log_path.read_text(errors="replace"):
        problems.append(f"the server logged unhandled errors: see {log_path}")
    for problem in problems:
        print(f"FAILED: {problem}")
    print(f"server log and report: {work}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
