"""``buildmax qualify`` checks that every plugin and grader the journeys to
run need is installed before it runs any, and otherwise exits saying, in
one line, what to install."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from buildmax_graders.commands import unmet_needs
from buildmax_graders.journey import Needs, Requirement

pytestmark = pytest.mark.engine_independent

QUALIFY = (sys.executable, "-m", "buildmax", "qualify")

CHECKS = "".join(
    f'[[check]]\nstep = "{kind}"\ngrader = "absent"\nkind = "log_pattern"\npattern = "x"\n'
    for kind in ("response", "durable", "audit", "forbidden")
)
FAULTS = '[[requires]]\ndistribution = "buildmax-nowhere-faults"\ninstall = "./nowhere/faults"\n'
GRADER = '[[requires]]\ndistribution = "buildmax-nowhere-grader"\ninstall = "./nowhere/grader"\n'
FANCY = '[[check]]\nstep = "response"\ngrader = "fancy"\nof = "x"\n'


def journey(tmp_path: Path, journey_id: str, text: str) -> None:
    directory = tmp_path / "journeys"
    directory.mkdir(exist_ok=True)
    (directory / f"{journey_id}.toml").write_text(
        f'id = "{journey_id}"\ntitle = "t"\n' + text + CHECKS
    )


def qualify(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*QUALIFY, "--journeys", "journeys", "--output", "out", "--engine", "sqlite", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_missing_plugins_are_named_in_one_line_before_any_journey_runs(tmp_path: Path) -> None:
    journey(tmp_path, "J90", "")
    journey(tmp_path, "J91", GRADER + FANCY)
    journey(tmp_path, "J92", FAULTS + GRADER)
    done = qualify(tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        "qualification needs plugins that are not installed: "
        "buildmax-nowhere-grader (pip install ./nowhere/grader), "
        "buildmax-nowhere-faults (pip install ./nowhere/faults); run from the repository root"
    ]
    assert done.stdout == ""
    assert not (tmp_path / "out").exists()  # no journey ran, J90 neither


def test_a_grader_no_plugin_offers_is_named_when_nothing_is_declared(tmp_path: Path) -> None:
    journey(tmp_path, "J90", "")
    journey(tmp_path, "J93", FANCY)
    done = qualify(tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.splitlines() == [
        "qualification needs graders no installed plugin offers: 'fancy' (J93) "
        "(a journey names the distribution offering a grader under [[requires]])"
    ]
    assert not (tmp_path / "out").exists()


def test_only_the_journeys_that_will_run_count(tmp_path: Path) -> None:
    """Not selected, not applicable to the engine, not built: their needs
    stop nothing (a file that does not load fails on every engine, so its
    needs count). ``--list`` lists whatever is installed."""
    journey(tmp_path, "J91", FAULTS)
    journey(tmp_path, "J92", 'engines = ["postgres"]\n' + FAULTS)
    journey(tmp_path, "J93", 'status = "not built"\nreason = "later"\n' + GRADER)
    listed = qualify(tmp_path, "--list")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0].startswith("J91   written")
    done = qualify(tmp_path, "--journey", "J92", "--journey", "J93")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 not applicable, 1 not built" in done.stdout
    refused = qualify(tmp_path)
    assert refused.returncode == 2 and "buildmax-nowhere-faults" in refused.stderr
    assert "nowhere-grader" not in refused.stderr
    journey(tmp_path, "J94", 'engines = ["postgres"]\n' + GRADER + FANCY)
    unloadable = qualify(tmp_path, "--journey", "J94")
    assert unloadable.returncode == 2 and "buildmax-nowhere-grader" in unloadable.stderr


def test_installed_distributions_and_offered_graders_need_nothing() -> None:
    faults = Requirement("buildmax-faults", "./qualification/faults")
    needs = [("J01", Needs((faults,), ("status", "fancy")))]
    assert unmet_needs(needs, {"status", "fancy"}, lambda name: True) is None
    assert unmet_needs(needs, {"status", "fancy"}, lambda name: False) == (
        "qualification needs plugins that are not installed: "
        "buildmax-faults (pip install ./qualification/faults); run from the repository root"
    )
    # Installed, yet its grader is not offered (the plugin failed to load).
    assert unmet_needs(needs, {"status"}, lambda name: True) == (
        "qualification needs graders no installed plugin offers: 'fancy' (J01) "
        "(a journey names the distribution offering a grader under [[requires]])"
    )


def test_a_requirement_installed_from_an_index_is_not_run_from_the_root() -> None:
    needs = [
        ("J01", Needs((Requirement("buildmax-x", "buildmax-x>=1"),))),
        ("J02", Needs((Requirement("buildmax-x", "buildmax-x>=1"),), ("fancy",))),
        ("J03", Needs((), ("fancy", "status"))),
        ("J04", Needs((), ("fancy",))),
    ]
    assert unmet_needs(needs, {"status"}, lambda name: False) == (
        "qualification needs plugins that are not installed: buildmax-x (pip install "
        "buildmax-x>=1); qualification needs graders no installed plugin offers: "
        "'fancy' (J03, J04) (a journey names the distribution offering a grader under "
        "[[requires]])"
    )
