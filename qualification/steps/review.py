"""Steps for the review journeys: run the scripted reviewer of
``examples/reviewer_loop.py`` against the journey's server, as a principal."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from buildmax_graders.run import JourneyRun, StepFailed
from buildmax_graders.steps import command_step

#: The example, from the repository root (``qualification/steps/`` is two levels down).
REVIEWER_LOOP = Path(__file__).resolve().parents[2] / "examples" / "reviewer_loop.py"


async def reviewer_loop(
    run: JourneyRun,
    *,
    space: str,
    actor: str,
    flags: list[str] | None = None,
    expect_exit: int | str = 0,
    timeout_seconds: float = 120.0,
) -> dict[str, Any]:
    """Run ``examples/reviewer_loop.py --url ... --token ... --space SPACE``
    with ``flags`` (``["--until-empty"]`` by default) as ``actor`` (its token
    from the run), in the journey's directory. Saves ``exit`` and ``output``
    (stdout and stderr together); an exit other than ``expect_exit`` (``"any"``
    for no check) fails the step with the loop's last line; the loop is
    killed after ``timeout_seconds``."""
    if not REVIEWER_LOOP.is_file():
        raise StepFailed(f"no reviewer loop at {REVIEWER_LOOP}")
    token = run.token(actor)
    if not token:
        raise StepFailed(f"no token for {actor!r}")
    argv = [
        str(REVIEWER_LOOP),
        "--url",
        run.url(),
        "--token",
        token,
        "--space",
        space,
        *(flags if flags is not None else ["--until-empty"]),
    ]
    done = await command_step(
        "reviewer_loop.py",
        [sys.executable, *argv],
        run,
        env={k: v for k, v in os.environ.items() if not k.startswith("BUILDMAX_")},
        seconds=timeout_seconds,
        expect_exit=expect_exit,
    )
    return {"exit": done.status, "output": done.stdout}
