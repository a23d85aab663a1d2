"""What the deployment tests share: the local S3 server of the artifact
tests, and the shipped nginx example made runnable on this machine."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from buildmax_s3.testing import s3_server  # noqa: F401

DEPLOY = Path(__file__).resolve().parents[1]

#: nginx's access log in the tests: what the rehearsal's checks read.
LOG_FORMAT = (
    "log_format rehearsal '$msec $request_method $uri $status "
    '"$upstream_addr" "$upstream_status" "$http_idempotency_key"\';'
)


def replaced(text: str, old: str, new: str) -> str:
    """``text`` with ``old`` (which must be there) replaced: a change to a
    shipped file that a test no longer follows fails that test."""
    assert old in text, f"{old!r} is no longer in the shipped file"
    return text.replace(old, new)


def write_nginx_config(root: Path, upstream: list[int], http_port: int, https_port: int) -> Path:
    """deploy/nginx/buildmax.conf under ``root/nginx/`` with the servers on
    ``upstream`` ports, its two server blocks on loopback ports, a throwaway
    certificate and the tests' logs; the main configuration file to start
    nginx with (``nginx -p root/nginx -c <it>``)."""
    home = root / "nginx"
    home.mkdir()
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-keyout",
            str(home / "key.pem"),
            "-out",
            str(home / "cert.pem"),
        ],
        check=True,
        capture_output=True,
    )
    site = (DEPLOY / "nginx" / "buildmax.conf").read_text()
    servers = "".join(f"server 127.0.0.1:{port};\n    " for port in upstream)
    site = replaced(site, "server 127.0.0.1:8420;\n    ", servers)
    site = replaced(site, "listen 443 ssl http2;", f"listen 127.0.0.1:{https_port} ssl http2;")
    site = replaced(site, "listen [::]:443 ssl http2;", "")
    site = replaced(site, "listen 127.0.0.1:8080;", f"listen 127.0.0.1:{http_port};")
    site = replaced(site, "listen [::1]:8080;", "")
    live = "/etc/letsencrypt/live/buildmax.example.org/"
    site = replaced(site, live + "fullchain.pem", str(home / "cert.pem"))
    site = replaced(site, live + "privkey.pem", str(home / "key.pem"))
    site = replaced(
        site,
        "/etc/nginx/snippets/buildmax-locations.conf",
        str(DEPLOY / "nginx" / "buildmax-locations.conf"),
    )
    (home / "site.conf").write_text(site)
    temp = " ".join(
        f"{kind}_temp_path {home / kind};"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    user = "user root;\n" if os.geteuid() == 0 else ""
    main = (
        f"{user}worker_processes 1;\npid {home / 'nginx.pid'};\n"
        f"error_log {home / 'error.log'} info;\nevents {{}}\n"
        f"http {{\n  {LOG_FORMAT}\n  access_log {home / 'access.log'} rehearsal;\n"
        f"  {temp}\n  include {home / 'site.conf'};\n}}\n"
    )
    (home / "nginx.conf").write_text(main)
    return home / "nginx.conf"


@pytest.fixture
def nginx_binary() -> str:
    """Debian's nginx (``nginx-light``); missing, the test fails (never skips)."""
    found = shutil.which("nginx") or "/usr/sbin/nginx"
    assert Path(found).exists(), "nginx is not installed (Debian's nginx-light)"
    return found


@pytest.fixture
def nginx_config() -> Callable[[Path, list[int], int, int], Path]:
    """:func:`write_nginx_config`."""
    return write_nginx_config


@pytest.fixture
def shipped_text() -> Callable[[str, str, str], str]:
    """:func:`replaced`."""
    return replaced
