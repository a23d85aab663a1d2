"""The `schema` tox env installs every distribution the server ships."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.engine_independent

ROOT = Path(__file__).resolve().parents[2]


def _editable(lines: list[str]) -> set[str]:
    """The local paths of ``-e`` lines, extras dropped."""
    found = set()
    for line in lines:
        match = re.match(r"^-e\s+(\S+?)(\[[^\]]*\])?$", line.strip())
        if match:
            found.add(match.group(1).rstrip("/").removeprefix("./") or ".")
    return found


def test_the_schema_env_installs_every_local_distribution():
    """Catches a plugin added to requirements.txt but not to the schema env:
    its routes would be missing from the document schemathesis tests."""
    shipped = _editable((ROOT / "requirements.txt").read_text().splitlines())
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    installed = _editable(tox["testenv:schema"]["deps"].splitlines())
    assert shipped and installed == shipped
