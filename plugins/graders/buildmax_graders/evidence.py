"""The evidence bundle of one journey on one engine.

``<output>/<commit>/<engine>/<journey>/`` holds ``manifest.json``,
``result.json``, ``junit.xml``, ``server.log``, ``audit.jsonl`` and
``db-state.json``. A file that does not apply is not written; the manifest
lists it as not applicable, with the reason. Secrets the journey minted are
redacted from every file.
"""

from __future__ import annotations

import json
import platform
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, distributions, version
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from buildmax.database import Database

#: The files of a bundle, in the order the manifest lists them.
BUNDLE_FILES = (
    "manifest.json",
    "result.json",
    "junit.xml",
    "server.log",
    "audit.jsonl",
    "db-state.json",
)

#: Rows of each table kept in ``db-state.json`` (every table's count is kept).
DB_STATE_ROWS = 100

#: Characters of one value kept in ``db-state.json``.
DB_STATE_VALUE = 200

#: Columns whose values never enter the bundle.
_SECRET_COLUMN = re.compile(r"hash|secret|password|salt|verifier|^token$", re.IGNORECASE)

REDACTED = "[redacted]"

#: Distributions whose versions the manifest records.
_PACKAGES = re.compile(
    r"^(buildmax.*|quart|hypercorn|pluggy|sqlalchemy|aiosqlite|asyncpg|databases|"
    r"marshmallow|argon2-cffi|click|httpx|jsonschema|packaging)$",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Source:
    """The code under qualification: commit and whether the tree was dirty."""

    commit: str
    dirty: bool | None

    @classmethod
    def of(cls, directory: Path) -> Source:
        """The git commit of ``directory`` (``unknown`` outside a checkout)."""

        def git(*args: str) -> str | None:
            try:
                done = subprocess.run(
                    ["git", *args], cwd=directory, capture_output=True, text=True, timeout=30
                )
            except OSError:
                return None
            return done.stdout if done.returncode == 0 else None

        commit = git("rev-parse", "HEAD")
        if commit is None:
            return cls("unknown", None)
        status = git("status", "--porcelain") or ""
        changed = [line for line in status.splitlines() if ".artifacts/" not in line]
        return cls(commit.strip(), bool(changed))


def package_versions() -> dict[str, str]:
    """Versions of BuildMax's distributions and the libraries it stands on."""
    found = {}
    for dist in distributions():
        name = dist.metadata["Name"] or ""
        if _PACKAGES.match(name):
            found[name.lower()] = dist.version
    return dict(sorted(found.items()))


def kernel_version() -> str:
    """The installed kernel's version (the server the runner starts)."""
    try:
        return version("buildmax")
    except PackageNotFoundError:
        return "unknown"


def environment_facts() -> dict[str, Any]:
    """Python, operating system and architecture."""
    return {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "os": platform.platform(),
        "architecture": platform.machine(),
        "executable": sys.executable,
    }


@dataclass
class Bundle:
    """One bundle directory, the files written so far and those that do not apply."""

    directory: Path
    secrets: Sequence[str] = ()
    files: dict[str, str] = field(default_factory=dict)

    def redact(self, text: str) -> str:
        """``text`` with every known secret replaced."""
        for secret in self.secrets:
            if secret:
                text = text.replace(secret, REDACTED)
        return text

    def write_text(self, name: str, text: str) -> None:
        """Write one file of the bundle, redacted."""
        (self.directory / name).write_text(self.redact(text), "utf-8")
        self.files[name] = "present"

    def write_json(self, name: str, document: Any) -> None:
        """Write one JSON file of the bundle, redacted."""
        self.write_text(name, json.dumps(document, indent=2, sort_keys=True, default=str) + "\n")

    def not_applicable(self, name: str, reason: str) -> None:
        """List a file as not applicable, with why."""
        self.files[name] = f"not applicable: {reason}"

    def listing(self) -> dict[str, str]:
        """Every bundle file and its state, for the manifest."""
        listed = {name: self.files.get(name, "missing") for name in BUNDLE_FILES}
        listed["manifest.json"] = "present"
        return listed


def junit(
    suite: str,
    cases: Sequence[Mapping[str, Any]],
    seconds: float,
) -> str:
    """JUnit XML for one journey: one test case per check (``passed``,
    ``failure``, ``error`` or ``not run``) and one per failed step."""
    root = ET.Element("testsuites")
    failures = sum(1 for c in cases if c["outcome"] == "failure")
    errors = sum(1 for c in cases if c["outcome"] == "error")
    skipped = sum(1 for c in cases if c["outcome"] == "not run")
    element = ET.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=str(len(cases)),
        failures=str(failures),
        errors=str(errors),
        skipped=str(skipped),
        time=f"{seconds:.3f}",
    )
    for case in cases:
        item = ET.SubElement(
            element, "testcase", classname=case["classname"], name=case["name"], time="0"
        )
        if case["outcome"] in ("failure", "error"):
            ET.SubElement(item, case["outcome"], message=case["message"]).text = case["message"]
        elif case["outcome"] == "not run":
            ET.SubElement(item, "skipped", message=case["message"])
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def _plain(value: Any, redact: Callable[[str], str]) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(value)} bytes>"
    if not isinstance(value, int | float | bool | str | type(None)):
        value = str(value)
    if isinstance(value, str):
        value = redact(value)  # before cutting: a cut secret would escape the redaction
        if len(value) > DB_STATE_VALUE:
            return value[:DB_STATE_VALUE] + "…"
    return value


_TABLES = {
    "sqlite": "select name from sqlite_master where type = 'table' "
    "and name not like 'sqlite_%' order by name",
    "postgresql": "select table_name from information_schema.tables "
    "where table_schema = current_schema() and table_type = 'BASE TABLE' order by table_name",
}


def _row(row: Mapping[str, Any], redact: Callable[[str], str]) -> dict[str, Any]:
    return {
        key: REDACTED if _SECRET_COLUMN.search(key) and value is not None else _plain(value, redact)
        for key, value in row.items()
    }


async def database_state(database: Database, redact: Callable[[str], str]) -> dict[str, Any]:
    """Every table's row count and its first rows (secret columns and
    ``redact``'s secrets replaced)."""
    tables: dict[str, Any] = {}
    async with database.read() as conn:
        names = [r[next(iter(r))] for r in await conn.fetch_all(sa.text(_TABLES[database.dialect]))]
        for name in names:
            quoted = '"' + name.replace('"', '""') + '"'
            count = await conn.fetch_val(sa.text(f"select count(*) from {quoted}"))
            rows = await conn.fetch_all(sa.text(f"select * from {quoted} limit {DB_STATE_ROWS}"))
            tables[name] = {
                "count": count,
                "rows": [_row(r, redact) for r in rows],
                "truncated": count > DB_STATE_ROWS,
            }
    return {"row_limit_per_table": DB_STATE_ROWS, "tables": tables}


async def engine_version(database: Database) -> str:
    """The database server's version string."""
    if database.dialect == "sqlite":
        sql, label = "select sqlite_version()", "SQLite"
    else:
        sql, label = "show server_version", "PostgreSQL"
    async with database.read() as conn:
        return f"{label} {await conn.fetch_val(sa.text(sql))}"
