"""The documentation keeps up with the code.

Every hook of the plugin contract has a section in ``docs/plugin_hooks.md``
and is named in at least one test; every setting and its default are in
``docs/configuration.md``; every problem slug and every kernel route are in
``docs/api.md``. (Datasette's ``tests/test_docs.py`` does the same for its
hooks.) The checks are pure functions, so a test can prove they fail.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import buildmax_hookspecs
import pytest
from buildmax_hookspecs import PROJECT_NAME, hookspec

from buildmax import problems
from buildmax.app import create_app
from buildmax.config import ENV_PREFIX, Config

pytestmark = pytest.mark.engine_independent

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
THIS_FILE = Path(__file__).resolve()

#: The attribute pluggy's ``HookspecMarker`` sets on every hookspec function.
SPEC_MARKER = f"{PROJECT_NAME}_spec"

#: What pytest collects as test code, plus the fixtures beside it.
TEST_FILE_PATTERNS = ("test_*.py", "*_test.py", "conftest.py")

#: Settings ``load_config`` never reads from a ``BUILDMAX_*`` variable.
NOT_FROM_ENVIRONMENT = {"plugins"}


def declared_hooks(modules: Iterable[types.ModuleType]) -> list[str]:
    """Names of the hookspecs in ``modules``, in declaration order.

    A hook is a function named ``buildmax_*`` that carries pluggy's spec
    marker; a helper that merely shares the prefix is not one.
    """
    return [
        name
        for module in modules
        for name, value in vars(module).items()
        if name.startswith("buildmax_")
        and inspect.isfunction(value)
        and hasattr(value, SPEC_MARKER)
    ]


def undocumented_hooks(hook_names: Iterable[str], doc_text: str) -> list[str]:
    """The hooks that have no ``## <name>(`` section heading in ``doc_text``."""
    return [
        name
        for name in hook_names
        if not re.search(rf"^## {re.escape(name)}\(", doc_text, re.MULTILINE)
    ]


def unexercised_hooks(hook_names: Iterable[str], test_sources: Iterable[str]) -> list[str]:
    """The hooks whose name appears, as a whole word, in none of ``test_sources``."""
    sources = list(test_sources)
    return [
        name
        for name in hook_names
        if not any(re.search(rf"\b{re.escape(name)}\b", source) for source in sources)
    ]


def find_test_files(root: Path) -> list[Path]:
    """Test files of the kernel (``tests/``) and of every first-party plugin
    (``plugins/*/tests/``), except this file."""
    folders = [root / "tests", *sorted((root / "plugins").glob("*/tests"))]
    found = {
        path.resolve()
        for folder in folders
        for pattern in TEST_FILE_PATTERNS
        for path in folder.rglob(pattern)
    }
    found.discard(THIS_FILE)
    return sorted(found)


def read_doc(name: str) -> str:
    """The text of ``docs/<name>``."""
    return (DOCS / name).read_text(encoding="utf-8")


def table_row(doc_text: str, first_cell: str) -> str | None:
    """The Markdown table row whose first cell is ``first_cell``, or ``None``."""
    match = re.search(rf"^\|\s*{re.escape(first_cell)}\s*\|.*$", doc_text, re.MULTILINE)
    return match.group(0) if match else None


def documented_default(value: Any) -> str:
    """How ``docs/configuration.md`` writes a setting's default."""
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, int):
        return f"`{value}`"
    if isinstance(value, Mapping):
        return f"`{dict(value)!r}`"
    return f'`"{value}"`'


HOOKS = declared_hooks(buildmax_hookspecs.HOOKSPEC_MODULES)


# -- hooks ------------------------------------------------------------------


def test_every_hook_is_documented() -> None:
    assert "buildmax_startup" in HOOKS, "the hook collector found no hooks"
    assert undocumented_hooks(HOOKS, read_doc("plugin_hooks.md")) == []


def test_every_hook_is_exercised_by_a_test() -> None:
    files = find_test_files(ROOT)
    sources = [path.read_text(encoding="utf-8") for path in files]
    missing = unexercised_hooks(HOOKS, sources)
    assert missing == [], (
        f"no test file under tests/ or plugins/*/tests/ names these hooks: {missing}"
    )


def test_meta_test_catches_an_undocumented_hook() -> None:
    contract = types.ModuleType("made_up_hookspecs")

    @hookspec
    def buildmax_made_up(app: Any) -> None:
        """A hook nobody has documented yet."""

    def buildmax_helper() -> None:
        """Shares the prefix but carries no spec marker: not a hook."""

    contract.buildmax_made_up = buildmax_made_up  # type: ignore[attr-defined]
    contract.buildmax_helper = buildmax_helper  # type: ignore[attr-defined]
    names = declared_hooks([*buildmax_hookspecs.HOOKSPEC_MODULES, contract])
    assert names == [*HOOKS, "buildmax_made_up"]

    doc = read_doc("plugin_hooks.md")
    assert undocumented_hooks(names, doc) == ["buildmax_made_up"]
    assert undocumented_hooks(names, doc + "\n## buildmax_made_up(app)\n\nIt is made up.\n") == []
    # A mention in prose or a lower-level heading is not a section.
    passing_mentions = "See `buildmax_made_up(app)`.\n### buildmax_made_up(app)\n"
    assert undocumented_hooks(["buildmax_made_up"], passing_mentions) == ["buildmax_made_up"]


def test_meta_test_catches_an_unexercised_hook() -> None:
    assert unexercised_hooks(["buildmax_made_up"], ["pm.hook.buildmax_made_up(app=app)"]) == []
    # A longer name that merely starts with the hook's name does not count.
    near_misses = ["def buildmax_made_up_later(): ...", "x = 'buildmax_made_upx'"]
    assert unexercised_hooks(["buildmax_made_up"], near_misses) == ["buildmax_made_up"]
    assert unexercised_hooks(["buildmax_made_up"], []) == ["buildmax_made_up"]


# -- configuration ----------------------------------------------------------


def test_every_config_setting_is_documented() -> None:
    doc = read_doc("configuration.md")
    fields = [field.name for field in dataclasses.fields(Config)]
    assert [name for name in fields if f"`{name}`" not in doc] == []
    env_names = [ENV_PREFIX + name.upper() for name in fields if name not in NOT_FROM_ENVIRONMENT]
    assert [env for env in env_names if f"`{env}`" not in doc] == []


def test_documented_config_defaults_match_the_code() -> None:
    doc = read_doc("configuration.md")
    wrong = {}
    for field in dataclasses.fields(Config):
        default = getattr(Config(), field.name)
        row = table_row(doc, f"`{field.name}`")
        if row is None or documented_default(default) not in row:
            wrong[field.name] = documented_default(default)
    assert wrong == {}, f"settings whose table row lacks the default shown: {wrong}"


# -- API --------------------------------------------------------------------


def problem_classes() -> list[type[problems.Problem]]:
    """``Problem`` and every subclass declared in ``buildmax.problems``."""
    return [
        cls
        for _, cls in inspect.getmembers(problems, inspect.isclass)
        if issubclass(cls, problems.Problem) and cls.__module__ == problems.__name__
    ]


def test_every_problem_slug_is_documented() -> None:
    doc = read_doc("api.md")
    classes = problem_classes()
    assert problems.NotFound in classes
    wrong = {}
    for cls in classes:
        row = table_row(doc, f"`{cls.slug}`")
        if row is None or not re.search(rf"\|\s*{cls.status}\s*\|", row):
            wrong[cls.slug] = cls.status
    assert wrong == {}, f"slugs missing from docs/api.md or with another status: {wrong}"


def test_every_kernel_route_is_documented(tmp_path: Path) -> None:
    app = create_app(Config(data_dir=str(tmp_path), load_plugins=""))
    doc = read_doc("api.md")
    missing = []
    for rule in app.url_map.iter_rules():
        if rule.endpoint == "static":
            continue
        path = re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule.rule)
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            if not re.search(rf"^\| `{method}` \| `{re.escape(path)}` \|", doc, re.MULTILINE):
                missing.append(f"{method} {path}")
    assert missing == []
