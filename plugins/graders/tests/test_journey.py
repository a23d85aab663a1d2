"""Journey files are checked when loaded, before any server starts; the
installed graders (built-in and from plugins) are what files may name."""

from __future__ import annotations

from pathlib import Path

import pytest
from buildmax_graders.builtin import BUILTIN_GRADERS
from buildmax_graders.commands import installed_graders
from buildmax_graders.journey import (
    Journey,
    JourneyFileError,
    Needs,
    Requirement,
    load_journey,
    needs,
)
from buildmax_graders.qualify import load_journeys
from buildmax_graders.steps import STEPS, check_step

pytestmark = pytest.mark.engine_independent

DOCS = Path(__file__).parents[3] / "docs" / "qualification.md"

CHECK = '[[check]]\nstep = "response"\ngrader = "status"\nof = "x"\nstatus = 200\n'
OTHERS = "".join(
    f'[[check]]\nstep = "{kind}"\ngrader = "absent"\nkind = "log_pattern"\npattern = "x"\n'
    for kind in ("durable", "audit", "forbidden")
)


def load(tmp_path: Path, text: str) -> Journey:
    path = tmp_path / "J99.toml"
    path.write_text('id = "J99"\ntitle = "t"\n' + text)
    return load_journey(path, BUILTIN_GRADERS, STEPS.__contains__, check_step)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("colour = 1\n" + CHECK, "unknown key(s) colour"),
        ('engines = ["mysql"]\n' + CHECK, "'engines' must name some of sqlite, postgres"),
        ('status = "not built"\n', "a journey that is not built says why in 'reason'"),
        ("", "a written journey checks every kind of outcome; no response, durable, audit"),
        (CHECK, "no durable, audit, forbidden check"),
        ('[[act]]\nstep = "teleport"\n' + CHECK, "act[0]: unknown step 'teleport'"),
        ("[server]\nprocesses = 9\n" + CHECK, "[server] processes must be 1 to 4"),
        ("[server]\nworkers = 2\n" + CHECK, "[server]: unknown key(s) workers"),
        (CHECK.replace('"response"', '"vibes"'), "check[0]: 'step' must be one of"),
        (CHECK.replace('"status"', '"nope"'), "check[0]: grader 'nope' is not installed"),
        (CHECK.replace("status = 200", "status = 99"), "check[0]: status: 'status' must be"),
        ("id = 2\n", "cannot read"),
        ('version = "one"\n' + CHECK + OTHERS, "'version' must be an integer"),
        ("timeout = 0\n" + CHECK + OTHERS, "'timeout' must be seconds"),
        ('[[act]]\nstep = "sleep"\nengines = ["postgresql"]\n', "act[0]: 'engines' must name"),
        ("[server]\nprocesses = 2\n" + CHECK, 'processes > 1 needs engines = ["postgres"]'),
        ('[server]\nstart = "no"\n', "[server] start must be true or false"),
        ("[server]\nsettings = 5\n", "[server] settings must be a table"),
        ("[server]\nsettings = { x = [1] }\n", "[server] settings.x must be a string"),
        ("[server]\nplugins = { tasks = { a = {} } }\n", "[server] plugins.tasks.a must be"),
        (CHECK.replace('of = "x"\n', ""), "check[0]: status: missing required key 'of'"),
        ('requires = "buildmax-x"\n', "'requires' must be an array of tables ([[requires]])"),
        ('[[requires]]\ndistribution = "x"\n', "requires[0]: 'install' must be a non-empty"),
        ('[[requires]]\ndistribution = "x"\ninstall = ""\n', "requires[0]: 'install' must be"),
        ('[[requires]]\ndistribution = 1\ninstall = "./x"\n', "requires[0]: 'distribution'"),
        ('[[requires]]\nname = "x"\n', "requires[0]: unknown key(s) name"),
    ],
)
def test_a_bad_file_is_refused_naming_its_problem(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(JourneyFileError) as refused:
        load(tmp_path, text)
    assert message in str(refused.value)


MCP = '[[act]]\nstep = "mcp"\nsave = "ready"\nas = "ada"\ntool = "list_ready"\n'


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('method = "POST"\n', "act[0]: mcp: unknown key(s) method"),
        ("json = {}\npath = 1\n", "act[0]: mcp: unknown key(s) json, path"),
        ("", None),
        ('arguments = ["space"]\n', "act[0]: mcp: 'arguments' must be a table"),
        ("expect = 201\n", "act[0]: mcp: 'expect' must be 'ok' or a problem slug"),
        ('expect = "Claim Vetoed"\n', "act[0]: mcp: 'expect' must be 'ok' or a problem slug"),
        ('expect = ""\n', "act[0]: mcp: 'expect' must be 'ok' or a problem slug"),
        ("server = -1\n", "act[0]: mcp: 'server' must be a server process index"),
        ("server = true\n", "act[0]: mcp: 'server' must be a server process index"),
        ("timeout = 0\n", "act[0]: mcp: 'timeout' must be seconds"),
        ('timeout = "60"\n', "act[0]: mcp: 'timeout' must be seconds"),
    ],
)
def test_an_mcp_step_table_is_checked_when_the_file_loads(
    tmp_path: Path, table: str, message: str | None
) -> None:
    """Every key an ``mcp`` step cannot use is named before any server
    starts (the empty case: a good table loads)."""
    text = MCP + table + CHECK + OTHERS
    if message is None:
        (step,) = load(tmp_path, text).steps
        assert (step.kind, step.label) == ("mcp", "act[0] mcp: ready")
        return
    with pytest.raises(JourneyFileError) as refused:
        load(tmp_path, text)
    assert str(refused.value).startswith(message)


@pytest.mark.parametrize(
    ("drop", "replace", "message"),
    [
        ('as = "ada"\n', "", "act[0]: mcp: missing required key 'as'"),
        ('tool = "list_ready"\n', "", "act[0]: mcp: missing required key 'tool'"),
        ('as = "ada"\n', 'as = ""\n', "act[0]: mcp: 'as' must be a non-empty string"),
        ('tool = "list_ready"\n', "tool = 3\n", "act[0]: mcp: 'tool' must be a non-empty string"),
    ],
)
def test_an_mcp_step_names_its_actor_and_its_tool(
    tmp_path: Path, drop: str, replace: str, message: str
) -> None:
    with pytest.raises(JourneyFileError) as refused:
        load(tmp_path, MCP.replace(drop, replace) + CHECK + OTHERS)
    assert str(refused.value) == message


def test_the_runner_checks_step_tables_when_it_loads_journeys(tmp_path: Path) -> None:
    path = tmp_path / "J99.toml"
    path.write_text('id = "J99"\ntitle = "t"\n' + MCP + "colour = 1\n" + CHECK + OTHERS)
    assert load_journeys([path], BUILTIN_GRADERS) == [(path, "act[0]: mcp: unknown key(s) colour")]


def test_every_step_kind_is_documented() -> None:
    rows = {
        line.split("`")[1]
        for line in DOCS.read_text().splitlines()
        if line.startswith("| `") and line.count("|") == 4
    }
    assert set(STEPS) <= rows, set(STEPS) - rows


def test_a_good_file_loads_with_its_steps_and_checks(tmp_path: Path) -> None:
    journey = load(
        tmp_path,
        'engines = ["postgres"]\n[[act]]\nstep = "sleep"\nseconds = 0\nengines = ["sqlite"]\n'
        + CHECK
        + OTHERS,
    )
    assert journey.engines == ("postgres",)
    assert not journey.applies_to("sqlite")
    (step,) = journey.steps
    assert step.label == "act[0] sleep" and not step.applies_to("postgres")
    assert [c.grader_name for c in journey.checks] == ["status", "absent", "absent", "absent"]


def test_a_file_declares_what_it_needs_installed(tmp_path: Path) -> None:
    requires = (
        '[[requires]]\ndistribution = "buildmax-x"\ninstall = "./x"\n'
        '[[requires]]\ndistribution = "buildmax-y"\ninstall = "buildmax-y>=1"\n'
    )
    journey = load(tmp_path, requires + CHECK + OTHERS)
    assert journey.requires == (
        Requirement("buildmax-x", "./x"),
        Requirement("buildmax-y", "buildmax-y>=1"),
    )
    assert load(tmp_path, CHECK + OTHERS).requires == ()


def test_needs_are_read_from_a_file_that_cannot_load(tmp_path: Path) -> None:
    """A file naming a grader that is not installed does not load; what it
    needs is still known, to say what to install before anything runs."""
    path = tmp_path / "J99.toml"
    path.write_text(
        'id = "J99"\ntitle = "t"\n[[requires]]\ndistribution = "buildmax-x"\ninstall = "./x"\n'
        + CHECK.replace('"status"', '"fancy"')
        + OTHERS
    )
    with pytest.raises(JourneyFileError, match="grader 'fancy' is not installed"):
        load_journey(path, BUILTIN_GRADERS, STEPS.__contains__)
    assert needs(path) == Needs((Requirement("buildmax-x", "./x"),), ("fancy", "absent"))


@pytest.mark.parametrize(
    "text",
    ["id = ", 'id = "J99"\nrequires = 3\n[[check]]\ngrader = 5\n', "check = 1\n"],
)
def test_needs_of_an_unreadable_file_are_left_to_the_loader(tmp_path: Path, text: str) -> None:
    path = tmp_path / "J99.toml"
    path.write_text(text)
    assert needs(path) == Needs()
    assert needs(tmp_path / "gone.toml") == Needs()


class Fussy:
    """A third-party grader that reads its spec carelessly."""

    def __init__(self, spec: dict[str, object]) -> None:
        self.of = spec["of"]


def test_a_grader_crashing_on_its_spec_is_a_file_error(tmp_path: Path) -> None:
    path = tmp_path / "J99.toml"
    path.write_text(
        'id = "J99"\ntitle = "t"\n'
        + CHECK.replace('"status"', '"fussy"', 1).replace('of = "x"\n', "")
    )
    with pytest.raises(JourneyFileError, match="check\\[0\\]: 'of'"):
        load_journey(path, {**BUILTIN_GRADERS, "fussy": Fussy}, STEPS.__contains__)


def test_installed_graders_include_the_built_ins_and_plugins() -> None:
    graders = installed_graders()
    assert set(BUILTIN_GRADERS) <= set(graders)
    for name, factory in BUILTIN_GRADERS.items():
        assert graders[name] is factory
