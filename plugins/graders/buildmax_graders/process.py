"""Commands the runner, its steps and graders start: run to the end within a
time limit, killed when they overstay it."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

#: ``buildmax`` as this interpreter runs it, whether or not its scripts are on PATH.
BUILDMAX = (sys.executable, "-m", "buildmax")


@dataclass(frozen=True)
class Finished:
    """A command that ended: its exit status and what it wrote (``stderr``
    is empty when it was merged into ``stdout``)."""

    status: int
    stdout: str
    stderr: str = ""

    @property
    def last_line(self) -> str:
        """The last line it wrote (stderr first): usually why it failed."""
        return ((self.stderr or self.stdout).strip().splitlines() or [""])[-1]


async def run_command(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    seconds: float | None = None,
    merge_output: bool = True,
) -> Finished:
    """Run ``argv`` to its end; ``TimeoutError`` after ``seconds``,
    the command killed and reaped."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=dict(env) if env is not None else None,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT if merge_output else asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), seconds)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return Finished(
        process.returncode, out.decode("utf-8", "replace"), (err or b"").decode("utf-8", "replace")
    )
