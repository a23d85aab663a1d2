"""The qualification runner: every journey on every engine against real
server processes, graded, each leaving an evidence bundle.

Only a failure fails the run; *not applicable* and *not built* are never
counted as passes (see :mod:`buildmax_graders.outcome`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
from buildmax_hookspecs import Grade

from buildmax.clock import to_rfc3339
from buildmax.database import DatabaseError, servers

from . import evidence
from .deployment import Deployment, InfrastructureError
from .journey import NOT_BUILT, Journey, JourneyFileError, load_journey
from .outcome import (
    CHECK_ERROR,
    CHECK_FAILED,
    EVIDENCE,
    FAILED,
    HARNESS,
    INFRASTRUCTURE,
    NOT_APPLICABLE,
    PASSED,
    PRODUCT,
    SERVER_DIED,
    SETUP,
    STEP,
    Outcome,
    Record,
)
from .process import BUILDMAX, run_command
from .run import JourneyRun, StepFailed, describe
from .steps import STEPS, check_step

#: Seconds the evidence of one journey may take to collect.
EVIDENCE_TIMEOUT = 300.0


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
        #: The journeys finished so far (all of them once ``run`` returns).
        self.outcomes: list[Outcome] = []

    @property
    def root(self) -> Path:
        """Where this commit's bundles go."""
        return self.output / self.source.commit

    async def run(
        self, starting: Callable[[str], None], finished: Callable[[Outcome], None]
    ) -> list[Outcome]:
        """Run everything; ``starting`` hears each journey as it starts
        (``"sqlite J03"``), ``finished`` its outcome."""
        try:
            for engine in self.engines:
                for journey in self.journeys:
                    name = journey.id if isinstance(journey, Journey) else journey[0].stem
                    starting(f"{engine} {name}")
                    outcome = await self._one(journey, engine)
                    self.outcomes.append(outcome)
                    finished(outcome)
        finally:
            with contextlib.suppress(DatabaseError):
                await self._drop_templates()
        return self.outcomes

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
        done = await run_command(
            [*BUILDMAX, "db", "migrate", "--database-url", url], cwd=Path.cwd()
        )
        if done.status != 0:
            failure = InfrastructureError(f"migrating the template failed: {done.stdout[-300:]}")
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
        try:
            return await self._run(journey, engine, outcome, started)
        except Exception as exc:  # the runner's own fault: still a bundle, never a crash
            outcome.status, outcome.classification = FAILED, HARNESS
            outcome.reason = f"the runner failed: {describe(exc)}"
            return self._static_bundle(outcome, journey, started)

    def _bundle_dir(self, journey_id: str, engine: str) -> Path:
        directory = self.root / engine / journey_id
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        return directory

    def _static_bundle(self, outcome: Outcome, journey: Journey | None, started: float) -> Outcome:
        """The bundle of a journey that did not run: manifest, result, and
        for a failure a JUnit file that shows it."""
        bundle = evidence.Bundle(self._bundle_dir(outcome.journey, outcome.engine))
        record = Record()
        if outcome.status == FAILED:
            record.fail(SETUP, outcome.classification or HARNESS, outcome.reason)
            bundle.write_text("junit.xml", self._junit(outcome, record))
            why = "the journey did not run"
        else:
            why = outcome.reason
        for name in evidence.BUNDLE_FILES[2:]:
            if name not in bundle.files:
                bundle.not_applicable(
                    name, why if outcome.status == NOT_APPLICABLE else f"{outcome.status}: {why}"
                )
        bundle.write_json("result.json", self._result(outcome, record))
        self._manifest(bundle, outcome, journey, started, faults=[], server=None)
        outcome.bundle = bundle.directory
        return outcome

    async def _run(
        self, journey: Journey, engine: str, outcome: Outcome, started: float
    ) -> Outcome:
        workdir = Path(tempfile.mkdtemp(prefix=f"bmq-{journey.id}-{engine}-"))
        deployment = Deployment(engine, workdir, journey.server, self.pg_server_url)
        run = JourneyRun(journey, deployment, self.steps_dir)
        record = Record()
        server: dict[str, Any] | None = None
        try:
            if await self._prepare(journey, deployment, record) and await self._start(
                journey, run, record
            ):
                try:
                    await asyncio.wait_for(
                        self._act_and_grade(journey, run, record), journey.timeout
                    )
                except TimeoutError:
                    why = f"{run.current_step}: no end after {journey.timeout:g} s"
                    record.interrupted(why)
                    record.fail(STEP, PRODUCT, why)
                for index, status in deployment.unexpected_exits():
                    record.fail(
                        SERVER_DIED,
                        PRODUCT,
                        f"server {index} exited with status {status} during the journey "
                        "without the journey stopping it",
                    )
            server = await self._server_facts(run)
            await deployment.stop()
            server["exit_statuses"] = deployment.exit_statuses()
            bundle = evidence.Bundle(
                self._bundle_dir(journey.id, engine),
                secrets=[*run.minted, *filter(None, [deployment.admin_token])],
            )
            try:
                await asyncio.wait_for(self._collect(bundle, run, record), EVIDENCE_TIMEOUT)
            except TimeoutError:
                record.fail(
                    EVIDENCE, INFRASTRUCTURE, f"evidence: no end after {EVIDENCE_TIMEOUT:g} s"
                )
        except asyncio.CancelledError:
            # Interrupted: a bundle without its manifest would mislead.
            shutil.rmtree(self.root / engine / journey.id, ignore_errors=True)
            raise
        finally:
            await deployment.stop()
            await run.close()
            with contextlib.suppress(DatabaseError):
                await deployment.discard()
            if not self.keep:
                shutil.rmtree(workdir, ignore_errors=True)
        verdict = record.verdict
        if verdict is not None:
            outcome.status = FAILED
            outcome.classification, outcome.reason = verdict[0], bundle.redact(verdict[1])
        outcome.seconds = time.time() - started
        bundle.write_json("result.json", self._result(outcome, record))
        bundle.write_text("junit.xml", self._junit(outcome, record))
        self._manifest(bundle, outcome, journey, started, faults=run.faults, server=server)
        outcome.bundle = bundle.directory
        return outcome

    async def _prepare(self, journey: Journey, deployment: Deployment, record: Record) -> bool:
        """The journey's database and config file; ``False`` when they
        cannot be made (the failure is recorded)."""
        try:
            if deployment.engine == "postgres" and journey.server.database == "template":
                deployment.template = await self._template()
            await deployment.prepare()
        except (InfrastructureError, DatabaseError, OSError) as exc:
            record.fail(SETUP, INFRASTRUCTURE, f"setup: {exc}")
            return False
        return True

    @staticmethod
    async def _start(journey: Journey, run: JourneyRun, record: Record) -> bool:
        """Start the servers unless a step will; ``False`` when they do not
        come up (the failure is recorded). Not part of the journey's time."""
        if not journey.server.start:
            return True
        run.current_step = "start"
        try:
            await run.deployment.start()
        except InfrastructureError as exc:
            record.fail(SETUP, INFRASTRUCTURE, f"start: {exc}")
            return False
        return True

    async def _act_and_grade(self, journey: Journey, run: JourneyRun, record: Record) -> None:
        for step in journey.steps:
            run.current_step = step.label
            entry: dict[str, Any] = {"step": step.label, "outcome": "running"}
            record.steps.append(entry)
            if not step.applies_to(run.deployment.engine):
                entry["outcome"] = "not applicable on this engine"
                continue
            began = time.monotonic()
            failure = await self._step(run, step, entry)
            entry["seconds"] = round(time.monotonic() - began, 3)
            if failure is not None:
                entry.update(outcome="failed", error=failure[1])
                record.fail(STEP, failure[0], f"{step.label}: {failure[1]}")
                if failure[0] == INFRASTRUCTURE:
                    return  # nothing to grade against
                break
            entry["outcome"] = "ok"
        for check in journey.checks:
            run.current_step = f"check[{check.index}] {check.grader_name}"
            entry = {
                "check": check.index,
                "name": check.name,
                "grader": check.grader_name,
                "asserts": check.asserts,
                "outcome": "running",
            }
            record.checks.append(entry)
            try:
                grade = await check.grader.grade(run)
                if not isinstance(grade, Grade) or not isinstance(grade.passed, bool):
                    raise TypeError(f"grader {check.grader_name!r} returned {grade!r}, not a Grade")
            except Exception as exc:
                entry.update(outcome="error", reason=describe(exc))
                record.fail(
                    CHECK_ERROR,
                    HARNESS,
                    f"check[{check.index}] {check.grader_name}: {describe(exc)}",
                )
                continue
            entry.update(
                outcome="passed" if grade.passed else "failed",
                reason=grade.reason,
                evidence=dict(grade.evidence),
            )
            if not grade.passed:
                record.fail(
                    CHECK_FAILED,
                    PRODUCT,
                    f"check[{check.index}] {check.grader_name}: {grade.reason}",
                )

    @staticmethod
    async def _step(run: JourneyRun, step: Any, entry: dict[str, Any]) -> tuple[str, str] | None:
        """Run one step; ``(classification, reason)`` when it fails."""
        try:
            run.save(step.spec.get("save"), await STEPS[step.kind](run, step.spec))
        except StepFailed as exc:
            return PRODUCT, str(exc)
        except httpx.TransportError as exc:
            return PRODUCT, f"the server did not answer: {describe(exc)}"
        except InfrastructureError as exc:
            return INFRASTRUCTURE, str(exc)
        except (ImportError, FileNotFoundError) as exc:
            return INFRASTRUCTURE, f"missing dependency: {describe(exc)}"
        except Exception as exc:  # a HarnessError, a missing saved value, a crash
            return HARNESS, describe(exc)
        return None

    async def _server_facts(self, run: JourneyRun) -> dict[str, Any]:
        facts: dict[str, Any] = {
            "version": run.deployment.server_version,
            "installed_kernel": evidence.kernel_version(),
            "processes": len(run.deployment.servers),
            "starts": [s.starts for s in run.deployment.servers],
            "config": run.deployment.config_path.name,
        }
        try:
            facts["database"] = await evidence.engine_version(await run.database())
        except Exception as exc:  # the database may be what failed
            facts["database"] = f"unknown ({describe(exc)})"
        return facts

    async def _collect(self, bundle: evidence.Bundle, run: JourneyRun, record: Record) -> None:
        deployment = run.deployment
        if any(s.starts for s in deployment.servers):
            bundle.write_text("server.log", deployment.log())
        else:
            bundle.not_applicable("server.log", "no server process was started")
        try:
            bundle.write_json(
                "db-state.json", await evidence.database_state(await run.database(), bundle.redact)
            )
        except Exception as exc:
            bundle.not_applicable(
                "db-state.json", f"the database could not be read: {describe(exc)}"
            )
            record.fail(EVIDENCE, INFRASTRUCTURE, f"evidence: db-state: {describe(exc)}")
        await self._audit_export(bundle, run, record)

    async def _audit_export(self, bundle: evidence.Bundle, run: JourneyRun, record: Record) -> None:
        target, config = run.workdir / "audit-export.jsonl", run.deployment.config_path
        done = await run_command(
            [*BUILDMAX, "audit", "export", "--config", str(config), "--output", str(target)],
            cwd=run.workdir,
            env={**os.environ, **run.deployment.environment()},
        )
        if done.status == 0 and target.exists():
            bundle.write_text("audit.jsonl", target.read_text("utf-8"))
            return
        last = done.last_line
        if not any(server.starts for server in run.deployment.servers):
            bundle.not_applicable("audit.jsonl", f"no server ever ran on the database: {last}")
            return
        bundle.not_applicable("audit.jsonl", f"buildmax audit export failed: {last}")
        record.fail(EVIDENCE, HARNESS, f"evidence: audit export: exit {done.status}: {last}")

    def _result(self, outcome: Outcome, record: Record) -> dict[str, Any]:
        return {**outcome.summary(), "bundle": None, "steps": record.steps, "checks": record.checks}

    @staticmethod
    def _junit(outcome: Outcome, record: Record) -> str:
        """One case per check and per failed step; a failed journey with
        no failing case gets one naming its failure, so no JUnit reader
        sees it green."""
        suite = f"{outcome.engine}.{outcome.journey}"
        cases = [
            {
                "classname": f"{suite}.steps",
                "name": s["step"],
                "outcome": "error",
                "message": s.get("error", ""),
            }
            for s in record.steps
            if s["outcome"] == "failed"
        ]
        outcomes = {"passed": "passed", "failed": "failure", "error": "error", "running": "error"}
        for c in record.checks:
            cases.append(
                {
                    "classname": f"{suite}.{c['asserts']}",
                    "name": f"check[{c['check']}] {c['grader']}"
                    + (f": {c['name']}" if c["name"] else ""),
                    "outcome": outcomes[c["outcome"]],
                    "message": c.get("reason", ""),
                }
            )
        verdict = record.verdict
        shown = record.first_stage in (STEP, CHECK_FAILED, CHECK_ERROR)
        if verdict is not None and not (shown and any(c["outcome"] != "passed" for c in cases)):
            cases.append(
                {
                    "classname": suite,
                    "name": "journey",
                    "outcome": "failure" if verdict[0] == PRODUCT else "error",
                    "message": f"[{verdict[0]}] {verdict[1]}",
                }
            )
        return evidence.junit(suite, cases, outcome.seconds)

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
    seen: dict[str, Path] = {}
    for path in paths:
        try:
            journey = load_journey(path, graders, STEPS.__contains__, check_step)
        except JourneyFileError as exc:
            loaded.append((path, str(exc)))
            continue
        if journey.id in seen:
            loaded.append((path, f"id {journey.id} is taken by {seen[journey.id].name}"))
            continue
        seen[journey.id] = path
        loaded.append(journey)
    return loaded
