"""How a journey went: its result, and for a failure its classification and
the one reason a person reads first.

A journey passes, fails, is *not applicable* on an engine it does not
declare, or is *not built*. A failure is classified ``product`` (the server
did something the journey forbids or did not expect), ``harness`` (the
journey file, a step or a grader is at fault) or ``infrastructure``
(something around the product: a server that does not start, an
unreachable database, a missing tool).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PASSED, FAILED, NOT_APPLICABLE = "passed", "failed", "not applicable"
PRODUCT, HARNESS, INFRASTRUCTURE = "product", "harness", "infrastructure"

# Which failure is reported first when a journey has several: the setup
# before any step, then a server that died on its own (the likely cause of
# what follows), then the step that ended the steps, then the checks.
SETUP, SERVER_DIED, STEP, CHECK_FAILED, CHECK_ERROR, EVIDENCE = range(6)


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
class Record:
    """What one run of a journey gathered: each step's and check's outcome,
    and every failure with where it happened."""

    steps: list[dict[str, Any]] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    failures: list[tuple[int, str, str]] = field(default_factory=list)

    def fail(self, stage: int, classification: str, reason: str) -> None:
        """Note a failure at ``stage`` (``SETUP`` ... ``EVIDENCE``)."""
        self.failures.append((stage, classification, reason))

    def failed_at(self, stage: int) -> bool:
        """Whether anything failed at ``stage``."""
        return any(s == stage for s, _, _ in self.failures)

    @property
    def first_stage(self) -> int | None:
        """The stage of the failure reported first (``None``: none)."""
        return min(self.failures, key=lambda f: f[0])[0] if self.failures else None

    @property
    def verdict(self) -> tuple[str, str] | None:
        """``(classification, reason)`` of the failure reported first, or
        ``None`` for a pass. When a step crashed (a harness fault) and a
        check failed too, the reason names both: the crash may well be the
        product's doing."""
        if not self.failures:
            return None
        stage, classification, reason = min(self.failures, key=lambda f: f[0])
        if classification == HARNESS and stage == STEP:
            failed = [r for s, _, r in self.failures if s == CHECK_FAILED]
            if failed:
                reason += f"; first failing check: {failed[0]}"
        return classification, reason

    def interrupted(self, reason: str) -> None:
        """Mark the step or check that was running when time ran out."""
        for step in self.steps:
            if step["outcome"] == "running":
                step.update(outcome="failed", error=reason)
        for check in self.checks:
            if check["outcome"] == "running":
                check.update(outcome="error", reason=reason)
