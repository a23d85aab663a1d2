"""Steps for the marketplace journeys (J09-J12): build a plugin release
archive, look at what landed on disk, corrupt a stored package behind the
server's back, and run the scripted agent of ``examples/agent_loop.py``.

Publishing itself goes through the public surface (a ``request`` step with
``content_file``, or ``buildmax catalog publish`` in a ``cli`` step); these
steps only do what a journey file cannot say.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
import tarfile
from pathlib import Path
from typing import Any

from buildmax_graders.run import JourneyRun, StepFailed
from buildmax_graders.steps import command_step

#: The example, from the repository root (``qualification/steps/`` is two levels down).
AGENT_LOOP = Path(__file__).resolve().parents[2] / "examples" / "agent_loop.py"

HOOKS_TOML = '[[hooks]]\nevent = "PreToolUse"\ncommand = "hooks/guard.sh --strict"\n'
HOOK_SCRIPT = "#!/bin/sh\nexit 0\n"


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def build_release(
    run: JourneyRun,
    *,
    path: str,
    name: str,
    version: str,
    skills: list[str] | None = None,
    hooks: bool = False,
    description: str = "",
) -> dict[str, Any]:
    """Write a release archive (``.tar.gz``) at ``path`` under the journey's
    directory: ``buildmax-plugin.toml`` naming ``name`` and ``version``, a
    ``README.md``, each skill's ``skills/<skill>/SKILL.md`` and a second file
    beside it, and with ``hooks`` a ``hooks/hooks.toml`` whose hook starts
    ``hooks/guard.sh`` (which makes the release need eligibility).

    Saves ``path``, ``sha256`` and ``size`` of the archive, and ``files``:
    every file's path inside the archive mapped to its sha256, so a journey
    can compare what materialization placed with what was published."""
    skills = list(skills if skills is not None else ["note"])
    manifest = f'name = "{name}"\nversion = "{version}"\n'
    if description:
        manifest += f"description = {json.dumps(description)}\n"
    manifest += f"[contributes]\nskills = {_toml_list(skills)}\n"
    if hooks:
        manifest += "hooks = true\n"
    files: dict[str, bytes] = {
        "buildmax-plugin.toml": manifest.encode(),
        "README.md": f"# {name} {version}\n".encode(),
    }
    for skill in skills:
        files[f"skills/{skill}/SKILL.md"] = f"# {skill}\n\nRelease {version} of {name}.\n".encode()
        files[f"skills/{skill}/checklist.txt"] = f"{name} {version} {skill}\n".encode()
    if hooks:
        files["hooks/hooks.toml"] = HOOKS_TOML.encode()
        files["hooks/guard.sh"] = HOOK_SCRIPT.encode()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for member, data in files.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            info.mode = 0o755 if member.endswith(".sh") else 0o644
            info.mtime = 0
            archive.addfile(info, io.BytesIO(data))
    data = buffer.getvalue()
    target = run.workdir / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    return {
        "path": path,
        "sha256": _sha256(data),
        "size": len(data),
        "files": {member: _sha256(content) for member, content in sorted(files.items())},
    }


async def tree(run: JourneyRun, *, root: str) -> dict[str, Any]:
    """Everything under ``root`` (a directory under the journey's
    directory): ``entries``, every file, directory and link as a relative
    path (directories end with ``/``, links with ``@``), sorted; ``files``,
    each regular file's sha256; ``exists``, whether ``root`` exists."""
    base = run.workdir / root
    entries: list[str] = []
    files: dict[str, str] = {}
    if base.is_dir():
        for dirpath, dirnames, filenames in os.walk(base):
            for name in [*dirnames, *filenames]:
                path = Path(dirpath) / name
                relative = path.relative_to(base).as_posix()
                if path.is_symlink():
                    entries.append(relative + "@")
                elif path.is_dir():
                    entries.append(relative + "/")
                else:
                    entries.append(relative)
                    files[relative] = _sha256(path.read_bytes())
    return {"exists": base.exists(), "entries": sorted(entries), "files": files}


async def corrupt_package(run: JourneyRun, *, sha256: str) -> dict[str, Any]:
    """Flip the last byte of the stored package whose digest is ``sha256``
    (``data/blobs/marketplace/sha256/<digest>`` of the journey's file blob
    store), behind the server's back: the bytes keep their size but no
    longer have the digest the catalog and every pin name. Recorded as an
    injected fault. Saves the blob's ``path`` and its ``sha256`` before and
    after."""
    blob = run.deployment.data_dir / "blobs" / "marketplace" / "sha256" / sha256
    if not blob.is_file():
        raise StepFailed(f"no stored package at {blob}")
    data = bytearray(blob.read_bytes())
    before = _sha256(bytes(data))
    data[-1] ^= 0xFF
    blob.write_bytes(bytes(data))
    run.inject(
        "tamper",
        f"flipped the last byte of the stored package marketplace/sha256/{sha256[:12]}…",
    )
    return {
        "path": str(blob.relative_to(run.workdir)),
        "sha256_before": before,
        "sha256_after": _sha256(bytes(data)),
    }


async def read_text(run: JourneyRun, *, path: str) -> str | None:
    """The text of ``path`` under the journey's directory (``null`` when
    there is no such file): a lock file, a result file."""
    target = run.workdir / path
    return target.read_text("utf-8") if target.is_file() else None


async def agent_loop(
    run: JourneyRun,
    *,
    space: str,
    actor: str,
    agent: str,
    workdir: str,
    flags: list[str] | None = None,
    expect_exit: int | str = 0,
    seconds: float = 120.0,
) -> dict[str, Any]:
    """Run ``examples/agent_loop.py --url ... --token ... --space SPACE
    --agent AGENT --workdir WORKDIR --json`` with ``flags``
    (``["--until-empty"]`` by default) as ``actor`` (its token from the
    run), in the journey's directory, with no ``BUILDMAX_*`` variable set.

    Saves ``exit``, ``output`` (stderr) and ``report``: the JSON summary the
    loop prints on stdout (``null`` when it printed none). An exit other
    than ``expect_exit`` (``"any"`` for no check) fails the step with the
    loop's last line; ``seconds`` bounds its run."""
    if not AGENT_LOOP.is_file():
        raise StepFailed(f"no agent loop at {AGENT_LOOP}")
    token = run.token(actor)
    if not token:
        raise StepFailed(f"no token for {actor!r}")
    argv = [
        str(AGENT_LOOP),
        "--url",
        run.url(),
        "--token",
        token,
        "--space",
        space,
        "--agent",
        agent,
        "--workdir",
        workdir,
        "--json",
        *(flags if flags is not None else ["--until-empty"]),
    ]
    done = await command_step(
        "agent_loop.py",
        [sys.executable, *argv],
        run,
        env={k: v for k, v in os.environ.items() if not k.startswith("BUILDMAX_")},
        seconds=seconds,
        expect_exit=expect_exit,
        merge_output=False,
    )
    try:
        report = json.loads(done.stdout) if done.stdout.strip() else None
    except ValueError:
        report = None
    return {"exit": done.status, "output": done.stderr, "report": report}
