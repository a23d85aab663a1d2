"""Artifact uploads against a real ``buildmax serve`` (SQLite, file store):
server memory under 10 concurrent 16 MiB uploads, and upload/download
throughput next to a plain file copy on the same disk.

    python benchmarks/bench_artifacts.py [--concurrent 10] [--rounds 5] [--json] [--keep]

Memory: the server's VmRSS is sampled every 20 ms while ``--concurrent``
clients each send 16 MiB as fast as they can (httpx, one request each, with
``Content-Length``); the growth over the idle baseline is reported (target:
< 64 MiB, issue 5 item 2). Throughput: sequential uploads and downloads of
1 MiB and 16 MiB artifacts (fresh random bytes each, so nothing is
deduplicated), against ``shutil.copyfile`` + ``fsync`` of the same bytes to a
new file in the same directory with a warm page cache (target: ratio >= 0.5,
item 6). Uploads are also timed from a plain blocking socket (one connection
per request, no HTTP library): the gap to httpx is the client's share; and
from that socket to ``bare_upload.py`` (Hypercorn and uvloop, hashing and
fsyncing each body, nothing else): the stack's own ceiling.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from bench_read import (
    HOST,
    BenchError,
    RssSampler,
    clean_env,
    create_space,
    free_port,
    proc_status,
    progress,
    run_in_scratch,
    spawn,
    start_buildmax,
    wait_ready,
)

MIB = 2**20


def _copy_rate(directory: Path, size: int, rounds: int) -> float:
    """MiB/s of copying ``size`` bytes to a new file and fsyncing it."""
    source = directory / f"source-{size}"
    source.write_bytes(os.urandom(size))
    source.read_bytes()  # warm page cache
    started = time.perf_counter()
    for n in range(rounds):
        target = directory / f"copy-{size}-{n}"
        shutil.copyfile(source, target)
        with open(target, "rb+") as fh:
            os.fsync(fh.fileno())
    return size * rounds / MIB / (time.perf_counter() - started)


async def _uploads(
    url: str, token: str, space: str, size: int, rounds: int
) -> tuple[float, list[str]]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"}
    made = []
    async with httpx.AsyncClient(timeout=120) as client:
        payloads = [os.urandom(size) for _ in range(rounds)]
        started = time.perf_counter()
        for n, data in enumerate(payloads):
            answer = await client.post(
                f"{url}/v1/spaces/{space}/artifacts",
                content=data,
                headers=headers,
                params={"name": f"a{size}-{n}"},
            )
            if answer.status_code != 201:
                raise BenchError(f"upload answered {answer.status_code}: {answer.text[:300]}")
            made.append(answer.json()["url"])
        elapsed = time.perf_counter() - started
    return size * rounds / MIB / elapsed, made


def _raw_uploads(url: str, token: str, space: str, size: int, rounds: int) -> float:
    """MiB/s of the uploads sent from a blocking socket, to tell client from server cost."""
    host, port = url.removeprefix("http://").split(":")
    payloads = [os.urandom(size) for _ in range(rounds)]
    started = time.perf_counter()
    for n, data in enumerate(payloads):
        head = (
            f"POST /v1/spaces/{space}/artifacts?name=r{size}-{n} HTTP/1.1\r\nHost: {host}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: application/octet-stream\r\n"
            f"Content-Length: {size}\r\nConnection: close\r\n\r\n"
        )
        with socket.create_connection((host, int(port))) as conn:
            conn.sendall(head.encode())
            conn.sendall(data)
            answer = b""
            while got := conn.recv(65536):
                answer += got
        if not answer.startswith(b"HTTP/1.1 201"):
            raise BenchError(f"raw upload answered {answer[:300]!r}")
    return size * rounds / MIB / (time.perf_counter() - started)


async def _downloads(url: str, token: str, paths: list[str], size: int) -> float:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(timeout=120) as client:
        started = time.perf_counter()
        for path in paths:
            got = 0
            async with client.stream("GET", url + path, headers=headers) as answer:
                if answer.status_code != 200:
                    raise BenchError(f"download answered {answer.status_code}")
                async for chunk in answer.aiter_raw():
                    got += len(chunk)
            if got != size:
                raise BenchError(f"downloaded {got} bytes of {size}")
        return size * len(paths) / MIB / (time.perf_counter() - started)


async def _concurrent(url: str, token: str, space: str, count: int) -> list[int]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/octet-stream"}
    payloads = [os.urandom(16 * MIB) for _ in range(count)]
    async with httpx.AsyncClient(timeout=300) as client:
        answers = await asyncio.gather(
            *(
                client.post(
                    f"{url}/v1/spaces/{space}/artifacts",
                    content=data,
                    headers=headers,
                    params={"name": f"c{n}"},
                )
                for n, data in enumerate(payloads)
            )
        )
    return [a.status_code for a in answers]


def _bare_uploads(workdir: Path, size: int, rounds: int) -> float:
    """MiB/s of raw-socket uploads to ``bare_upload.py``: the stack's ceiling."""
    store = workdir / "bare"
    store.mkdir(exist_ok=True)
    port = free_port()
    script = Path(__file__).with_name("bare_upload.py")
    server = spawn(
        "bare hypercorn",
        [sys.executable, str(script), str(port), str(store)],
        workdir / "bare.log",
        f"http://{HOST}:{port}",
        clean_env(),
    )
    try:
        wait_ready(server, "/livez")
        return _raw_uploads(server.url, "-", "-", size, rounds)
    finally:
        server.stop()


def run(opts: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    server, token = start_buildmax(workdir)
    try:
        space = create_space(server, token)
        asyncio.run(_uploads(server.url, token, space, 1024, 3))  # warm-up
        time.sleep(0.5)
        baseline = proc_status(server.pid)
        progress(f"{opts.concurrent} concurrent 16 MiB uploads")
        with RssSampler(server, interval=0.02):
            statuses = asyncio.run(_concurrent(server.url, token, space, opts.concurrent))
        after = proc_status(server.pid)
        memory = {
            "uploads": opts.concurrent,
            "statuses": sorted(statuses),
            "baseline_rss_mib": round(baseline["VmRSS"] / 1024, 1),
            "peak_sampled_rss_mib": round(max(server.rss_samples_kib) / 1024, 1),
            "growth_mib": round((max(server.rss_samples_kib) - baseline["VmRSS"]) / 1024, 1),
            "vmhwm_before_mib": round(baseline["VmHWM"] / 1024, 1),
            "vmhwm_after_mib": round(after["VmHWM"] / 1024, 1),
        }
        rates: dict[str, Any] = {}
        for size, rounds in ((MIB, opts.rounds * 4), (16 * MIB, opts.rounds)):
            progress(f"throughput: {rounds} x {size // MIB} MiB")
            up, paths = asyncio.run(_uploads(server.url, token, space, size, rounds))
            down = asyncio.run(_downloads(server.url, token, paths, size))
            raw = _raw_uploads(server.url, token, space, size, rounds)
            bare = _bare_uploads(workdir, size, rounds)
            copy = _copy_rate(workdir, size, rounds)
            rates[f"{size // MIB}MiB"] = {
                "rounds": rounds,
                "upload_mib_s": round(up, 1),
                "raw_socket_upload_mib_s": round(raw, 1),
                "download_mib_s": round(down, 1),
                "copy_fsync_mib_s": round(copy, 1),
                "upload_ratio": round(up / copy, 3),
                "raw_socket_upload_ratio": round(raw / copy, 3),
                "bare_hypercorn_upload_mib_s": round(bare, 1),
                "bare_hypercorn_upload_ratio": round(bare / copy, 3),
                "download_ratio": round(down / copy, 3),
            }
        return {"memory": memory, "throughput": rates}
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrent", type=int, default=10, help="concurrent 16 MiB uploads (10)")
    p.add_argument("--rounds", type=int, default=5, help="16 MiB uploads timed (5; 1 MiB: 4x)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--keep", action="store_true", help="keep the temp directory")
    opts = p.parse_args(argv)
    report = run_in_scratch("bench_artifacts", opts.keep, lambda workdir: run(opts, workdir))
    if report is None:
        return 1
    report["machine"] = {"cpus": os.cpu_count(), "loadavg": [round(x, 2) for x in os.getloadavg()]}
    if opts.json:
        print(json.dumps(report, indent=2))
        return 0
    m = report["memory"]
    print(f"memory: {m['uploads']} concurrent 16 MiB uploads, statuses {m['statuses']}")
    print(
        f"  server VmRSS baseline {m['baseline_rss_mib']} MiB, peak sampled "
        f"{m['peak_sampled_rss_mib']} MiB: growth {m['growth_mib']} MiB (target < 64); "
        f"VmHWM {m['vmhwm_before_mib']} -> {m['vmhwm_after_mib']} MiB"
    )
    for label, r in report["throughput"].items():
        print(
            f"throughput {label} x {r['rounds']}: upload {r['upload_mib_s']} MiB/s, download "
            f"{r['download_mib_s']} MiB/s, copy+fsync {r['copy_fsync_mib_s']} MiB/s; ratios "
            f"upload {r['upload_ratio']}, download {r['download_ratio']} (target >= 0.5)"
        )
        print(
            f"  raw-socket client: upload {r['raw_socket_upload_mib_s']} MiB/s, "
            f"ratio {r['raw_socket_upload_ratio']}; bare Hypercorn storing the body "
            f"{r['bare_hypercorn_upload_mib_s']} MiB/s, ratio {r['bare_hypercorn_upload_ratio']}"
        )
    print(f"machine: {report['machine']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
