"""The `schema` tox env installs every distribution the server ships."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine_independent

ROOT = Path(__file__).resolve().parents[2]


def _local_paths(lines: list[str]) -> set[str]:
    """The local paths of requirement lines, editable or not, extras dropped
    (``-e ./plugins/s3[test]`` and ``./plugins/s3`` are both ``plugins/s3``)."""
    found = set()
    for line in lines:
        match = re.match(r"^(?:-e\s+)?(\.{1,2}(?:/\S*?)?)(\[[^\]]*\])?$", line.strip())
        if match:
            found.add(match.group(1).rstrip("/").removeprefix("./") or ".")
    return found


def _requirements(name: str) -> set[str]:
    return _local_paths((ROOT / name).read_text().splitlines())


def test_the_schema_env_installs_every_distribution_the_server_ships():
    """Catches a plugin added to requirements-server.txt but not to the
    schema env: its routes would be missing from the document schemathesis
    tests."""
    shipped = _requirements("requirements-server.txt")
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    installed = _local_paths(tox["testenv:schema"]["deps"].splitlines())
    assert shipped and installed == shipped


def test_the_developer_install_has_the_distributions_the_server_ships():
    """requirements.txt (editable, with test extras: what tox installs) and
    requirements-server.txt name the same local distributions: the tests
    run what a server runs."""
    assert _requirements("requirements.txt") == _requirements("requirements-server.txt")


def test_local_paths_are_read_with_or_without_editable_and_extras():
    lines = ["# a comment", "-e ./hookspecs", "-e .[test]", "./plugins/s3", "schemathesis==4.*"]
    assert _local_paths(lines) == {"hookspecs", ".", "plugins/s3"}
