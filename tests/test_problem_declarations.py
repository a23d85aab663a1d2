"""Every problem is declared once: each slug by one class, in the kernel's or
a plugin's ``problems`` module, and the client's exception classes take
their slug, status and title from those declarations (``answers=``)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from collections import defaultdict
from types import ModuleType

import pytest

import buildmax
from buildmax import client, problems
from buildmax.client import BuildMaxError, Client

pytestmark = pytest.mark.engine_independent

#: The first-party packages whose problems the API answers with.
PACKAGES = [
    "buildmax",
    "buildmax_tasks",
    "buildmax_reviews",
    "buildmax_artifacts",
    "buildmax_marketplace",
    "buildmax_audit",
    "buildmax_graders",
    "buildmax_s3",
]
#: The plugins with a typed client: (its problems module, its client module).
CLIENTS = [
    ("buildmax_tasks.problems", "buildmax_tasks.client"),
    ("buildmax_reviews.problems", "buildmax_reviews.client"),
    ("buildmax_artifacts.problems", "buildmax_artifacts.client"),
]


def _modules(package: str) -> list[ModuleType]:
    root = importlib.import_module(package)
    found = [root]
    for info in pkgutil.walk_packages(root.__path__, f"{package}."):
        if info.name.rsplit(".", 1)[-1] != "__main__":
            found.append(importlib.import_module(info.name))
    return found


def _declared_here(module: ModuleType, base: type) -> list[type]:
    return [
        kind
        for kind in vars(module).values()
        if inspect.isclass(kind) and issubclass(kind, base) and kind.__module__ == module.__name__
    ]


PROBLEMS = sorted(
    {
        kind
        for package in PACKAGES
        for module in _modules(package)
        for kind in _declared_here(module, problems.Problem)
        if not kind.__name__.startswith("_") and kind is not problems.Problem
    },
    key=lambda kind: (kind.__module__, kind.__name__),
)


def test_every_problem_is_declared_in_a_problems_module() -> None:
    assert len(PROBLEMS) > 40, "the scan found too few problems"
    outside = [
        f"{kind.__module__}.{kind.__name__}"
        for kind in PROBLEMS
        if not kind.__module__.endswith(".problems")
    ]
    assert outside == []


def test_one_slug_one_class_and_one_name_one_slug() -> None:
    by_slug: defaultdict[str, list[str]] = defaultdict(list)
    by_name: defaultdict[str, set[str]] = defaultdict(set)
    for kind in PROBLEMS:
        by_slug[kind.slug].append(f"{kind.__module__}.{kind.__name__}")
        by_name[kind.__name__].add(kind.slug)
    assert {slug: where for slug, where in by_slug.items() if len(where) > 1} == {}
    assert {name: slugs for name, slugs in by_name.items() if len(slugs) > 1} == {}


def test_bytes_gone_from_the_store_have_one_name_for_artifacts_and_packages() -> None:
    gone = [kind for kind in PROBLEMS if kind.status == 410]
    assert {kind.slug for kind in gone} == {"blob-missing", "blob-corrupted"}


@pytest.mark.parametrize(("problems_module", "client_module"), CLIENTS)
def test_a_plugin_client_has_a_class_for_every_problem_of_the_plugin(
    problems_module: str, client_module: str
) -> None:
    declared = _declared_here(importlib.import_module(problems_module), problems.Problem)
    module = importlib.import_module(client_module)
    assert {kind.answers for kind in module.ERRORS} == set(declared)
    # Every exception class the module declares is one it registers.
    assert set(_declared_here(module, BuildMaxError)) <= set(module.ERRORS) | {
        kind for kind in _declared_here(module, BuildMaxError) if kind.answers is None
    }


def test_the_kernel_client_registers_every_class_it_declares_for_a_problem() -> None:
    answering = {kind for kind in _declared_here(client, BuildMaxError) if kind.answers is not None}
    assert answering == set(client.KERNEL_ERRORS)
    assert all(kind.answers.__module__ == "buildmax.problems" for kind in answering)  # type: ignore[union-attr]
    with Client(url="http://127.0.0.1:9", token="t") as bare:
        for kind in answering:
            assert bare.errors.error_class(kind.answers.status, kind.answers.slug) is kind  # type: ignore[union-attr]


def test_the_scan_sees_the_whole_kernel() -> None:
    assert buildmax.problems.BlobMissing in PROBLEMS
