"""The built-in graders: HTTP status, JSON Schema, digest, command, rows,
audit events and absences.

Each grader is built from its check's table in a journey file (``spec``);
the constructor refuses a spec it cannot use with a ``ValueError`` naming
the key, so a bad journey file fails when it is loaded, before any server
starts. ``grade`` renders the spec's placeholders against the journey's saved
values at grading time.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from buildmax_hookspecs import Grade, GradingContext

from .process import BUILDMAX, run_command

#: ``type`` of a problem answer is this prefix and the problem's slug.
PROBLEM_TYPE_PREFIX = "urn:buildmax:problem:"

#: Output kept as a command grader's evidence, in characters from the end.
OUTPUT_TAIL = 2000

#: Characters of JSON a json_schema grader keeps as evidence of the value it checked.
VALUE_SHOWN = 2000

#: Matching audit events kept as an audit grader's evidence.
EVENTS_SHOWN = 10


class Spec:
    """A check's table, read with clear errors for the journey's author."""

    def __init__(self, grader: str, raw: Mapping[str, Any], allowed: Sequence[str]) -> None:
        self.grader = grader
        self.raw = raw
        unknown = sorted(set(raw) - set(allowed) - {"grader", "step", "name"})
        if unknown:
            raise ValueError(f"{grader}: unknown key(s) {', '.join(unknown)}")

    def require(self, key: str) -> Any:
        """The value of a required key."""
        if key not in self.raw:
            raise ValueError(f"{self.grader}: missing required key {key!r}")
        return self.raw[key]

    def get(self, key: str, default: Any = None) -> Any:
        """The value of an optional key."""
        return self.raw.get(key, default)

    def one_of(self, *keys: str) -> str:
        """The single key of ``keys`` the spec sets."""
        present = [k for k in keys if k in self.raw]
        if len(present) != 1:
            raise ValueError(f"{self.grader}: set exactly one of {', '.join(keys)}")
        return present[0]

    def integer(self, key: str, default: int | None = None) -> int:
        """An integer key (``default`` when absent and one is given)."""
        value = self.raw.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{self.grader}: {key!r} must be an integer")
        return value


def _problem_slug(body: Any) -> str | None:
    if isinstance(body, Mapping) and isinstance(body.get("type"), str):
        kind: str = body["type"]
        return kind[len(PROBLEM_TYPE_PREFIX) :] if kind.startswith(PROBLEM_TYPE_PREFIX) else kind
    return None


class StatusGrader:
    """The HTTP status of a saved answer, and its problem type.

    ``of`` names the saved answer; ``status`` is the expected code (or a
    list of codes); ``problem`` the expected problem slug (``"task-claimed"``),
    ``true`` for any problem, or ``false`` for an answer that must not be one.
    """

    def __init__(self, raw: Mapping[str, Any]) -> None:
        spec = Spec("status", raw, ("of", "status", "problem"))
        self.of = str(spec.require("of"))
        status = spec.require("status")
        self.statuses = tuple(status) if isinstance(status, list) else (status,)
        if not all(isinstance(s, int) and 100 <= s <= 599 for s in self.statuses):
            raise ValueError("status: 'status' must be an HTTP status code or a list of them")
        self.problem = spec.get("problem")
        if self.problem is not None and not isinstance(self.problem, bool | str):
            raise ValueError("status: 'problem' must be a slug, true or false")

    async def grade(self, context: GradingContext) -> Grade:
        answer = context.value(self.of)
        status = answer.get("status") if isinstance(answer, Mapping) else None
        slug = _problem_slug(answer.get("body")) if isinstance(answer, Mapping) else None
        evidence = {"of": self.of, "status": status, "problem": slug}
        wanted = " or ".join(str(s) for s in self.statuses)
        if status not in self.statuses:
            body = answer.get("body") if isinstance(answer, Mapping) else None
            said = (
                body.get("detail") or body.get("title")
                if slug and isinstance(body, Mapping)
                else None
            )
            detail = f" ({said})" if said else ""
            return Grade(False, f"{self.of}: status {status}, expected {wanted}{detail}", evidence)
        if self.problem is False and slug is not None:
            return Grade(False, f"{self.of}: a {slug!r} problem, expected none", evidence)
        if self.problem is True and slug is None:
            return Grade(False, f"{self.of}: no problem, expected one", evidence)
        if isinstance(self.problem, str) and slug != self.problem:
            return Grade(False, f"{self.of}: problem {slug!r}, expected {self.problem!r}", evidence)
        shown = f" {slug}" if slug else ""
        return Grade(True, f"{self.of}: {status}{shown}", evidence)


class JsonSchemaGrader:
    """A saved value (``of``) or a JSON file (``file``) matches ``schema``."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        # Imported by the grader that needs it: a server process loads this
        # module with the plugin and would pay a fifth of a second at start.
        import jsonschema

        spec = Spec("json_schema", raw, ("of", "file", "schema"))
        self.source = spec.one_of("of", "file")
        self.where = str(spec.require(self.source))
        self.schema = spec.require("schema")
        try:
            jsonschema.Draft202012Validator.check_schema(self.schema)
        except jsonschema.SchemaError as exc:
            raise ValueError(f"json_schema: the schema is invalid: {exc.message}") from None

    async def grade(self, context: GradingContext) -> Grade:
        import jsonschema

        where = context.render(self.where)
        if self.source == "of":
            document = context.value(where)
        else:
            path = context.workdir / where
            try:
                document = json.loads(path.read_text("utf-8"))
            except (OSError, ValueError) as exc:
                return Grade(False, f"{where}: not a readable JSON file ({exc})", {"file": where})
        # Placeholders in the schema ("const = \"{task.body.id}\"") are filled now.
        validator = jsonschema.Draft202012Validator(context.render(self.schema))
        error = jsonschema.exceptions.best_match(validator.iter_errors(document))
        evidence: dict[str, Any] = {self.source: where}
        shown = json.dumps(document, default=str)
        if len(shown) <= VALUE_SHOWN:
            evidence["value"] = document  # small enough to keep beside the verdict
        if error is not None:
            at = "/".join(str(p) for p in error.absolute_path) or "(root)"
            evidence.update(at=at, message=error.message)
            return Grade(False, f"{where}: {at}: {error.message}", evidence)
        return Grade(True, f"{where} matches the schema", evidence)


class Sha256Grader:
    """Bytes match a digest: a file (``file``, under the journey's
    directory) or a saved value (``of``, text as UTF-8); ``digest`` is the
    expected hex digest (a placeholder or a literal)."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        spec = Spec("sha256", raw, ("of", "file", "digest"))
        self.source = spec.one_of("of", "file")
        self.where = str(spec.require(self.source))
        self.digest = spec.require("digest")

    async def grade(self, context: GradingContext) -> Grade:
        where = context.render(self.where)
        expected = str(context.render(self.digest)).lower()
        if self.source == "file":
            path = context.workdir / where
            try:
                data = path.read_bytes()
            except OSError as exc:
                return Grade(False, f"{where}: cannot read ({exc.strerror})", {"file": where})
        else:
            value = context.value(where)
            data = value if isinstance(value, bytes) else str(value).encode()
        actual = hashlib.sha256(data).hexdigest()
        evidence = {self.source: where, "bytes": len(data), "sha256": actual, "expected": expected}
        if actual != expected:
            return Grade(
                False, f"{where}: sha256 {actual[:16]}…, expected {expected[:16]}…", evidence
            )
        return Grade(True, f"{where}: {len(data)} bytes, sha256 matches", evidence)


class CommandGrader:
    """A command's exit status and output.

    ``argv`` is the command (its strings rendered); ``exit`` the expected
    status (default 0); ``output`` a regular expression that must match
    somewhere in stdout and stderr together, ``not_output`` one that must
    not (both with placeholders filled). The command runs in the journey's
    directory with the environment that points the ``buildmax`` CLI at the
    journey's server.
    """

    def __init__(self, raw: Mapping[str, Any]) -> None:
        spec = Spec("command", raw, ("argv", "exit", "output", "not_output", "timeout"))
        argv = spec.require("argv")
        if not isinstance(argv, list) or not argv:
            raise ValueError("command: 'argv' must be a non-empty list")
        self.argv = argv
        self.exit = spec.integer("exit", 0)
        # Checked now, compiled again once placeholders are filled.
        self.output, self.not_output = spec.get("output"), spec.get("not_output")
        for pattern in (self.output, self.not_output):
            if pattern:
                re.compile(pattern)
        self.timeout = float(spec.get("timeout", 120))

    async def grade(self, context: GradingContext) -> Grade:
        argv = [str(context.render(a)) for a in self.argv]
        command = [*BUILDMAX, *argv[1:]] if argv[0] == "buildmax" else argv
        try:
            done = await run_command(
                command,
                cwd=context.workdir,
                env={**os.environ, **context.environment()},
                seconds=self.timeout,
            )
        except TimeoutError:
            return Grade(
                False, f"{argv[0]}: still running after {self.timeout:g} s", {"argv": argv}
            )
        text = done.stdout
        evidence = {"argv": argv, "exit": done.status, "output": text[-OUTPUT_TAIL:]}
        if done.status != self.exit:
            return Grade(
                False,
                f"{' '.join(argv[:3])}: exit {done.status}, expected {self.exit}: {done.last_line}",
                evidence,
            )
        output = re.compile(str(context.render(self.output))) if self.output else None
        not_output = re.compile(str(context.render(self.not_output))) if self.not_output else None
        if output and not output.search(text):
            return Grade(False, f"{argv[0]}: output lacks /{output.pattern}/", evidence)
        if not_output and (found := not_output.search(text)):
            return Grade(False, f"{argv[0]}: output has {found.group(0)!r}", evidence)
        return Grade(True, f"{' '.join(argv[:3])}: exit {done.status}", evidence)


class DbRowsGrader:
    """A SQL value over the durable state equals ``equals`` (placeholders
    filled): ``sql`` is one read-only query (``SELECT count(*) ...``) with
    ``:name`` parameters rendered from ``params``."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        spec = Spec("db_rows", raw, ("sql", "params", "equals", "why"))
        self.sql = str(spec.require("sql"))
        if not re.match(r"\s*(select|with)\b", self.sql, re.IGNORECASE):
            raise ValueError("db_rows: 'sql' must be a SELECT")
        self.params = dict(spec.get("params", {}))
        self.equals = spec.require("equals")
        self.why = spec.get("why")

    async def grade(self, context: GradingContext) -> Grade:
        params = {k: context.render(v) for k, v in self.params.items()}
        expected = context.render(self.equals)
        value = await context.scalar(self.sql, params)
        what = self.why or " ".join(self.sql.split())[:80]
        evidence = {"sql": self.sql, "params": params, "value": value, "expected": expected}
        if value != expected:
            return Grade(False, f"{what}: {value!r}, expected {expected!r}", evidence)
        return Grade(True, f"{what}: {value!r}", evidence)


class AuditGrader:
    """Exactly ``count`` audit events with ``action`` (and ``target``, a
    target id, and ``space``, a chain: the space's id) recorded after the
    mark a ``audit_mark`` step saved (``since``)."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        spec = Spec("audit", raw, ("action", "target", "space", "since", "count"))
        self.action = str(spec.require("action"))
        self.target = spec.get("target")
        self.space = spec.get("space")
        self.since = spec.get("since")
        self.count = spec.integer("count", 1)

    async def grade(self, context: GradingContext) -> Grade:
        target = context.render(self.target) if self.target is not None else None
        space = context.render(self.space) if self.space is not None else None
        marks: Mapping[str, int] = context.value(self.since) if self.since else {}
        matching = [
            e
            for e in await context.audit_events()
            if e.get("action") == self.action
            and (target is None or (e.get("target") or {}).get("id") == target)
            and (space is None or e.get("chain") == space)
            and e.get("seq", 0) > marks.get(e.get("chain", ""), 0)
        ]
        evidence = {
            "action": self.action,
            "target": target,
            "found": len(matching),
            "events": [
                {k: e.get(k) for k in ("chain", "seq", "action", "target", "actor")}
                for e in matching[:EVENTS_SHOWN]
            ],
        }
        about = f"{self.action}" + (f" on {target}" if target else "")
        if len(matching) != self.count:
            return Grade(
                False, f"{about}: {len(matching)} event(s), expected {self.count}", evidence
            )
        return Grade(True, f"{about}: {len(matching)} event(s)", evidence)


class AbsentGrader:
    """A forbidden side effect did not happen. ``kind`` is one of:

    - ``row``: ``sql`` (a count, with ``params``) is zero;
    - ``file_outside``: no file or link under ``root`` lies outside
      ``directory`` (both under the journey's directory);
    - ``secret_in_log``: no secret the journey minted, nor any of
      ``values``, appears in the server's log;
    - ``log_pattern``: the regular expression ``pattern`` matches nothing
      in the server's log (a traceback, say).
    """

    KINDS = ("row", "file_outside", "secret_in_log", "log_pattern")

    def __init__(self, raw: Mapping[str, Any]) -> None:
        spec = Spec(
            "absent",
            raw,
            ("kind", "sql", "params", "root", "directory", "values", "pattern", "why"),
        )
        self.kind = spec.require("kind")
        if self.kind not in self.KINDS:
            raise ValueError(f"absent: 'kind' must be one of {', '.join(self.KINDS)}")
        self.why = spec.get("why")
        if self.kind == "row":
            rows = {"sql": spec.require("sql"), "params": spec.get("params", {}), "equals": 0}
            self.rows = DbRowsGrader({**rows, "why": self.why} if self.why else rows)
        elif self.kind == "file_outside":
            self.root = str(spec.get("root", "."))
            self.directory = str(spec.require("directory"))
        elif self.kind == "secret_in_log":
            self.values = list(spec.get("values", []))
        else:
            self.pattern = re.compile(spec.require("pattern"))

    async def grade(self, context: GradingContext) -> Grade:
        if self.kind == "row":
            return await self.rows.grade(context)
        if self.kind == "file_outside":
            return self._files(context)
        log = context.server_log()
        if self.kind == "log_pattern":
            found = self.pattern.search(log)
            if found:
                line = log[: found.start()].count("\n") + 1
                evidence = {"pattern": self.pattern.pattern, "line": line}
                return Grade(
                    False, f"server log line {line} matches /{self.pattern.pattern}/", evidence
                )
            return Grade(
                True, f"no /{self.pattern.pattern}/ in the server log", {"bytes": len(log)}
            )
        secrets = [*context.secrets(), *(str(context.render(v)) for v in self.values)]
        if not any(secrets):  # the journey's fault, not the product's
            raise LookupError("no secret to look for: the journey minted none")
        leaked = [s for s in secrets if s and s in log]
        evidence = {"secrets_checked": len(secrets), "leaked": len(leaked), "bytes": len(log)}
        if leaked:
            return Grade(False, f"{len(leaked)} secret(s) appear in the server log", evidence)
        return Grade(True, f"none of {len(secrets)} secret(s) in the server log", evidence)

    def _files(self, context: GradingContext) -> Grade:
        root = (context.workdir / str(context.render(self.root))).resolve()
        allowed = (context.workdir / str(context.render(self.directory))).resolve()
        if not root.is_dir():
            return Grade(False, f"{self.root} is not a directory", {"root": str(root)})
        outside: list[str] = []
        for dirpath, dirnames, filenames in os.walk(root):
            for name in [*dirnames, *filenames]:
                path = Path(dirpath) / name
                # A link anywhere may point out; a file must lie under ``allowed``.
                if path.is_symlink() or (not path.is_dir() and allowed not in path.parents):
                    outside.append(str(path.relative_to(root)))
        evidence = {"root": str(root), "directory": str(allowed), "outside": outside[:20]}
        if outside:
            return Grade(
                False, f"{len(outside)} path(s) outside {self.directory}: {outside[0]}", evidence
            )
        return Grade(True, f"nothing under {self.root} outside {self.directory}", evidence)


#: The graders this plugin offers, by the name a journey file uses.
BUILTIN_GRADERS: dict[str, Any] = {
    "status": StatusGrader,
    "json_schema": JsonSchemaGrader,
    "sha256": Sha256Grader,
    "command": CommandGrader,
    "db_rows": DbRowsGrader,
    "audit": AuditGrader,
    "absent": AbsentGrader,
}
