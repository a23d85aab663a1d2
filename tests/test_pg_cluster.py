"""Which PostgreSQL server the ``pg`` env tests on (``buildmax.testing.postgres``).

The configured ``BUILDMAX_TEST_DATABASE_URL`` when anything answers there;
otherwise a throwaway cluster when PostgreSQL's server binaries are
installed; otherwise one line saying why the run cannot happen.
"""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

import pytest

from buildmax.testing import PgCluster, PgUnavailable, choose_pg_server
from buildmax.testing import postgres as testing

pytestmark = pytest.mark.engine_independent

URL = "postgresql://postgres@127.0.0.1:5999/test"
BINDIR = Path("/opt/pg/bin")


def probes(monkeypatch, *, problem, bindir):
    """Replace the two probes; record which ran."""
    ran = []

    def probe(url, timeout=testing.PG_PROBE_TIMEOUT):
        ran.append(("probe", url))
        return problem

    def find():
        ran.append(("find", None))
        return bindir

    monkeypatch.setattr(testing, "probe_pg_server", probe)
    monkeypatch.setattr(testing, "find_pg_bindir", find)
    return ran


def test_a_server_that_answers_is_used_and_no_binaries_are_looked_for(monkeypatch):
    ran = probes(monkeypatch, problem=None, bindir=BINDIR)
    choice = choose_pg_server(URL)
    assert choice.url == URL
    assert choice.bindir is None
    assert ran == [("probe", URL)]


def test_no_answer_with_binaries_installed_means_a_throwaway_cluster(monkeypatch):
    probes(monkeypatch, problem="connection refused", bindir=BINDIR)
    choice = choose_pg_server(URL)
    assert choice.bindir == BINDIR
    assert URL in choice.reason
    assert "connection refused" in choice.reason


def test_no_answer_and_no_binaries_is_one_line_naming_the_url_and_both_reasons(monkeypatch):
    probes(monkeypatch, problem="connection refused", bindir=None)
    with pytest.raises(PgUnavailable) as caught:
        choose_pg_server(URL)
    message = str(caught.value)
    assert "\n" not in message
    assert f"BUILDMAX_TEST_DATABASE_URL={URL}" in message
    assert "nothing answers there (connection refused)" in message
    assert "no PostgreSQL server binaries were found" in message
    assert "throwaway cluster" in message


def test_the_one_line_error_does_not_print_the_password(monkeypatch):
    probes(monkeypatch, problem="connection refused", bindir=None)
    with pytest.raises(PgUnavailable) as caught:
        choose_pg_server("postgresql://postgres:s3cret@db.example:5432/test")
    assert "s3cret" not in str(caught.value)
    assert "postgresql://postgres:***@db.example:5432/test" in str(caught.value)


def fake_bindir(directory: Path) -> Path:
    directory.mkdir(parents=True)
    for name in ("initdb", "pg_ctl", "postgres"):
        path = directory / name
        path.write_text("#!/bin/sh\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return directory


def test_binaries_are_the_newest_install_when_pg_config_points_at_client_tools_only(
    monkeypatch, tmp_path
):
    # libpq-dev's pg_config says /usr/bin, which has no server binaries.
    client_only = tmp_path / "usr-bin"
    client_only.mkdir()
    pg_config = tmp_path / "pg_config"
    pg_config.write_text(f"#!/bin/sh\necho {client_only}\n")
    pg_config.chmod(0o755)
    fake_bindir(tmp_path / "lib" / "9.6" / "bin")
    newest = fake_bindir(tmp_path / "lib" / "15" / "bin")
    fake_bindir(tmp_path / "lib" / "13" / "bin")
    monkeypatch.setattr(testing.shutil, "which", lambda name: str(pg_config))
    monkeypatch.setattr(testing, "_PG_BIN_GLOB", str(tmp_path / "lib" / "*" / "bin"))
    assert testing.find_pg_bindir() == newest


def test_binaries_come_from_pg_config_when_it_names_a_server_install(monkeypatch, tmp_path):
    server = fake_bindir(tmp_path / "server")
    pg_config = tmp_path / "pg_config"
    pg_config.write_text(f"#!/bin/sh\necho {server}\n")
    pg_config.chmod(0o755)
    monkeypatch.setattr(testing.shutil, "which", lambda name: str(pg_config))
    monkeypatch.setattr(testing, "_PG_BIN_GLOB", str(tmp_path / "none" / "*" / "bin"))
    assert testing.find_pg_bindir() == server


def test_no_binaries_anywhere_is_none(monkeypatch, tmp_path):
    monkeypatch.setattr(testing.shutil, "which", lambda name: None)
    monkeypatch.setattr(testing, "_PG_BIN_GLOB", str(tmp_path / "none" / "*" / "bin"))
    assert testing.find_pg_bindir() is None


def test_a_closed_port_does_not_answer():
    port = testing.free_port()
    assert testing.probe_pg_server(f"postgresql://postgres@127.0.0.1:{port}/test") == (
        "connection refused"
    )


def test_a_throwaway_cluster_starts_answers_and_leaves_nothing_behind():
    bindir = testing.find_pg_bindir()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries installed (pg_config, /usr/lib/postgresql)")
    cluster = PgCluster.start(bindir, dbname="test")
    try:
        assert cluster.datadir.is_dir()
        assert cluster.url == f"postgresql://postgres@127.0.0.1:{cluster.port}/test"
        if os.geteuid() == 0:
            assert cluster.run_as == "postgres"

        async def query() -> tuple[int, str]:
            import asyncpg

            conn = await asyncpg.connect(cluster.url.replace("postgresql://", "postgres://", 1))
            try:
                return await conn.fetchval("SELECT 1"), await conn.fetchval("SHOW fsync")
            finally:
                await conn.close()

        assert asyncio.run(query()) == (1, "off")
        assert testing.probe_pg_server(cluster.url) is None
    finally:
        cluster.stop()
    assert not cluster.root.exists()
    assert testing.probe_pg_server(cluster.url) == "connection refused"
    cluster.stop()  # idempotent
