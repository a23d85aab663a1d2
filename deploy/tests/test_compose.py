"""The compose file (deploy/compose/) is one Compose reads (Debian's
docker-compose 1.29, without an engine), and its pieces fit together."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from buildmax.config import Config, load_config

COMPOSE = Path(__file__).resolve().parents[1] / "compose"
SERVERS = ("buildmax-1", "buildmax-2")


def _compose(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose is not installed (Debian's docker-compose)"
    return subprocess.run(
        [
            binary,
            "--project-directory",
            str(directory),
            "-f",
            str(directory / "compose.yaml"),
            "--env-file",
            str(directory / ".env"),
            *args,
        ],
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of deploy/compose/ with its example.env filled in as .env."""
    copy = tmp_path / "compose"
    shutil.copytree(COMPOSE, copy)
    # compose.yaml mounts ../nginx/buildmax-locations.conf and builds ../..
    shutil.copytree(COMPOSE.parent / "nginx", tmp_path / "nginx")
    filled = re.sub(r"=$", "=not-a-real-password", (copy / "example.env").read_text(), flags=re.M)
    (copy / ".env").write_text(filled)
    return copy


@pytest.fixture
def resolved(project: Path) -> dict[str, Any]:
    """The file as Compose reads it (anchors merged, variables filled)."""
    done = _compose(project, "config")
    assert done.returncode == 0, done.stderr
    return dict(yaml.safe_load(done.stdout))


def test_compose_reads_the_file(resolved: dict[str, Any]) -> None:
    assert set(resolved["services"]) == {
        "postgres",
        "minio",
        "bucket",
        "migrate",
        *SERVERS,
        "nginx",
        "backup",
    }


@pytest.mark.parametrize(
    ("mistake", "said"),
    [
        (("    stop_grace_period: 40s", "    stop_grace_periods: 40s"), "stop_grace_periods"),
        (
            ("condition: service_completed_successfully", "condition: service_done"),
            "service_done",
        ),
        (("  buildmax-2: *server", "  buildmax-2: *servers"), "servers"),
    ],
)
def test_compose_refuses_a_mistake(project: Path, mistake: tuple[str, str], said: str) -> None:
    path = project / "compose.yaml"
    text = path.read_text()
    assert mistake[0] in text
    path.write_text(text.replace(mistake[0], mistake[1], 1))
    done = _compose(project, "config", "-q")
    assert done.returncode != 0
    assert said in done.stderr


def test_compose_refuses_to_start_without_the_passwords(project: Path) -> None:
    (project / ".env").write_text("")
    done = _compose(project, "config", "-q")
    assert done.returncode != 0
    assert "set POSTGRES_PASSWORD in .env" in done.stderr


def _runs(args: list[str]) -> None:
    """``buildmax ARGS --help`` exits 0: the command exists as written."""
    done = subprocess.run(
        [sys.executable, "-m", "buildmax", *args, "--help"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_the_servers_wait_for_the_migration_and_run_real_commands(
    resolved: dict[str, Any],
) -> None:
    services = resolved["services"]
    assert services["migrate"]["command"] == ["db", "migrate"]
    _runs(services["migrate"]["command"])
    for name in SERVERS:
        server = services[name]
        assert server["command"] == ["serve"]
        assert server["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert server["depends_on"]["bucket"]["condition"] == "service_completed_successfully"
        assert "ports" not in server  # reached through nginx only
    backup = " ".join(services["backup"]["command"])
    assert "buildmax backup create --keep 7" in backup
    _runs(["backup", "create"])


def test_settings_agree_across_the_files(
    resolved: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(Config.__dataclass_fields__):
        monkeypatch.delenv(f"BUILDMAX_{name.upper()}", raising=False)
    settings = load_config(COMPOSE / "buildmax.toml")
    services = resolved["services"]
    nginx_address = services["nginx"]["networks"]["buildmax"]["ipv4_address"]
    assert settings.trusted_proxies == nginx_address
    # A stopping server gets to finish its drain before it is killed.
    grace = services[SERVERS[0]]["stop_grace_period"]
    assert int(grace.removesuffix("s")) > settings.shutdown_grace_seconds + 5
    # Blobs go to the bucket the bucket service makes.
    bucket = re.fullmatch(r"s3://([^/]+)/.*", settings.blob_store_url)
    assert bucket
    assert f"store/{bucket.group(1)}" in " ".join(services["bucket"]["command"])
    assert settings.plugins["s3"]["endpoint_url"] == "http://minio:9000"
    # nginx passes to exactly the servers, with the shared locations.
    upstream = re.findall(r"server (\S+):8420 resolve;", (COMPOSE / "nginx.conf").read_text())
    assert sorted(upstream) == sorted(SERVERS)
    mounts = services["nginx"]["volumes"]
    assert any(
        m.split(":")[0].endswith("/nginx/buildmax-locations.conf")
        and ":/etc/nginx/snippets/buildmax-locations.conf:" in m
        for m in mounts
    ), mounts
    # Every BUILDMAX_ variable the containers get is a setting (or names
    # the configuration file).
    for service in services.values():
        for variable in service.get("environment", {}):
            if variable.startswith("BUILDMAX_") and variable != "BUILDMAX_CONFIG":
                assert variable.removeprefix("BUILDMAX_").lower() in Config.__dataclass_fields__


def test_nginx_accepts_the_compose_configuration(
    tmp_path: Path, shipped_text: Callable[[str, str, str], str], nginx_binary: str
) -> None:
    site = (COMPOSE / "nginx.conf").read_text()
    # Debian's nginx (1.22) predates `resolve` in an upstream, and Compose's
    # DNS is not here: loopback servers in their place.
    site = shipped_text(site, "server buildmax-1:8420 resolve;", "server 127.0.0.1:8420;")
    site = shipped_text(site, "server buildmax-2:8420 resolve;", "server 127.0.0.1:8421;")
    site = shipped_text(site, "resolver 127.0.0.11 valid=5s ipv6=off;", "")
    site = shipped_text(site, "listen 80;", "listen 127.0.0.1:18080;")
    site = shipped_text(
        site,
        "/etc/nginx/snippets/buildmax-locations.conf",
        str(COMPOSE.parent / "nginx" / "buildmax-locations.conf"),
    )
    (tmp_path / "site.conf").write_text(site)
    main = tmp_path / "nginx.conf"
    main.write_text(
        f"pid {tmp_path / 'nginx.pid'};\nerror_log {tmp_path / 'error.log'};\nevents {{}}\n"
        f"http {{ include {tmp_path / 'site.conf'}; }}\n"
    )
    done = subprocess.run(
        [nginx_binary, "-t", "-p", str(tmp_path), "-c", str(main)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_backups_go_to_a_volume_the_server_user_owns(resolved: dict[str, Any]) -> None:
    backup = resolved["services"]["backup"]
    target = backup["environment"]["BUILDMAX_BACKUP_DIR"]
    assert any(m.startswith("backups:") and m.split(":")[1] == target for m in backup["volumes"])
    # A new named volume takes the ownership of the image's folder: the
    # image makes it, owned by the server's user.
    dockerfile = (COMPOSE.parents[1] / "Dockerfile").read_text()
    assert re.search(
        rf"install -d -m 0700 -o buildmax -g buildmax {re.escape(target)}\b", dockerfile
    )
    assert backup["healthcheck"] == {"test": ["NONE"]}  # Compose's form of `disable: true`
    assert int(backup["stop_grace_period"].removesuffix("m")) >= 5
