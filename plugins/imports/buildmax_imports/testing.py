"""A beads export to import in tests and qualification journeys: issues
with prerequisites, parents, related and discovered-from links, closed and
in-progress ones, a three-issue cycle and a link to an issue it does not
hold; the same for the same ``count`` and ``seed``."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The issues that wait for each other in a ring (10 for 12, 11 for 10, 12 for 11).
CYCLE = ("bd-10", "bd-11", "bd-12")
#: The issue with a link to an issue the export does not hold, and that issue.
BROKEN = ("bd-20", "bd-99999")


@dataclass
class Export:
    """The issues of an export, and what they hold of note."""

    issues: list[dict[str, Any]] = field(default_factory=list)

    @property
    def held(self) -> int:
        """How many are in progress (imported held)."""
        return sum(1 for issue in self.issues if issue["status"] == "in_progress")

    @property
    def closed(self) -> int:
        """How many are closed."""
        return sum(1 for issue in self.issues if issue["status"] == "closed")

    def write(self, path: Path) -> Path:
        """The issues as ``bd export`` writes them (a JSON object a line) at ``path``."""
        path.write_text("".join(json.dumps(issue) + "\n" for issue in self.issues))
        return path


def _issue(rng: random.Random, number: int, count: int) -> dict[str, Any]:
    roll = rng.random()
    status = "closed" if roll < 0.3 else "in_progress" if roll < 0.4 else "open"
    deps = [
        {"depends_on_id": f"bd-{rng.randrange(1, number)}", "type": "blocks"}
        for _ in range(rng.choice((0, 0, 1, 1, 2)))
        if number > 1
    ]
    if number > 10 and rng.random() < 0.2:
        deps.append({"depends_on_id": f"bd-{rng.randrange(1, 11)}", "type": "parent-child"})
    if rng.random() < 0.1:
        deps.append({"depends_on_id": f"bd-{rng.randrange(1, count + 1)}", "type": "related"})
    if number > 1 and rng.random() < 0.05:
        target = f"bd-{rng.randrange(1, number)}"
        deps.append({"depends_on_id": target, "type": "discovered-from"})
    issue: dict[str, Any] = {
        "id": f"bd-{number}",
        "title": f"Issue {number}: {rng.choice(['parse', 'render', 'store', 'ship'])} it",
        "description": f"What issue {number} is about.",
        "acceptance_criteria": f"Issue {number} is done when it works.",
        "status": status,
        "priority": rng.randrange(0, 5),
        "issue_type": rng.choice(["bug", "feature", "task", "chore"]),
        "labels": rng.sample(["ui", "db", "api", "docs"], rng.randrange(0, 3)),
        "created_at": "2026-01-02T03:04:05Z",
        "dependencies": deps,
    }
    if status == "closed":
        issue["close_reason"] = "done"
    return issue


def beads_export(count: int, seed: int = 25) -> Export:
    """An export of ``count`` issues (at least 20) ``bd-1`` to ``bd-<count>``."""
    if count < 20:
        raise ValueError("an export holds at least 20 issues (its cycle and broken link)")
    rng = random.Random(seed)
    issues = [_issue(rng, number, count) for number in range(1, count + 1)]
    first, second, third = (int(key.split("-")[1]) - 1 for key in CYCLE)
    issues[first]["dependencies"] = [{"depends_on_id": CYCLE[2], "type": "blocks"}]
    issues[second]["dependencies"] = [{"depends_on_id": CYCLE[0], "type": "blocks"}]
    issues[third]["dependencies"] = [{"depends_on_id": CYCLE[1], "type": "blocks"}]
    source, target = BROKEN
    issues[int(source.split("-")[1]) - 1]["dependencies"].append(
        {"depends_on_id": target, "type": "related"}
    )
    return Export(issues)
