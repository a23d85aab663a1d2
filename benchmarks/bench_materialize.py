"""Materializing a run against a real ``buildmax serve`` (SQLite, file store):
20 pinned releases of 1 MiB each, downloaded with the run token, verified
and extracted by ``buildmax_marketplace.materialize``.

    python benchmarks/bench_materialize.py [--releases 20] [--size-mib 1] [--rounds 5] [--json]

Setup (not timed): publish the releases (each a skill holding incompressible
bytes), activate them in a space, define an agent naming all of them and
claim a task of that agent. Timed: ``materialize`` into a fresh home, once
per round, with a fresh claim each round (target: under 3 s, issue 7 item 4).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import httpx
from bench_read import BenchError, create_space, progress, start_buildmax
from buildmax_marketplace.materialize import materialize

from buildmax.client import Client

MIB = 2**20


def release_archive(name: str, size: int) -> bytes:
    """A skill-only release whose skill carries ``size`` random bytes."""
    files = {
        "buildmax-plugin.toml": (
            f'name = "{name}"\nversion = "1.0"\n[contributes]\nskills = ["s"]\n'
        ).encode(),
        "skills/s/SKILL.md": b"Use the data.\n",
        "skills/s/data.bin": os.urandom(size),
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", compresslevel=1) as archive:
        for path, data in files.items():
            info = tarfile.TarInfo(path)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return out.getvalue()


def check(response: httpx.Response, status: int) -> dict:
    if response.status_code != status:
        raise BenchError(f"{response.request.method} {response.request.url}: {response.text[:300]}")
    return response.json()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", type=int, default=20)
    parser.add_argument("--size-mib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    size = int(args.size_mib * MIB)
    with tempfile.TemporaryDirectory(prefix="bench-materialize-") as scratch:
        workdir = Path(scratch)
        server, admin = start_buildmax(workdir)
        try:
            space = create_space(server, admin)
            auth = {"Authorization": f"Bearer {admin}"}
            with httpx.Client(base_url=server.url, headers=auth, timeout=120) as http:
                names = [f"bench-{n:02d}" for n in range(args.releases)]
                progress(f"publishing {len(names)} releases of {args.size_mib} MiB")
                for name in names:
                    check(
                        http.post(
                            f"/v1/catalog/{name}/releases",
                            content=release_archive(name, size),
                            headers={"Content-Type": "application/octet-stream"},
                        ),
                        201,
                    )
                    check(
                        http.put(f"/v1/spaces/{space}/plugins/{name}", json={"version": "1.0"}), 201
                    )
                base = f"/v1/spaces/{space}"
                check(http.post(f"{base}/projects", json={"name": "bench"}), 201)
                body = {"name": "runner", "instructions": "", "plugins": names}
                check(http.post(f"{base}/agents", json=body), 201)
                timings = []
                for round_ in range(args.rounds):
                    task = check(
                        http.post(
                            f"{base}/tasks",
                            json={"project": "bench", "title": f"run {round_}", "agent": "runner"},
                        ),
                        201,
                    )
                    claim = check(http.post(f"{base}/tasks/{task['id']}/claim", json={}), 201)
                    home = workdir / f"home-{round_}"
                    with Client(server.url, claim["token"], retries=0) as client:
                        started = time.perf_counter()
                        placed = materialize(client, claim["attempt"]["id"], home)
                        timings.append(time.perf_counter() - started)
                    if len(placed.pins) != len(names):
                        raise BenchError(f"materialized {len(placed.pins)} of {len(names)} pins")
                    progress(f"round {round_ + 1}: {timings[-1]:.3f} s")
        finally:
            server.stop()
    result = {
        "releases": args.releases,
        "size_mib": args.size_mib,
        "rounds": args.rounds,
        "seconds_median": round(statistics.median(timings), 3),
        "seconds_max": round(max(timings), 3),
        "mib_per_second": round(args.releases * args.size_mib / statistics.median(timings), 1),
        "target_seconds": 3.0,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"materialize {args.releases} x {args.size_mib} MiB: "
            f"median {result['seconds_median']} s, max {result['seconds_max']} s "
            f"({result['mib_per_second']} MiB/s; target < 3 s)"
        )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
