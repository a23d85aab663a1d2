"""A scripted agent: claim work in a space, load its plugins, do it, hand it in.

One command, against a local server, as an agent principal that is a member
of the space::

    python examples/agent_loop.py --url http://127.0.0.1:8420 --token $TOKEN \
        --space myspace --agent myagent --workdir ./work --until-empty

Each round:

1. claims the next ready task assigned to the agent definition ``--agent``
   (``POST /v1/spaces/{space}/claims``); the server resolves the agent's
   plugins into exact pins (name, version, sha256) and skips tasks whose
   pins cannot be resolved;
2. with the claim's one-time token (scoped to the attempt), materializes
   the pinned plugin releases into ``WORKDIR/<attempt>/plugins/``, as
   ``buildmax run materialize`` does: each package's sha256 is checked
   before it is read, and a package that fails leaves no ``plugins/``;
3. reads the lessons the claim offers (``attempt.run_environment.lessons``:
   what agents learned before in this project and the space's common
   collection) into ``WORKDIR/<attempt>/lessons.md``, and does the
   (trivial) work: writes ``WORKDIR/<attempt>/result.txt`` naming the task,
   the attempt, every materialized plugin and the lessons it started with;
4. uploads ``result.txt`` as an artifact of the attempt (at its
   generation), with its sha256, and each file given with ``--attach``;
5. submits the attempt, naming the artifacts in the submission's
   ``artifacts`` (the server refuses an artifact that is not this task's),
   the first one carrying each ``--learn`` lesson in ``extensions.lessons``:
   they are committed with the submission (or not at all) and offered to
   the next claim in the project.

``--until-empty`` stops when no task is left for the agent; ``--max-tasks N``
stops after N tasks (waiting ``--poll-seconds`` for work when there is none,
unless ``--until-empty`` is given too). A task that cannot be done (a package
that fails verification, a refused upload or submission) has its attempt
marked failed with the reason, and the loop stops (``--keep-going``: goes
on with the next task).

Exit status:

- 0: every claimed task was submitted (possibly none: nothing to do);
- 1: a task failed; its attempt was marked failed with the reason;
- 2: the command line is wrong (``--help`` says how to call it);
- 3: the server could not be reached, or refused the agent itself
  (unknown token, not a member of the space, no such space or agent).

``--url`` and ``--token`` default to ``BUILDMAX_URL`` and ``BUILDMAX_TOKEN``
(then to the login file of ``buildmax login``), ``--space`` to
``BUILDMAX_SPACE``. ``--json`` prints a summary of what was done on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from buildmax_artifacts.client import ArtifactsClient
from buildmax_marketplace.materialize import MaterializationFailed, materialize
from buildmax_tasks.client import TasksClient

from buildmax.client import BuildMaxError, Client, Unreachable

EXIT_OK = 0
EXIT_TASK_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3

#: The file the work produces in each attempt's directory.
RESULT_NAME = "result.txt"
#: The file the offered lessons are written to, in each attempt's directory.
LESSONS_NAME = "lessons.md"


class TaskFailed(Exception):
    """A claimed task could not be done; its attempt was marked failed."""

    def __init__(self, task_id: str, attempt_id: str, reason: str) -> None:
        self.task_id = task_id
        self.attempt_id = attempt_id
        self.reason = reason
        super().__init__(f"task {task_id} (attempt {attempt_id}) failed: {reason}")


@dataclass
class Done:
    """One task handed in."""

    task: str
    attempt: str
    generation: int
    submission: str
    artifact: str
    sha256: str
    result: str
    plugins: list[dict[str, str]]
    #: The artifacts of the ``--attach`` files, in their order.
    attached: list[str] = field(default_factory=list)
    #: The ids of the lessons the claim offered.
    offered: list[str] = field(default_factory=list)
    #: How many lessons the submission carried.
    learned: int = 0


@dataclass
class Tally:
    """What the loop did."""

    submitted: list[Done] = field(default_factory=list)
    failed: list[dict[str, str]] = field(default_factory=list)
    skipped: int = 0

    def report(self, exit_code: int) -> dict[str, Any]:
        """The ``--json`` summary."""
        return {
            "submitted": [asdict(d) for d in self.submitted],
            "failed": self.failed,
            "skipped": self.skipped,
            "exit": exit_code,
        }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (argparse exits with status 2 on a mistake)."""
    parser = argparse.ArgumentParser(
        prog="agent_loop.py",
        description=(
            "Claim the tasks a BuildMax space assigns to an agent definition, one at a "
            "time: materialize the plugin releases pinned for each run, write a result "
            "file, upload it as an artifact of the attempt and submit. Exit status: 0 every "
            "claimed task submitted (or none to do), 1 a task failed (its attempt marked "
            "failed), 2 usage error, 3 server unreachable or the agent refused (token, "
            "membership, space, agent)."
        ),
        epilog=(
            "example: python examples/agent_loop.py --url http://127.0.0.1:8420 "
            "--token $TOKEN --space myspace --agent myagent --workdir ./work --until-empty"
        ),
    )
    parser.add_argument(
        "--url", help="the server's base URL (default: $BUILDMAX_URL, then the login file)"
    )
    parser.add_argument(
        "--token",
        help="the agent principal's API token (default: $BUILDMAX_TOKEN, then the login file)",
    )
    parser.add_argument(
        "--space",
        default=os.environ.get("BUILDMAX_SPACE"),
        help="the space's slug or id (default: $BUILDMAX_SPACE)",
    )
    parser.add_argument(
        "--agent",
        required=True,
        help="the agent definition (name or id) whose tasks to claim; its plugins are loaded",
    )
    parser.add_argument(
        "--workdir",
        required=True,
        type=Path,
        help="where each attempt gets a directory: WORKDIR/<attempt>/plugins/ and result.txt",
    )
    parser.add_argument(
        "--until-empty",
        action="store_true",
        help="stop when no task is left for the agent",
    )
    parser.add_argument(
        "--max-tasks",
        type=int,
        metavar="N",
        help="stop after N tasks (without --until-empty: wait for work until then)",
    )
    parser.add_argument(
        "--poll-seconds",
        type=float,
        default=2.0,
        metavar="S",
        help="how long to wait for work when there is none (default: 2)",
    )
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="after a failed task, go on with the next one (the exit status is still 1)",
    )
    parser.add_argument(
        "--attach",
        action="append",
        type=Path,
        default=[],
        metavar="FILE",
        help="also upload FILE as an artifact of every attempt and name it in the submission "
        "(repeatable)",
    )
    parser.add_argument(
        "--learn",
        action="append",
        default=[],
        metavar="TEXT",
        help="a lesson to publish with the first submission, in its task's project: its "
        "first line is the title, the rest its text (repeatable, at most 5)",
    )
    parser.add_argument(
        "--lease-seconds",
        type=int,
        metavar="S",
        help="the lease asked for each claim (default: the server's)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print a JSON summary of what was done on stdout"
    )
    args = parser.parse_args(argv)
    if not args.space:
        parser.error("--space is required (or set BUILDMAX_SPACE)")
    if not args.until_empty and args.max_tasks is None:
        parser.error("give --until-empty, --max-tasks N, or both")
    if args.max_tasks is not None and args.max_tasks < 1:
        parser.error("--max-tasks must be at least 1")
    if args.poll_seconds <= 0:
        parser.error("--poll-seconds must be positive")
    for path in args.attach:
        if not path.is_file():
            parser.error(f"--attach {path}: not a file")
    if len(args.learn) > 5:
        parser.error("--learn: a submission carries at most 5 lessons")
    if any(not text.strip() for text in args.learn):
        parser.error("--learn: a lesson needs a title")
    return args


def carried_lessons(texts: Sequence[str]) -> list[dict[str, Any]]:
    """``--learn`` texts as lessons a submission carries (``extensions.lessons``)."""
    lessons = []
    for text in texts:
        title, _, rest = text.strip().partition("\n")
        lessons.append({"kind": "note", "title": title[:200], "text": rest.strip() or title})
    return lessons


def lessons_text(offered: Sequence[dict[str, Any]]) -> str:
    """The offered lessons as Markdown, for the work to read."""
    if not offered:
        return "No lessons were offered for this task.\n"
    parts = []
    for lesson in offered:
        cut = " (shortened)" if lesson.get("truncated") else ""
        parts.append(
            f"## {lesson['title']}\n\n{lesson['kind']}, {lesson['collection']}, "
            f"lesson {lesson['id']} revision {lesson['revision']}{cut}\n\n{lesson['text']}\n"
        )
    return "\n".join(parts)


def result_text(
    task: dict[str, Any],
    attempt: dict[str, Any],
    pins: list[dict[str, Any]],
    offered: Sequence[dict[str, Any]] = (),
) -> str:
    """What the work produces: the task, the attempt, the plugins it ran
    with and the lessons it started with."""
    lines = [
        f"task {task['id']}: {task['title']}",
        f"attempt {attempt['id']} generation {attempt['generation']}",
        f"plugins: {len(pins)}",
    ]
    lines += [f"plugin {p['name']} {p['version']} {p['sha256']}" for p in pins]
    lines.append(f"lessons: {len(offered)}")
    lines += [f"lesson {lesson['id']} {lesson['title']}" for lesson in offered]
    return "\n".join(lines) + "\n"


def do_task(
    url: str | None,
    space: str,
    claim: dict[str, Any],
    workdir: Path,
    attach: Sequence[Path] = (),
    learn: Sequence[str] = (),
) -> Done:
    """Materialize, read the offered lessons, work, upload (the result and
    each ``attach`` file) and submit one claimed task, carrying the
    ``learn`` lessons, with the claim's run token; :class:`TaskFailed` (the
    attempt marked failed) when any of it is refused."""
    task, attempt = claim["task"], claim["attempt"]
    offered = list((attempt.get("run_environment") or {}).get("lessons") or [])
    home = workdir / attempt["id"]
    with Client(url, claim["token"]) as run:
        tasks = TasksClient(run)
        try:
            placed = materialize(run, attempt["id"], home)
            pins = [
                {"name": p["name"], "version": p["version"], "sha256": p["sha256"]}
                for p in placed.pins
            ]
            for name, variables in placed.unset_environment.items():
                print(
                    f"warning: {name} reads {', '.join(variables)}, not set here", file=sys.stderr
                )
            (home / LESSONS_NAME).write_text(lessons_text(offered), encoding="utf-8")
            result = home / RESULT_NAME
            result.write_text(result_text(task, attempt, pins, offered), encoding="utf-8")
            artifacts = ArtifactsClient(run)
            artifact = artifacts.upload(
                space,
                result,
                attempt=attempt["id"],
                generation=attempt["generation"],
                media_type="text/plain",
            )
            attached = [
                artifacts.upload(
                    space, path, attempt=attempt["id"], generation=attempt["generation"]
                )["id"]
                for path in attach
            ]
            handed_in = tasks.submit(
                space,
                attempt["id"],
                attempt["generation"],
                f"{RESULT_NAME} for {task['title']!r} with {len(pins)} plugin(s)",
                evidence={"plugins": pins},
                artifacts=[artifact["id"], *attached],
                extensions={"lessons": carried_lessons(learn)} if learn else None,
            )
        except (MaterializationFailed, BuildMaxError, OSError) as exc:
            reason = str(exc)
            try:
                tasks.fail(space, attempt["id"], attempt["generation"], reason[:1000])
            except BuildMaxError as refused:
                reason += f" (and marking the attempt failed was refused: {refused})"
            raise TaskFailed(task["id"], attempt["id"], reason) from None
    return Done(
        task=task["id"],
        attempt=attempt["id"],
        generation=attempt["generation"],
        submission=handed_in["submission"]["id"],
        artifact=artifact["id"],
        sha256=artifact["sha256"],
        result=str(result),
        plugins=pins,
        attached=attached,
        offered=[lesson["id"] for lesson in offered],
        learned=len(learn),
    )


def loop(args: argparse.Namespace, tally: Tally) -> int:
    """Claim and do tasks until the stop condition; the exit status."""
    status = EXIT_OK
    args.workdir.mkdir(parents=True, exist_ok=True)
    with Client(args.url, args.token) as agent:
        tasks = TasksClient(agent)
        while args.max_tasks is None or len(tally.submitted) + len(tally.failed) < args.max_tasks:
            claim = tasks.claim_next(args.space, agent=args.agent, lease_seconds=args.lease_seconds)
            tally.skipped += int(claim.get("skipped") or 0)
            if claim["task"] is None:
                if args.until_empty:
                    break
                time.sleep(args.poll_seconds)
                continue
            try:
                learn = () if tally.submitted else args.learn
                done = do_task(agent.url, args.space, claim, args.workdir, args.attach, learn)
            except TaskFailed as failed:
                print(f"error: {failed}", file=sys.stderr)
                tally.failed.append(
                    {"task": failed.task_id, "attempt": failed.attempt_id, "reason": failed.reason}
                )
                status = EXIT_TASK_FAILED
                if not args.keep_going:
                    break
                continue
            tally.submitted.append(done)
            names = ", ".join(f"{p['name']} {p['version']}" for p in done.plugins) or "no plugins"
            print(f"submitted {done.task} (attempt {done.attempt}, {names})", file=sys.stderr)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Run the loop; the exit status (see the module's docstring)."""
    args = parse_args(argv)
    tally = Tally()
    try:
        status = loop(args, tally)
    except Unreachable as exc:
        print(f"error: {exc}", file=sys.stderr)
        status = EXIT_UNAVAILABLE
    except BuildMaxError as exc:
        print(f"error: the server refused the agent: {exc}", file=sys.stderr)
        status = EXIT_UNAVAILABLE
    if args.json:
        print(json.dumps(tally.report(status), indent=2))
    else:
        print(
            f"{len(tally.submitted)} submitted, {len(tally.failed)} failed, "
            f"{tally.skipped} skipped by the server",
            file=sys.stderr,
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
