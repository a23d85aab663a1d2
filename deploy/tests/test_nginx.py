"""The nginx example (deploy/nginx/) is a configuration Debian's nginx
accepts, and holds what the server needs from a proxy."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from pathlib import Path

from buildmax_artifacts.settings import ArtifactSettings
from buildmax_marketplace.settings import MarketplaceSettings
from hypercorn.config import Config as HypercornConfig

from buildmax.config import Config

NGINX = Path(__file__).resolve().parents[1] / "nginx"
UNITS = {"k": 2**10, "m": 2**20, "g": 2**30}


def _check(nginx: str, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [nginx, "-t", "-p", str(config.parent), "-c", str(config)],
        capture_output=True,
        text=True,
        check=False,
    )


def _seconds(value: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(ms|s|m|h)?", value).groups()  # type: ignore[union-attr]
    return int(number) * {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600}[unit]


def _directive(text: str, name: str) -> list[str]:
    return re.findall(rf"^\s*{name}\s+([^;]+);", text, re.MULTILINE)


def _location(text: str, match: str) -> str:
    found = re.search(rf"location {re.escape(match)} \{{(.*?)\n\}}", text, re.DOTALL)
    assert found, f"no `location {match}` block"
    return found.group(1)


def test_nginx_accepts_the_example(
    tmp_path: Path, nginx_config: Callable[..., Path], nginx_binary: str
) -> None:
    checked = _check(nginx_binary, nginx_config(tmp_path, [8420, 8421], 18080, 18443))
    assert checked.returncode == 0, checked.stderr
    assert "test is successful" in checked.stderr


def test_nginx_refuses_a_mistake_in_the_example(
    tmp_path: Path, nginx_config: Callable[..., Path], nginx_binary: str
) -> None:
    config = nginx_config(tmp_path, [8420], 18080, 18443)
    site = config.parent / "site.conf"
    # The snippet is included by path: break a copy of it.
    snippet = NGINX / "buildmax-locations.conf"
    broken = tmp_path / "broken-locations.conf"
    broken.write_text(snippet.read_text().replace("proxy_buffering off;", "proxy_buffering of;"))
    site.write_text(site.read_text().replace(str(snippet), str(broken)))
    checked = _check(nginx_binary, config)
    assert checked.returncode != 0
    assert "proxy_buffering" in checked.stderr


def test_the_example_admits_the_largest_upload_and_streams_events() -> None:
    snippet = (NGINX / "buildmax-locations.conf").read_text()
    size = _directive(snippet, "client_max_body_size")
    assert len(size) == 1
    number, unit = re.fullmatch(r"(\d+)([kmg]?)", size[0].lower()).groups()  # type: ignore[union-attr]
    limit = int(number) * UNITS.get(unit, 1)
    largest = max(
        MarketplaceSettings().max_package_bytes,
        ArtifactSettings().max_bytes,
        Config().max_body_bytes,
    )
    assert limit >= largest
    assert _directive(snippet, "proxy_request_buffering") == ["off"]

    events = _location(snippet, r"~ ^/v1/spaces/[^/]+/events$")
    assert "proxy_buffering off;" in events
    assert _seconds(_directive(events, "proxy_read_timeout")[0]) > Config().events_keepalive_seconds

    # X-Forwarded-For for trusted_proxies, appended to, never taken whole.
    assert "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;" in snippet
    # /metrics is scraped from each server, never through the proxy.
    assert _directive(_location(snippet, "= /metrics"), "return") == ["404"]


def test_nginx_closes_idle_connections_before_the_server_does() -> None:
    for path in (NGINX / "buildmax.conf", NGINX.parent / "compose" / "nginx.conf"):
        upstream = re.search(r"upstream buildmax \{(.*?)\}", path.read_text(), re.DOTALL)
        assert upstream, path
        timeout = _directive(upstream.group(1), "keepalive_timeout")
        assert timeout and _seconds(timeout[0]) < HypercornConfig().keep_alive_timeout, path


def test_both_server_blocks_serve_buildmax() -> None:
    site = (NGINX / "buildmax.conf").read_text()
    blocks = re.findall(r"^server \{(.*?)^\}", site, re.MULTILINE | re.DOTALL)
    assert len(blocks) == 2
    tls, plain = blocks
    assert "ssl_certificate " in tls and "ssl" in _directive(tls, "listen")[0]
    assert all("ssl" not in listen for listen in _directive(plain, "listen"))
    for block in blocks:
        assert _directive(block, "include") == ["/etc/nginx/snippets/buildmax-locations.conf"]
