"""One journey run: the values its steps saved, its deployment, the faults
it injected; what graders look at (a :class:`GradingContext`)."""

from __future__ import annotations

import time
import traceback
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from buildmax.clock import to_rfc3339
from buildmax.database import Database, open_database

from .deployment import Deployment
from .journey import Journey, render, resolve

#: Audit events read per page when a grader asks for the trail.
AUDIT_PAGE = 200


class StepFailed(Exception):
    """A step met an answer the journey did not expect: the product's fault."""


class HarnessError(Exception):
    """A step cannot run as the journey wrote it (a missing step module, a
    bad argument): the harness's fault."""


@dataclass(frozen=True)
class Fault:
    """A fault the journey injected, where, and what the step was doing."""

    fault: str
    injection_point: str
    step: str
    at: float = field(default_factory=time.time)

    def manifest(self) -> dict[str, Any]:
        """As the manifest records it."""
        return {
            "fault": self.fault,
            "injection_point": self.injection_point,
            "step": self.step,
            "at": to_rfc3339(int(self.at * 1000)),
        }


class JourneyRun:
    """The state of one journey on one engine while it runs and is graded."""

    def __init__(self, journey: Journey, deployment: Deployment, steps_dir: Path | None) -> None:
        self.journey = journey
        self.deployment = deployment
        self.workdir = deployment.workdir
        self.steps_dir = steps_dir
        self.values: dict[str, Any] = {
            "run": {"id": uuid.uuid4().hex[:8], "workdir": str(deployment.workdir)},
            "engine": deployment.engine,
        }
        self.minted: list[str] = []
        self.faults: list[Fault] = []
        self.current_step = "arrange"
        self._database: Database | None = None
        self._http: httpx.AsyncClient | None = None

    # -- what steps use --

    def save(self, name: str | None, value: Any) -> None:
        """Keep a step's result under ``name`` (nothing when ``None``)."""
        if name:
            self.values[name] = value

    def secret(self, value: str) -> str:
        """Remember a secret the journey minted (checked against the logs,
        redacted from the bundle)."""
        if value and value not in self.minted:
            self.minted.append(value)
        return value

    def inject(self, fault: str, injection_point: str) -> None:
        """Record a fault at the current step (the manifest lists it)."""
        self.faults.append(Fault(fault, injection_point, self.current_step))

    def token(self, actor: str | None) -> str | None:
        """The bearer token of ``actor``: ``admin`` (the bootstrap admin), a
        saved principal's name, or ``None``/``anonymous`` for none."""
        if actor in (None, "anonymous"):
            return None
        if actor == "admin":
            return self.deployment.admin_token
        return str(resolve(self.values, f"{actor}.token"))

    def url(self, server: int = 0) -> str:
        """A server process's base URL."""
        return self.deployment.servers[server].url

    @property
    def http(self) -> httpx.AsyncClient:
        """One HTTP client for the journey's plain requests."""
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=60.0)
        return self._http

    async def database(self) -> Database:
        """The journey's database, opened from outside the server the way
        the ``buildmax`` CLI opens it (graders read it; ``tamper`` writes it)."""
        if self._database is None:
            database = open_database(
                self.deployment.database_url, sqlite_readers=1, pg_pool=(1, 2), pg_read_pool=1
            )
            await database.connect()
            self._database = database
        return self._database

    async def close(self) -> None:
        """Release the HTTP client and the database engine."""
        if self._http is not None:
            await self._http.aclose()
            self._http = None
        if self._database is not None:
            await self._database.close()
            self._database = None

    # -- the GradingContext protocol --

    def value(self, ref: str) -> Any:
        return resolve(self.values, ref)

    def render(self, template: Any) -> Any:
        return render(self.values, template)

    async def scalar(self, sql: str, params: Mapping[str, Any] | None = None) -> Any:
        database = await self.database()
        async with database.read() as conn:
            return await conn.fetch_val(sa.text(sql), dict(params or {}))

    async def audit_events(self) -> Sequence[Mapping[str, Any]]:
        events: list[Mapping[str, Any]] = []
        params: dict[str, Any] = {"limit": AUDIT_PAGE}
        headers = {"Authorization": f"Bearer {self.deployment.admin_token}"}
        while True:
            answer = await self.http.get(self.url() + "/v1/audit", params=params, headers=headers)
            if answer.status_code != 200:
                raise StepFailed(f"GET /v1/audit: status {answer.status_code}: {answer.text[:200]}")
            page = answer.json()
            events.extend(page["items"])
            cursor = page.get("next_cursor")
            if not cursor:
                break
            params["cursor"] = cursor
        return sorted(events, key=lambda e: (e["chain"], e["seq"]))

    def server_log(self) -> str:
        return self.deployment.log()

    def secrets(self) -> Sequence[str]:
        return list(self.minted)

    def environment(self) -> Mapping[str, str]:
        return self.deployment.environment()


def describe(exc: BaseException) -> str:
    """One line for an exception: its type and message, and where it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"
