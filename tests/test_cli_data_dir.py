"""Commands never create a database they were asked to read.

Run from a directory with no data directory (or pointed at one that does
not exist), every command that reads the database refuses with one line
naming where it looked and ``--data-dir``, and leaves the directory as it
was. ``audit verify`` on a database with no audit event says so and fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from buildmax.cli import _register_commands, cli

pytestmark = pytest.mark.engine_independent

READERS = [
    ["db", "status"],
    ["audit", "verify"],
    ["audit", "verify", "--space", "system"],
    ["audit", "export", "--output", "trail.jsonl"],
    ["audit", "sweep"],
    ["artifacts", "gc"],
    ["artifacts", "gc", "--dry-run"],
    ["backup", "create"],
    ["backup", "create", "--output", "backups", "--keep", "2"],
]


@pytest.fixture
def empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory, and no BuildMax setting from outside."""
    for name in list(os.environ):
        if name.startswith("BUILDMAX_"):
            monkeypatch.delenv(name)
    where = tmp_path / "cwd"
    where.mkdir()
    monkeypatch.chdir(where)
    _register_commands()
    return where


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def everything_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize("command", READERS, ids=" ".join)
def test_a_reading_command_creates_nothing_and_names_data_dir(
    empty: Path, command: list[str]
) -> None:
    code, output = invoke(*command)

    assert code == 1, output
    assert f"no BuildMax database in {empty / 'buildmax-data'}" in output
    assert "--data-dir" in output
    assert "Traceback" not in output
    assert everything_under(empty) == []


@pytest.mark.parametrize("command", READERS, ids=" ".join)
def test_a_data_dir_that_does_not_exist_is_not_created(empty: Path, command: list[str]) -> None:
    missing = empty / "no" / "such" / "place"

    code, output = invoke(*command, "--data-dir", str(missing))

    assert code == 1, output
    assert f"no BuildMax database in {missing}" in output
    assert everything_under(empty) == []


def test_audit_verify_of_a_database_with_no_event_fails_saying_so(empty: Path) -> None:
    code, output = invoke("db", "migrate")
    assert code == 0, output

    code, output = invoke("audit", "verify")

    assert code == 1, output
    assert "holds no audit event: nothing was verified" in output
    assert "chain(s) verify" not in output


def test_db_migrate_creates_the_database_it_is_asked_to(empty: Path) -> None:
    code, output = invoke("db", "migrate", "--data-dir", "data")

    assert code == 0, output
    assert (empty / "data" / "buildmax.db").is_file()
    code, output = invoke("db", "status", "--data-dir", "data")
    assert code == 0, output
    assert "pending" not in output


def test_an_empty_database_file_is_refused_and_left_as_it_is(empty: Path) -> None:
    data = empty / "buildmax-data"
    data.mkdir()
    (data / "buildmax.db").touch()

    code, output = invoke("audit", "verify")

    assert code == 1, output
    assert f"no BuildMax database in {data}" in output
    assert everything_under(empty) == ["buildmax-data", "buildmax-data/buildmax.db"]
    assert (data / "buildmax.db").stat().st_size == 0


def test_a_database_url_is_named_when_it_chose_the_file(empty: Path) -> None:
    code, output = invoke("db", "status", "--database-url", f"sqlite:///{empty}/other.db")

    assert code == 1, output
    assert f"no BuildMax database in {empty} (looked for other.db)" in output
    assert "--database-url" in output
    assert everything_under(empty) == []


def test_a_database_path_that_is_a_directory_is_refused_and_left_empty(empty: Path) -> None:
    (empty / "buildmax-data" / "buildmax.db").mkdir(parents=True)

    code, output = invoke("db", "status")

    assert code == 1, output
    assert "no BuildMax database in" in output
    assert everything_under(empty) == ["buildmax-data", "buildmax-data/buildmax.db"]
