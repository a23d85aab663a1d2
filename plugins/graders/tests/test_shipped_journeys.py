"""The journeys this repository ships: all of J01-J21 are there, every
written one loads, and each declares what the product description asks of
it. Deleting a journey, or marking a red one "not built", fails here."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from buildmax_graders.builtin import BUILTIN_GRADERS
from buildmax_graders.commands import installed_graders
from buildmax_graders.journey import NOT_BUILT, WRITTEN, Journey, Requirement, discover
from buildmax_graders.qualify import load_journeys

pytestmark = pytest.mark.engine_independent

ROOT = Path(__file__).parents[3]
EXAMPLE_GRADER = ROOT / "examples" / "grader-plugin" / "buildmax_example_grader" / "__init__.py"


def graders() -> dict[str, Any]:
    """The installed graders, and the example plugin's (the qualify env installs it)."""
    spec = importlib.util.spec_from_file_location("example_grader_for_tests", EXAMPLE_GRADER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {**installed_graders(), **module.buildmax_graders()}


@pytest.fixture(scope="module")
def journeys() -> dict[str, Journey]:
    loaded = load_journeys(discover(ROOT / "qualification" / "journeys"), graders())
    unreadable = [j for j in loaded if isinstance(j, tuple)]
    assert not unreadable, unreadable
    return {j.id: j for j in loaded if isinstance(j, Journey)}


def test_every_critical_journey_is_there(journeys: dict[str, Journey]) -> None:
    assert sorted(journeys) == [f"J{n:02d}" for n in range(1, 22)]
    assert [j for j, journey in journeys.items() if journey.status == NOT_BUILT] == []


def test_engines_are_declared_as_the_product_asks(journeys: dict[str, Journey]) -> None:
    assert journeys["J18"].engines == ("postgres",)
    assert journeys["J18"].server.processes == 2
    for journey in journeys.values():
        if journey.id != "J18":
            assert journey.engines == ("sqlite", "postgres"), journey.id


def test_j01_starts_on_an_empty_database_and_migrates_postgresql_first(
    journeys: dict[str, Journey],
) -> None:
    j01 = journeys["J01"]
    assert not j01.server.start and j01.server.database == "empty"
    first, second = j01.steps[:2]
    assert first.kind == "cli" and first.spec["argv"] == ["db", "migrate"]
    assert first.applies_to("postgres") and not first.applies_to("sqlite")
    assert second.kind == "start_server"


def test_process_level_journeys_kill_and_restart_real_servers(
    journeys: dict[str, Journey],
) -> None:
    kinds = [s.kind for s in journeys["J16"].steps]
    assert "start_server" in kinds
    assert any(s.spec.get("kill_after") for s in journeys["J16"].steps)


def test_faults_and_the_example_grader_are_used(journeys: dict[str, Journey]) -> None:
    steps = [s for j in journeys.values() for s in j.steps]
    assert any(s.kind == "drop_answer" for s in steps)
    assert any(s.kind == "fault" and s.spec["fault"] == "blob-put-after-store" for s in steps)
    assert journeys["J08"].server.blob_faults
    assert any(c.grader_name == "problem_details" for c in journeys["J02"].checks)


def test_j19_agents_act_only_through_the_mcp_sdk(journeys: dict[str, Journey]) -> None:
    """Every step of J19's agents is a tool call through the SDK's client;
    together they make the whole loop, and the viewer tries to claim."""
    agents = {"author", "reviewer", "integrator", "viewer"}
    acting = [s for s in journeys["J19"].steps if s.spec.get("as") in agents]
    assert acting and {s.kind for s in acting} == {"mcp"}
    calls = {(s.spec["as"], s.spec["tool"]) for s in acting}
    assert {
        ("viewer", "claim_next"),
        ("author", "claim_next"),
        ("author", "submit"),
        ("author", "claim_task"),
        ("author", "claim_review"),
        ("reviewer", "claim_review"),
        ("reviewer", "record_review"),
        ("integrator", "claim_integration"),
        ("integrator", "submit"),
    } <= calls


def test_j21_lessons_travel_with_submissions_and_are_searched(
    journeys: dict[str, Journey],
) -> None:
    """J21's lessons half: an agent's submission carries lessons (one
    common), the next claims are read for the lessons they offer, the
    lessons are searched by words and by a phrase, corrected, superseded,
    and named from another space."""
    steps = journeys["J21"].steps
    carried = [
        lesson
        for s in steps
        if s.kind == "request" and str(s.spec["path"]).endswith("/submit")
        for lesson in s.spec["json"].get("extensions", {}).get("lessons", [])
    ]
    assert any(lesson.get("common") for lesson in carried)
    assert any(not lesson.get("common") for lesson in carried)
    claims = [s for s in steps if str(s.spec.get("path", "")).endswith("/claim")]
    assert len(claims) >= 3
    queries = [str(s.spec.get("params", {}).get("q", "")) for s in steps]
    assert any(q and '"' not in q for q in queries) and any(q.startswith('"') for q in queries)
    paths = [str(s.spec.get("path", "")) for s in steps]
    assert any(p.endswith("/revisions") for p in paths)
    assert any(p.endswith("/supersede") for p in paths)
    assert any(s.spec.get("as") == "outsider" for s in steps)


def test_written_journeys_run_the_examples(journeys: dict[str, Journey]) -> None:
    calls = {str(s.spec.get("call")) for j in journeys.values() for s in j.steps}
    assert "market:agent_loop" in calls and "review:reviewer_loop" in calls
    assert all(j.status == WRITTEN for j in journeys.values())


def plugin_modules(requirement: Requirement) -> list[ModuleType]:
    """The ``buildmax`` entry point modules of a required distribution of
    this repository, loaded from its directory (whether installed or not)."""
    directory = ROOT / requirement.install
    with (directory / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)["project"]
    assert project["name"] == requirement.distribution
    modules = []
    for name, target in project["entry-points"]["buildmax"].items():
        module_path = directory.joinpath(*target.partition(":")[0].split("."))
        init = module_path / "__init__.py"
        spec = importlib.util.spec_from_file_location(
            f"required_{name.replace('-', '_')}", init if init.exists() else f"{module_path}.py"
        )
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        modules.append(module)
    return modules


def test_what_a_journey_needs_beyond_the_server_it_declares(
    journeys: dict[str, Journey], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every grader a journey names is built in or offered by a plugin of
    this repository it requires; a journey whose blobs go through the fault
    plugin's store, or that arms a fault, requires the plugin offering that
    store. ``buildmax qualify`` names what is missing from these."""
    monkeypatch.setenv("BUILDMAX_QUALIFICATION", "1")  # the fault plugin loads only then
    for journey in journeys.values():
        offered: dict[str, set[str]] = {"graders": set(BUILTIN_GRADERS), "blob_stores": set()}
        for requirement in journey.requires:
            assert requirement.install.startswith("./"), requirement
            for module in plugin_modules(requirement):
                for hook in offered:
                    if hasattr(module, f"buildmax_{hook}"):
                        offered[hook] |= set(getattr(module, f"buildmax_{hook}")())
        named = {c.grader_name for c in journey.checks}
        assert named <= offered["graders"], (journey.id, named - offered["graders"])
        if journey.server.blob_faults or any(s.kind == "fault" for s in journey.steps):
            assert "faulty+file" in offered["blob_stores"], journey.id
    assert [r.distribution for r in journeys["J02"].requires] == ["buildmax-example-grader"]
    assert [r.distribution for r in journeys["J08"].requires] == ["buildmax-qualification-faults"]
