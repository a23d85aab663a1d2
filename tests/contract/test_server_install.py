"""requirements-server.txt, the lean install of a server, stays lean: every
line a distribution of this repository, without extras, and no test tool
among what it installs, however deep."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.engine_independent

ROOT = Path(__file__).resolve().parents[2]

#: Distributions only tests, linters and type checkers use. Flask is not one
#: of them (Quart is built on it); flask-cors is (moto's server mode).
TEST_TOOLS = frozenset(
    canonicalize_name(name)
    for name in (
        "pytest",
        "pytest-asyncio",
        "pytest-timeout",
        "hypothesis",
        "moto",
        "boto3",
        "mypy",
        "ruff",
        "import-linter",
        "schemathesis",
        "tox",
        "flask-cors",
    )
)

_LOCAL_LINE = re.compile(r"^(?:-e\s+)?(\.(?:/[\w./-]*)?)(?:\[([\w,\s-]*)\])?$")


def requirement_lines(name: str) -> list[str]:
    """The requirement lines of ``name`` at the root, comments dropped."""
    lines = (line.strip() for line in (ROOT / name).read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def local_paths(lines: list[str]) -> dict[str, frozenset[str]]:
    """Each line's local path and the extras it asks for."""
    found = {}
    for line in lines:
        match = _LOCAL_LINE.match(line)
        assert match, f"not a local path: {line!r}"
        extras = frozenset(e.strip() for e in (match.group(2) or "").split(",") if e.strip())
        found[match.group(1)] = extras
    return found


def project(path: str) -> dict[str, Any]:
    """The ``[project]`` table of the distribution at ``path`` (from the root)."""
    with (ROOT / path / "pyproject.toml").open("rb") as f:
        table: dict[str, Any] = tomllib.load(f)["project"]
    return table


def requires(
    name: str, extras: frozenset[str], local: dict[str, dict[str, Any]]
) -> list[Requirement]:
    """What distribution ``name`` with ``extras`` requires on this platform:
    a local one's from its pyproject.toml, another's from its installed
    metadata (nothing when it is not installed here)."""
    if name in local:
        optional = local[name].get("optional-dependencies", {})
        declared = [
            *local[name].get("dependencies", []),
            *(text for extra in sorted(extras) for text in optional.get(extra, [])),
        ]
    else:
        try:
            declared = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            return []
    wanted = []
    for text in declared:
        requirement = Requirement(text)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": e}) for e in {"", *extras}):
            wanted.append(requirement)
    return wanted


def installed_by(lines: list[str]) -> dict[str, str]:
    """Every distribution the lines install, however deep, each with the
    chain of names that brought it in."""
    paths = local_paths(lines)
    names = {path: canonicalize_name(project(path)["name"]) for path in paths}
    local = {names[path]: project(path) for path in paths}
    reached: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(names[path], extras, names[path]) for path, extras in paths.items()]
    while todo:
        name, extras, chain = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        reached.setdefault(name, chain)
        for requirement in requires(name, extras, local):
            dependency = canonicalize_name(requirement.name)
            todo.append((dependency, frozenset(requirement.extras), f"{chain} -> {dependency}"))
    return reached


def test_every_line_is_a_local_path_without_extras() -> None:
    """A bare name could be answered by an index; an extra pulls in test tools."""
    lines = requirement_lines("requirements-server.txt")
    assert lines
    for line in lines:
        assert re.fullmatch(r"\.(/[\w./-]+)?", line), f"not a plain local path: {line!r}"
        assert (ROOT / line / "pyproject.toml").is_file(), f"no distribution at {line}"


def test_it_installs_the_contract_the_kernel_and_every_first_party_plugin() -> None:
    installed = set(local_paths(requirement_lines("requirements-server.txt")))
    plugins = {f"./plugins/{p.parent.name}" for p in ROOT.glob("plugins/*/pyproject.toml")}
    assert installed == {"./hookspecs", ".", *plugins}


def test_no_test_tool_is_installed_however_deep() -> None:
    reached = installed_by(requirement_lines("requirements-server.txt"))
    assert {"quart", "flask", "aiobotocore", "jsonschema"} <= set(reached)  # it walks deep
    assert [chain for name, chain in reached.items() if name in TEST_TOOLS] == []


def test_the_developer_install_brings_the_test_tools() -> None:
    """The check above can fail: requirements.txt's extras reach the tools."""
    reached = installed_by(requirement_lines("requirements.txt"))
    assert {"pytest", "moto", "mypy", "ruff", "hypothesis", "flask-cors"} <= set(reached)
    assert reached["moto"].startswith("buildmax-s3 -> moto")


def test_every_package_of_a_distribution_is_in_what_it_builds() -> None:
    """A non-editable install (the server's) holds only the packages a
    pyproject.toml lists; the editable developer install finds every one,
    so a package left out breaks only a server."""
    left_out = []
    for path in local_paths(requirement_lines("requirements-server.txt")):
        with (ROOT / path / "pyproject.toml").open("rb") as f:
            packages = tomllib.load(f)["tool"]["setuptools"].get("packages")
        if not isinstance(packages, list):
            continue  # found by setuptools itself
        for top in (p for p in packages if "." not in p):
            for init in sorted((ROOT / path / top).rglob("__init__.py")):
                package = ".".join(init.parent.relative_to(ROOT / path).parts)
                if package not in packages:
                    left_out.append(f"{path}/pyproject.toml: {package}")
    assert left_out == []
