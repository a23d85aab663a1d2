"""Journey files: one TOML file per critical journey, loaded and checked
before any server starts.

A journey follows the seven steps of a journey test: ``arrange`` and
``act`` are lists of steps (``[[arrange]]``, ``[[act]]``), ``check`` a list
of graded checks (``[[check]]``), each tagged with what it asserts
(``response``, ``durable``, ``audit`` or ``forbidden``); isolation comes
from the runner, which gives every journey its own database and server.
Strings may hold ``{ref}`` placeholders naming values earlier steps saved.
What a journey needs installed beside the server (a plugin offering a grader
it names, the test-only fault plugin) it declares under ``[[requires]]``.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from buildmax_hookspecs import Grader

#: Engines a journey may apply to.
ENGINES = ("sqlite", "postgres")

#: What a check asserts: steps 3 to 6 of a journey test.
ASSERTS = ("response", "durable", "audit", "forbidden")

#: Seconds a journey's steps and checks may take together, unless its file says.
DEFAULT_TIMEOUT = 600.0

#: ``status`` of a journey file: written, or waiting for the feature it needs.
WRITTEN, NOT_BUILT = "written", "not built"

_JOURNEY_KEYS = {
    "id",
    "title",
    "version",
    "engines",
    "status",
    "reason",
    "timeout",
    "server",
    "requires",
    "arrange",
    "act",
    "check",
}
_SERVER_KEYS = {"start", "database", "processes", "blob_faults", "plugins", "settings"}
_REQUIRES_KEYS = {"distribution", "install"}

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][\w-]*(?:\.[\w-]+)*)\}")


class JourneyFileError(ValueError):
    """A journey file that cannot be run as written (the harness's fault)."""


@dataclass(frozen=True)
class ServerPlan:
    """How the runner brings up the journey's server.

    ``start``: start it before the first step (``false``: a step does);
    ``database``: ``template`` (migrated, from the runner's template) or
    ``empty`` (nothing in it, not even tables); ``processes``: server
    processes on one database (more than one: PostgreSQL only);
    ``blob_faults``: the blob store goes through the test-only fault
    plugin; ``plugins``: ``[plugins.<name>]`` tables for the config file;
    ``settings``: other top-level settings.
    """

    start: bool = True
    database: str = "template"
    processes: int = 1
    blob_faults: bool = False
    plugins: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Requirement:
    """A distribution a journey needs installed beside the server
    (``[[requires]]``): ``distribution`` its name, ``install`` what to give
    ``pip install`` for it (a path from the repository root, or a
    requirement)."""

    distribution: str
    install: str


@dataclass(frozen=True)
class Needs:
    """What a journey file needs installed: the distributions it requires
    and the graders its checks name."""

    requires: tuple[Requirement, ...] = ()
    graders: tuple[str, ...] = ()


@dataclass(frozen=True)
class Step:
    """One arrange or act step: a step kind and its table."""

    phase: str
    index: int
    kind: str
    spec: Mapping[str, Any]

    @property
    def label(self) -> str:
        """``act[2] request: claim`` (the step's ``name`` or ``save``)."""
        name = self.spec.get("name") or self.spec.get("save") or ""
        return f"{self.phase}[{self.index}] {self.kind}" + (f": {name}" if name else "")

    def applies_to(self, engine: str) -> bool:
        """Whether the step runs on ``engine`` (its ``engines``, default all)."""
        return engine in self.spec.get("engines", ENGINES)


@dataclass(frozen=True)
class Check:
    """One graded check: the grader built from the check's table."""

    index: int
    grader_name: str
    asserts: str
    name: str
    grader: Grader


@dataclass(frozen=True)
class Journey:
    """A journey file, loaded and checked."""

    id: str
    title: str
    version: int
    path: Path
    engines: tuple[str, ...]
    status: str
    reason: str
    timeout: float
    server: ServerPlan
    steps: tuple[Step, ...]
    checks: tuple[Check, ...]
    requires: tuple[Requirement, ...] = ()

    def applies_to(self, engine: str) -> bool:
        """Whether the journey runs on ``engine``."""
        return engine in self.engines


def _table_list(raw: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = raw.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise JourneyFileError(f"'{key}' must be an array of tables ([[{key}]])")
    return value


def _server_plan(raw: Any) -> ServerPlan:
    if not isinstance(raw, Mapping):
        raise JourneyFileError("'server' must be a table")
    unknown = set(raw) - _SERVER_KEYS
    if unknown:
        raise JourneyFileError(f"[server]: unknown key(s) {', '.join(sorted(unknown))}")
    plan = ServerPlan(**raw)
    if plan.database not in ("template", "empty"):
        raise JourneyFileError("[server] database must be 'template' or 'empty'")
    if isinstance(plan.processes, bool) or not isinstance(plan.processes, int):
        raise JourneyFileError("[server] processes must be 1 to 4")
    if not 1 <= plan.processes <= 4:
        raise JourneyFileError("[server] processes must be 1 to 4")
    for flag in ("start", "blob_faults"):
        if not isinstance(getattr(plan, flag), bool):
            raise JourneyFileError(f"[server] {flag} must be true or false")
    tables = {
        "settings": plan.settings,
        **{f"plugins.{k}": v for k, v in _table(plan.plugins, "plugins").items()},
    }
    for name, table in tables.items():
        for key, value in _table(table, name).items():
            if not isinstance(value, bool | int | float | str):
                raise JourneyFileError(f"[server] {name}.{key} must be a string, number or boolean")
    return plan


def _requirements(raw: Any) -> tuple[Requirement, ...]:
    if not isinstance(raw, list) or not all(isinstance(r, Mapping) for r in raw):
        raise JourneyFileError("'requires' must be an array of tables ([[requires]])")
    found = []
    for index, table in enumerate(raw):
        unknown = set(table) - _REQUIRES_KEYS
        if unknown:
            raise JourneyFileError(
                f"requires[{index}]: unknown key(s) {', '.join(sorted(unknown))}"
            )
        for key in sorted(_REQUIRES_KEYS):
            if not isinstance(table.get(key), str) or not table[key].strip():
                raise JourneyFileError(f"requires[{index}]: '{key}' must be a non-empty string")
        found.append(Requirement(table["distribution"].strip(), table["install"].strip()))
    return tuple(found)


def needs(path: Path) -> Needs:
    """What the journey file at ``path`` needs installed, read without
    loading it (a file naming a grader that is not installed does not load).
    What cannot be read is left for :func:`load_journey` to report."""
    try:
        raw = tomllib.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return Needs()
    try:
        requires = _requirements(raw.get("requires", []))
    except JourneyFileError:
        requires = ()
    checks = raw.get("check", [])
    graders = (
        [c["grader"] for c in checks if isinstance(c, Mapping) and isinstance(c.get("grader"), str)]
        if isinstance(checks, list)
        else []
    )
    return Needs(requires, tuple(dict.fromkeys(graders)))


def _table(value: Any, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise JourneyFileError(f"[server] {name} must be a table")
    return value


def load_journey(
    path: Path,
    graders: Mapping[str, Callable[[Mapping[str, Any]], Grader]],
    step_kinds: Callable[[str], bool],
    check_step: Callable[[str, Mapping[str, Any]], None] | None = None,
) -> Journey:
    """Read and check one journey file: known keys, known step kinds whose
    tables ``check_step`` accepts (it raises ``ValueError`` naming what it
    cannot use), installed graders whose specs they accept.
    ``JourneyFileError`` names the file's problem."""
    try:
        raw = tomllib.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise JourneyFileError(f"cannot read: {exc}") from None
    try:
        return _journey(path, raw, graders, step_kinds, check_step)
    except JourneyFileError:
        raise
    except Exception as exc:  # a value of the wrong type, a grader that crashes on its spec
        raise JourneyFileError(f"{type(exc).__name__}: {exc}") from None


def _journey(
    path: Path,
    raw: Mapping[str, Any],
    graders: Mapping[str, Callable[[Mapping[str, Any]], Grader]],
    step_kinds: Callable[[str], bool],
    check_step: Callable[[str, Mapping[str, Any]], None] | None,
) -> Journey:
    unknown = set(raw) - _JOURNEY_KEYS
    if unknown:
        raise JourneyFileError(f"unknown key(s) {', '.join(sorted(unknown))}")
    for key in ("id", "title"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise JourneyFileError(f"'{key}' must be a non-empty string")
    engines = tuple(raw.get("engines", ENGINES))
    if not engines or any(e not in ENGINES for e in engines):
        raise JourneyFileError(f"'engines' must name some of {', '.join(ENGINES)}")
    status = raw.get("status", WRITTEN)
    if status not in (WRITTEN, NOT_BUILT):
        raise JourneyFileError(f"'status' must be {WRITTEN!r} or {NOT_BUILT!r}")
    if status == NOT_BUILT and not raw.get("reason"):
        raise JourneyFileError("a journey that is not built says why in 'reason'")

    server = _server_plan(raw.get("server", {}))
    requires = _requirements(raw.get("requires", []))
    if server.processes > 1 and "sqlite" in engines:
        raise JourneyFileError('[server] processes > 1 needs engines = ["postgres"]')

    steps: list[Step] = []
    for phase in ("arrange", "act"):
        for index, spec in enumerate(_table_list(raw, phase)):
            kind = spec.get("step")
            if not isinstance(kind, str) or not step_kinds(kind):
                raise JourneyFileError(f"{phase}[{index}]: unknown step {kind!r}")
            only = spec.get("engines", ENGINES)
            if (
                not isinstance(only, list | tuple)
                or not only
                or any(e not in ENGINES for e in only)
            ):
                raise JourneyFileError(
                    f"{phase}[{index}]: 'engines' must name some of {', '.join(ENGINES)}"
                )
            if check_step is not None:
                try:
                    check_step(kind, spec)
                except ValueError as exc:
                    raise JourneyFileError(f"{phase}[{index}]: {exc}") from None
            steps.append(Step(phase, index, kind, spec))

    checks: list[Check] = []
    for index, spec in enumerate(_table_list(raw, "check")):
        name = spec.get("grader")
        asserts = spec.get("step")
        if not isinstance(asserts, str) or asserts not in ASSERTS:
            raise JourneyFileError(f"check[{index}]: 'step' must be one of {', '.join(ASSERTS)}")
        if not isinstance(name, str) or name not in graders:
            installed = ", ".join(sorted(graders)) or "none"
            raise JourneyFileError(
                f"check[{index}]: grader {name!r} is not installed (installed: {installed})"
            )
        try:
            grader = graders[name](spec)
        except Exception as exc:  # ValueError by contract; anything else is as bad
            raise JourneyFileError(f"check[{index}]: {exc}") from None
        checks.append(Check(index, name, asserts, str(spec.get("name", "")), grader))
    missing = [a for a in ASSERTS if not any(c.asserts == a for c in checks)]
    if status == WRITTEN and missing:
        # Steps 3 to 6 of every journey test: none may be left out.
        raise JourneyFileError(
            f"a written journey checks every kind of outcome; no {', '.join(missing)} check"
        )

    timeout = raw.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 3600:
        raise JourneyFileError("'timeout' must be seconds, more than 0 and at most 3600")
    version = raw.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise JourneyFileError("'version' must be an integer")
    return Journey(
        id=raw["id"],
        title=raw["title"],
        version=version,
        timeout=float(timeout),
        path=path,
        engines=engines,
        status=status,
        reason=str(raw.get("reason", "")),
        server=server,
        steps=tuple(steps),
        checks=tuple(checks),
        requires=requires,
    )


def resolve(values: Mapping[str, Any], ref: str) -> Any:
    """The value at dotted path ``ref`` (list items by index); ``KeyError``
    naming the first missing part."""
    current: Any = values
    walked: list[str] = []
    for part in ref.split("."):
        walked.append(part)
        if isinstance(current, Mapping) and part in current:
            current = current[part]
        elif isinstance(current, Sequence) and not isinstance(current, str) and part.isdigit():
            try:
                current = current[int(part)]
            except IndexError:
                raise KeyError(f"no value at {'.'.join(walked)!r}") from None
        else:
            raise KeyError(f"no value at {'.'.join(walked)!r}")
    return current


def render(values: Mapping[str, Any], template: Any) -> Any:
    """``template`` with ``{ref}`` placeholders filled from ``values``,
    through lists and tables (keys too); a string that is exactly one placeholder keeps
    the value's type (a generation stays an integer)."""
    if isinstance(template, str):
        whole = _PLACEHOLDER.fullmatch(template)
        if whole:
            return resolve(values, whole.group(1))
        return _PLACEHOLDER.sub(lambda m: str(resolve(values, m.group(1))), template)
    if isinstance(template, Mapping):
        return {str(render(values, k)): render(values, v) for k, v in template.items()}
    if isinstance(template, list):
        return [render(values, v) for v in template]
    return template


def discover(directory: Path) -> list[Path]:
    """The journey files of ``directory``, by name (``J01.toml`` ...)."""
    return sorted(directory.glob("*.toml"))
