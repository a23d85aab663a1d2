"""The qualification runner: every journey on every engine against real
server processes, graded, each leaving an evidence bundle.

A journey either passes, fails (classified ``product``, ``harness`` or
``infrastructure``), is *not applicable* on an engine it does not declare,
or is *not built* (its file says what it waits for). Only a failure fails
the run; the other two are never counted as passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from buildmax_hookspecs import Grade

from buildmax.clock import to_rfc3339
from buildmax.database import DatabaseError, servers

from . import evidence
from .deployment import Deployment, InfrastructureError
from .journey import NOT_BUILT, Journey, JourneyFileError, load_journey
from .run import JourneyRun, StepFailed, describe
from .steps import STEPS

PASSED, FAILED, NOT_APPLICABLE = "passed", "failed", "not applicable"
PRODUCT, HARNESS, INFRASTRUCTURE = "product", "harness", "infrastructure"

#: Seconds a journey's steps and checks may take together.
JOURNEY_TIMEOUT = 600.0


@dataclass
class Outcome:
    """How one journey went on one engine."""

    journey: str
    title: str
    engine: str
    status: str
    reason: str = ""
    classification: str | None = None
    seconds: float = 0.0
    checks: int = 0
    bundle: Path | None = None

    def summary(self) -> dict[str, Any]:
        """As ``summary.json`` lists it."""
        return {
            "journey": self.journey,
            "title": self.title,
            "engine": self.engine,
            "status": self.status,
            "classification": self.classification,
            "reason": self.reason,
            "seconds": round(self.seconds, 2),
            "checks": self.checks,
            "bundle": str(self.bundle) if self.bundle else None,
        }


@dataclass
class _Record:
    """What one run gathered for its bundle."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    failure: tuple[str, str] | None = None  # (classification, reason)

    def fail(self, classification: str, reason: str) -> None:
        """Keep the first failure, except that a product failure outranks a
        harness one: a step that crashes on a value missing because the
        product misbehaved is reported as that misbehaviour."""
        if self.failure is None or (self.failure[0] == HARNESS and classification == PRODUCT):
            self.failure = (classification, reason)


class Qualification:
    """One qualification run over a journeys directory."""

    def __init__(
        self,
        journeys: Sequence[Journey | tuple[Path, str]],
        *,
        engines: Sequence[str],
        output: Path,
        source: evidence.Source,
        pg_server_url: str,
        steps_dir: Path | None,
        keep: bool = False,
    ) -> None:
        self.journeys = journeys
        self.engines = engines
        self.output = output
        self.source = source
        self.pg_server_url = pg_server_url
        self.steps_dir = steps_dir
        self.keep = keep
        self._templates: dict[str, str | Exception] = {}

    @property
    def root(self) -> Path:
        """Where this commit's bundles go."""
        return self.output / self.source.commit

    async def run(
        self, starting: Callable[[str], None], finished: Callable[[Outcome], None]
    ) -> list[Outcome]:
        """Run everything; ``starting`` hears each journey as it starts
        (``"sqlite J03"``), ``finished`` its outcome."""
        outcomes = []
        try:
            for engine in self.engines:
                for journey in self.journeys:
                    name = journey.id if isinstance(journey, Journey) else journey[0].stem
                    starting(f"{engine} {name}")
                    outcome = await self._one(journey, engine)
                    outcomes.append(outcome)
                    finished(outcome)
        finally:
            await self._drop_templates()
        return outcomes

    # -- PostgreSQL template --

    async def _template(self) -> str:
        """A migrated PostgreSQL database journeys clone (made once)."""
        made = self._templates.get("postgres")
        if isinstance(made, Exception):
            raise InfrastructureError(str(made))
        if made is not None:
            return made
        name = f"bmq_template_{uuid.uuid4().hex[:12]}"
        try:
            url = await servers.create_database(self.pg_server_url, name)
        except DatabaseError as exc:
            self._templates["postgres"] = InfrastructureError(f"PostgreSQL: {exc}")
            raise InfrastructureError(f"PostgreSQL: {exc}") from exc
        self._templates["postgres"] = name
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "buildmax",
            "db",
            "migrate",
            "--database-url",
            url,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await process.communicate()
        if process.returncode != 0:
            failure = InfrastructureError(f"migrating the template failed: {out.decode()[-300:]}")
            self._templates["postgres"] = failure
            await servers.drop_database(self.pg_server_url, name)
            raise failure
        return name

    async def _drop_templates(self) -> None:
        made = self._templates.get("postgres")
        if isinstance(made, str):
            await servers.drop_database(self.pg_server_url, made)

    # -- one journey --

    async def _one(self, journey: Journey | tuple[Path, str], engine: str) -> Outcome:
        started = time.time()
        if isinstance(journey, tuple):  # a file that did not load
            path, problem = journey
            outcome = Outcome(path.stem, "(unreadable journey file)", engine, FAILED)
            outcome.reason, outcome.classification = f"{path.name}: {problem}", HARNESS
            return self._static_bundle(outcome, None, started)
        outcome = Outcome(journey.id, journey.title, engine, PASSED, checks=len(journey.checks))
        if journey.status == NOT_BUILT:
            outcome.status, outcome.reason = NOT_BUILT, journey.reason
            return self._static_bundle(outcome, journey, started)
        if not journey.applies_to(engine):
            outcome.status = NOT_APPLICABLE
            outcome.reason = f"declared for {', '.join(journey.engines)} only"
            return self._static_bundle(outcome, journey, started)
        return await self._run(journey, engine, outcome, started)

    def _bundle_dir(self, journey_id: str, engine: str) -> Path:
        directory = self.root / engine / journey_id
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        return directory

    def _static_bundle(self, outcome: Outcome, journey: Journey | None, started: float) -> Outcome:
        """The bundle of a journey that did not run: manifest and result only."""
        bundle = evidence.Bundle(self._bundle_dir(outcome.journey, outcome.engine))
        why = outcome.reason if outcome.status != FAILED else "the journey did not run"
        for name in evidence.BUNDLE_FILES[2:]:
            bundle.not_applicable(name, f"{outcome.status}: {why}")
        bundle.write_json("result.json", self._result(outcome, _Record()))
        self._manifest(bundle, outcome, journey, started, faults=[], server=None)
        outcome.bundle = bundle.directory
        return outcome

    async def _run(
        self, journey: Journey, engine: str, outcome: Outcome, started: float
    ) -> Outcome:
        workdir = Path(tempfile.mkdtemp(prefix=f"bmq-{journey.id}-{engine}-"))
        deployment = Deployment(engine, workdir, journey.server, self.pg_server_url)
        run = JourneyRun(journey, deployment, self.steps_dir)
        record = _Record()
        server: dict[str, Any] | None = None
        try:
            try:
                if engine == "postgres" and journey.server.database == "template":
                    deployment.template = await self._template()
                await deployment.prepare()
                await asyncio.wait_for(self._act_and_grade(journey, run, record), JOURNEY_TIMEOUT)
            except TimeoutError:
                record.fail(PRODUCT, f"{run.current_step}: no end after {JOURNEY_TIMEOUT:g} s")
            except InfrastructureError as exc:
                record.fail(INFRASTRUCTURE, f"{run.current_step}: {exc}")
            server = await self._server_facts(run)
            await deployment.stop()
            bundle = evidence.Bundle(
                self._bundle_dir(journey.id, engine),
                secrets=[
                    *run.minted,
                    *([deployment.admin_token] if deployment.admin_token else []),
                ],
            )
            await self._collect(bundle, run, record)
        finally:
            await deployment.stop()
            await run.close()
            with contextlib.suppress(DatabaseError):
                await deployment.discard()
            if not self.keep:
                shutil.rmtree(workdir, ignore_errors=True)
        if record.failure is not None:
            outcome.status = FAILED
            outcome.classification, outcome.reason = record.failure
        outcome.seconds = time.time() - started
        bundle.write_json("result.json", self._result(outcome, record))
        bundle.write_text("junit.xml", self._junit(journey, engine, record, outcome.seconds))
        self._manifest(bundle, outcome, journey, started, faults=run.faults, server=server)
        outcome.bundle = bundle.directory
        return outcome

    async def _act_and_grade(self, journey: Journey, run: JourneyRun, record: _Record) -> None:
        if journey.server.start:
            run.current_step = "start"
            await run.deployment.start()
        for step in journey.steps:
            run.current_step = step.label
            began = time.monotonic()
            entry: dict[str, Any] = {"step": step.label, "outcome": "ok"}
            record.steps.append(entry)
            if not step.applies_to(run.deployment.engine):
                entry["outcome"] = "not applicable on this engine"
                continue
            try:
                run.save(step.spec.get("save"), await STEPS[step.kind](run, step.spec))
            except StepFailed as exc:
                entry.update(outcome="failed", error=str(exc))
                record.fail(PRODUCT, f"{step.label}: {exc}")
            except InfrastructureError as exc:
                entry.update(outcome="failed", error=str(exc))
                record.fail(INFRASTRUCTURE, f"{step.label}: {exc}")
            except (ImportError, FileNotFoundError) as exc:
                entry.update(outcome="failed", error=describe(exc))
                record.fail(INFRASTRUCTURE, f"{step.label}: missing dependency: {describe(exc)}")
            except Exception as exc:
                entry.update(outcome="failed", error=describe(exc))
                record.fail(HARNESS, f"{step.label}: {describe(exc)}")
            entry["seconds"] = round(time.monotonic() - began, 3)
            if record.failure is not None:
                break
        run.current_step = "check"
        for check in journey.checks:
            entry = {
                "check": check.index,
                "name": check.name,
                "grader": check.grader_name,
                "asserts": check.asserts,
            }
            record.checks.append(entry)
            if record.failure is not None and record.failure[0] == INFRASTRUCTURE:
                entry.update(outcome="not run", reason="the journey's infrastructure failed")
                continue
            try:
                grade = await check.grader.grade(run)
                if not isinstance(grade, Grade):
                    raise TypeError(f"grader {check.grader_name!r} returned {type(grade).__name__}")
            except Exception as exc:
                entry.update(outcome="error", reason=describe(exc))
                record.fail(HARNESS, f"check[{check.index}] {check.grader_name}: {describe(exc)}")
                continue
            entry.update(
                outcome="passed" if grade.passed else "failed",
                reason=grade.reason,
                evidence=dict(grade.evidence),
            )
            if not grade.passed:
                record.fail(PRODUCT, f"check[{check.index}] {check.grader_name}: {grade.reason}")

    async def _server_facts(self, run: JourneyRun) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "version": evidence.kernel_version(),
            "processes": len(run.deployment.servers),
            "starts": [s.starts for s in run.deployment.servers],
            "config": run.deployment.config_path.name,
        }
        try:
            facts["database"] = await evidence.engine_version(await run.database())
        except Exception as exc:  # the database may be what failed
            facts["database"] = f"unknown ({describe(exc)})"
        return facts

    async def _collect(self, bundle: evidence.Bundle, run: JourneyRun, record: _Record) -> None:
        deployment = run.deployment
        if any(s.starts for s in deployment.servers):
            bundle.write_text("server.log", deployment.log())
        else:
            bundle.not_applicable("server.log", "no server process was started")
        try:
            bundle.write_json("db-state.json", await evidence.database_state(await run.database()))
        except Exception as exc:
            bundle.not_applicable(
                "db-state.json", f"the database could not be read: {describe(exc)}"
            )
            record.fail(INFRASTRUCTURE, f"evidence: db-state: {describe(exc)}")
        await self._audit_export(bundle, run, record)

    async def _audit_export(
        self, bundle: evidence.Bundle, run: JourneyRun, record: _Record
    ) -> None:
        target = run.workdir / "audit-export.jsonl"
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "buildmax",
            "audit",
            "export",
            "--config",
            str(run.deployment.config_path),
            "--output",
            str(target),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **run.deployment.environment()},
        )
        out, _ = await process.communicate()
        if process.returncode == 0 and target.exists():
            bundle.write_text("audit.jsonl", target.read_text("utf-8"))
            return
        last = (out.decode("utf-8", "replace").strip().splitlines() or [""])[-1]
        if "no such table" in last or "pending migrations" in last or "not migrated" in last:
            bundle.not_applicable("audit.jsonl", f"the database holds no audit trail: {last}")
            return
        bundle.not_applicable("audit.jsonl", f"buildmax audit export failed: {last}")
        record.fail(HARNESS, f"evidence: audit export: exit {process.returncode}: {last}")

    def _result(self, outcome: Outcome, record: _Record) -> dict[str, Any]:
        return {**outcome.summary(), "bundle": None, "steps": record.steps, "checks": record.checks}

    @staticmethod
    def _junit(journey: Journey, engine: str, record: _Record, seconds: float) -> str:
        cases = [
            {
                "classname": f"{engine}.{journey.id}.steps",
                "name": s["step"],
                "outcome": "error",
                "message": s.get("error", ""),
            }
            for s in record.steps
            if s["outcome"] == "failed"
        ]
        outcomes = {"passed": "passed", "failed": "failure", "error": "error", "not run": "not run"}
        if record.failure is not None and record.failure[0] != PRODUCT and not cases:
            cases.append(
                {
                    "classname": f"{engine}.{journey.id}",
                    "name": "run",
                    "outcome": "error",
                    "message": record.failure[1],
                }
            )
        for c in record.checks:
            cases.append(
                {
                    "classname": f"{engine}.{journey.id}.{c['asserts']}",
                    "name": f"check[{c['check']}] {c['grader']}"
                    + (f": {c['name']}" if c["name"] else ""),
                    "outcome": outcomes[c["outcome"]],
                    "message": c.get("reason", ""),
                }
            )
        return evidence.junit(f"{engine}.{journey.id}", cases, seconds)

    def _manifest(
        self,
        bundle: evidence.Bundle,
        outcome: Outcome,
        journey: Journey | None,
        started: float,
        *,
        faults: Sequence[Any],
        server: Mapping[str, Any] | None,
    ) -> None:
        ended = time.time()
        manifest = {
            "journey": outcome.journey,
            "title": outcome.title,
            "journey_version": journey.version if journey else None,
            "journey_file": str(journey.path) if journey else None,
            "engine": outcome.engine,
            "status": outcome.status,
            "classification": outcome.classification,
            "reason": outcome.reason,
            "commit": self.source.commit,
            "dirty": self.source.dirty,
            "environment": evidence.environment_facts(),
            "packages": evidence.package_versions(),
            "server": dict(server) if server else None,
            "started_at": to_rfc3339(int(started * 1000)),
            "ended_at": to_rfc3339(int(ended * 1000)),
            "seconds": round(ended - started, 3),
            "faults_injected": [f.manifest() for f in faults],
            "isolation": "its own database and server processes, removed afterwards",
            "files": bundle.listing(),
        }
        bundle.write_json("manifest.json", manifest)


def load_journeys(
    paths: Sequence[Path], graders: Mapping[str, Any]
) -> list[Journey | tuple[Path, str]]:
    """Every journey file loaded, or ``(path, problem)`` for one that cannot be."""
    loaded: list[Journey | tuple[Path, str]] = []
    for path in paths:
        try:
            loaded.append(load_journey(path, graders, STEPS.__contains__))
        except JourneyFileError as exc:
            loaded.append((path, str(exc)))
    return loaded
