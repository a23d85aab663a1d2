"""The scripted agent of ``examples/agent_loop.py`` with lessons: it starts
each task with the lessons its claim offers (``lessons.md``) and publishes
what it learned with its first submission."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from .conftest import Lab

_LOOP = Path(__file__).resolve().parents[3] / "examples" / "agent_loop.py"


def _agent_loop() -> Any:
    spec = importlib.util.spec_from_file_location("agent_loop_example", _LOOP)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


async def test_the_agent_loop_reads_offered_lessons_and_publishes_what_it_learned(
    lab: Lab, live_server: str, tmp_path: Path, capsys: Any
) -> None:
    await lab.call("POST", "/agents", json={"name": "bot", "plugins": []}, expect=201)
    for title in ("first task", "second task"):
        await lab.call(
            "POST", "/tasks", json={"project": "main", "title": title, "agent": "bot"}, expect=201
        )
    loop = _agent_loop()
    argv = [
        "--url",
        live_server,
        "--token",
        lab.agent.token,
        "--space",
        lab.space.id,
        "--agent",
        "bot",
        "--workdir",
        str(tmp_path),
        "--max-tasks",
        "2",
        "--until-empty",
        "--json",
        "--learn",
        "Pin the linter\nA moving linter version breaks unrelated reviews.",
    ]
    status = await asyncio.to_thread(loop.main, argv)
    summary = json.loads(capsys.readouterr().out)
    assert status == 0, summary
    first, second = summary["submitted"]
    assert (first["offered"], first["learned"]) == ([], 1)
    (published,) = await lab.search(q="linter")
    assert published["title"] == "Pin the linter"
    assert published["sources"][2] == {"type": "submission", "id": first["submission"]}
    assert (second["offered"], second["learned"]) == ([published["id"]], 0)
    notes, result, none = _read(
        tmp_path / second["attempt"] / "lessons.md",
        Path(second["result"]),
        tmp_path / first["attempt"] / "lessons.md",
    )
    assert "## Pin the linter" in notes and "A moving linter version" in notes
    assert f"lesson {published['id']} Pin the linter" in result
    assert "No lessons were offered" in none


def _read(*paths: Path) -> list[str]:
    return [path.read_text(encoding="utf-8") for path in paths]
