"""``buildmax lesson`` and ``buildmax_lessons.client`` against a live server:
a lesson added, found by a stemmed search, shown with its provenance,
corrected, voted on and superseded, by command line and by typed client;
refusals as one line and exit code 1; answers the client does not trust.

Commands and the sync client run in worker threads because the live server
shares the test's event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import httpx
import pytest
from buildmax_lessons import commands
from buildmax_lessons.client import (
    MARK_END,
    MARK_START,
    AppliesTo,
    AsyncLessonsClient,
    InvalidLessonSource,
    LessonChanged,
    LessonsClient,
    LessonSuperseded,
    MalformedAnswer,
    Source,
)
from click.testing import CliRunner, Result

from buildmax.cli import _register_commands, cli
from buildmax.client import TOKEN_ENV, URL_ENV, AsyncClient, Client, ValidationError
from buildmax.commands.identity import SPACE_ENV
from buildmax.testing import PrincipalHandle

from .conftest import Lab

MARKS = (MARK_START, MARK_END)


@pytest.fixture(scope="module")
def buildmax_cli() -> click.Group:
    _register_commands()
    return cli


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for name in (URL_ENV, TOKEN_ENV, SPACE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


class Shell:
    """The lesson commands, run as one principal or another against a live server."""

    def __init__(self, buildmax_cli: click.Group, url: str, lab: Lab) -> None:
        self.cli, self.url, self.lab = buildmax_cli, url, lab

    async def run(
        self, who: PrincipalHandle, *args: str, input: str | None = None, color: bool = False
    ) -> Result:
        argv = [
            "lesson",
            *args,
            "--url",
            self.url,
            "--token",
            who.token,
            "--space",
            self.lab.space.slug,
        ]
        return await asyncio.to_thread(
            CliRunner().invoke, self.cli, argv, input=input, color=color, catch_exceptions=False
        )


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    for mark in MARKS:
        assert mark not in result.stdout and mark not in result.stderr
    return result


def refused(result: Result, *words: str) -> str:
    """The one ``error:`` line of a refused command (exit code 1)."""
    assert result.exit_code == 1, (result.stdout, result.stderr)
    (line,) = result.stderr.splitlines()
    assert line.startswith("error: ")
    for word in words:
        assert word in line, line
    return line


@pytest.fixture
def shell(buildmax_cli: click.Group, live_server: str, lab: Lab) -> Shell:
    return Shell(buildmax_cli, live_server, lab)


async def test_a_lesson_is_added_found_shown_corrected_voted_on_and_superseded(
    lab: Lab, shell: Shell, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = await lab.call(
        "POST", "/tasks", json={"project": "main", "title": "Deploy the shop"}, expect=201
    )
    added = ok(
        await shell.run(
            lab.agent,
            "add",
            "-",
            "--project",
            "main",
            "--kind",
            "gotcha",
            "--title",
            "Deploys hang behind migrations",
            "--task-kind",
            "code",
            "--path",
            "migrations/**",
            "--tag",
            "db",
            "--source",
            f"task:{task['id']}",
            "--source",
            "https://wiki.example/postmortem-12",
            "--json",
            input="The deploy fails when a migration waits for a lock.\nSet lock_timeout first.\n",
        )
    )
    made = json.loads(added.stdout)
    ident = made["id"]
    assert (
        made["text"]
        == "The deploy fails when a migration waits for a lock.\nSet lock_timeout first."
    )
    assert (made["collection"], made["kind"], made["revision"]) == ("project", "gotcha", 1)
    assert made["applies_to"] == {
        "task_kinds": ["code"],
        "paths": ["migrations/**"],
        "tags": ["db"],
    }
    assert made["sources"] == [
        {"type": "task", "id": task["id"]},
        {"type": "url", "url": "https://wiki.example/postmortem-12"},
    ]
    common = ok(
        await shell.run(
            lab.owner, "add", "--kind", "convention", "--title", "Run the linter", "--text", "x"
        )
    )
    assert "common (the space's collection)" in common.stdout

    # A stemmed search: "failing" finds "fails"; marks never reach the output.
    found = ok(await shell.run(lab.viewer, "search", "failing", "--project", "main"))
    first, snippet = found.stdout.splitlines()[:2]
    assert first.split()[:4] == [ident, "gotcha", "score", "0"]
    assert first.endswith("Deploys hang behind migrations")
    assert "[fails]" in snippet and snippet.startswith("    ")
    with monkeypatch.context() as terminal:
        terminal.setattr(commands, "styled", lambda: True)
        bold = ok(await shell.run(lab.viewer, "search", "failing", color=True))
    assert "\x1b[1mfails\x1b[0m" in bold.stdout and "[fails]" not in bold.stdout
    as_json = ok(await shell.run(lab.viewer, "search", '"waits for a lock"', "--json"))
    (hit,) = json.loads(as_json.stdout)
    assert hit["id"] == ident and MARK_START + "waits" in hit["match"]["snippet"]
    nothing = ok(await shell.run(lab.viewer, "search", "failing", "--project", "web"))
    assert nothing.stdout == "No lessons found.\n"

    shown = ok(await shell.run(lab.viewer, "show", ident)).stdout
    for fact in (
        f"lesson         {ident}",
        "kind           gotcha",
        f"project {made['project_id']}",
        "task kinds code; paths migrations/**; tags db",
        f"task:{task['id']}",
        "https://wiki.example/postmortem-12",
        f"author         {lab.agent.id}",
        "revision       1",
        "score 0: 0 helpful, 0 not helpful, 0 wrong (on revision 1)",
        "\n\nThe deploy fails when a migration waits for a lock.\nSet lock_timeout first.",
    ):
        assert fact in shown, (fact, shown)

    # A correction reads the current revision itself; a stale one is refused.
    fixed = ok(
        await shell.run(
            lab.agent2,
            "correct",
            ident,
            "--reason",
            "the timeout is set per session",
            "--text",
            "The deploy fails unless lock_timeout is set per session.",
            "--tag",
            "postgres",
        )
    ).stdout
    assert f"revision       2, corrected by {lab.agent2.id}: the timeout is set per session" in (
        fixed
    )
    assert "task kinds code; paths migrations/**; tags postgres" in fixed
    late = await shell.run(
        lab.owner, "correct", ident, "--revision", "1", "--reason", "late", "--title", "Other"
    )
    refused(late, "someone else corrected", ident, "revision 2", "not 1")
    # Read before another correction landed: the server's 409 says the same.
    real_show = LessonsClient.show
    with monkeypatch.context() as stale_read:
        stale_read.setattr(
            LessonsClient,
            "show",
            lambda self, space, lesson: dataclasses.replace(
                real_show(self, space, lesson), revision=1
            ),
        )
        raced = await shell.run(lab.owner, "correct", ident, "--reason", "late", "--title", "x")
    refused(raced, "someone else corrected", ident, "revision 2", "not 1")
    nothing_to_do = await shell.run(lab.owner, "correct", ident, "--reason", "no change")
    assert nothing_to_do.exit_code == 2 and "nothing to correct" in nothing_to_do.stderr
    history = ok(await shell.run(lab.viewer, "revisions", ident)).stdout.splitlines()
    assert [line.split()[0] for line in history] == ["revision", "2", "1"]

    voted = ok(await shell.run(lab.agent, "vote", ident, "helpful", "--note", "saved me"))
    assert f"Voted helpful on {ident} revision 2." in voted.stdout
    assert "score 1: 1 helpful, 0 not helpful, 0 wrong" in voted.stdout
    stale = await shell.run(lab.owner, "vote", ident, "not-helpful", "--revision", "1")
    refused(stale, "revision 2", "not 1")
    ok(await shell.run(lab.owner, "vote", ident, "not-helpful"))
    tally = ok(await shell.run(lab.viewer, "votes", ident, "--json"))
    assert sorted((v["principal_id"], v["vote"]) for v in json.loads(tally.stdout)) == sorted(
        [(lab.agent.id, "helpful"), (lab.owner.id, "not_helpful")]
    )

    newer = json.loads(
        ok(
            await shell.run(
                lab.agent,
                "add",
                "--project",
                "main",
                "--kind",
                "how-to",
                "--title",
                "Migrations: set a lock timeout per session",
                "--text",
                "SET lock_timeout before each migration; it fails fast.",
                "--json",
            )
        ).stdout
    )
    replaced = ok(
        await shell.run(lab.agent, "supersede", ident, "--by", newer["id"], "--reason", "merged")
    ).stdout
    assert f"superseded by  {newer['id']} at " in replaced and replaced.count(": merged") == 1
    assert f"supersedes     {ident}" in ok(await shell.run(lab.viewer, "show", newer["id"])).stdout
    default = ok(await shell.run(lab.viewer, "search", "fails"))
    assert ident not in default.stdout and newer["id"] in default.stdout
    every = ok(await shell.run(lab.viewer, "search", "fails", "--superseded", "include"))
    assert f"(superseded by {newer['id']})" in every.stdout
    again = await shell.run(lab.agent, "correct", ident, "--reason", "x", "--title", "y")
    refused(again, "lesson-superseded")

    assert [e["action"] for e in await lab.audit()] == [
        "lesson.created",
        "lesson.created",
        "lesson.corrected",
        "lesson.voted",
        "lesson.voted",
        "lesson.created",
        "lesson.superseded",
    ]


async def test_refused_input_is_one_clear_line_and_changes_nothing(lab: Lab, shell: Shell) -> None:
    add = ("add", "--kind", "note", "--title", "t")
    refused(await shell.run(lab.agent, *add, "--text", "a\x02b"), "422", "text")
    refused(
        await shell.run(lab.agent, *add, "--text", "x", "--project", "nope"),
        "404",
        "no such project",
    )
    refused(
        await shell.run(lab.agent, *add, "--text", "x", "--source", "task:tk_nope"),
        "invalid-lesson-source",
        "tk_nope",
    )
    refused(await shell.run(lab.viewer, *add, "--text", "x"), "403")
    too_long = "x" * 20_000 + "\n\nand more"
    refused(await shell.run(lab.agent, *add, "-", input=too_long), "422", "text")
    refused(await shell.run(lab.viewer, "search", "***"), "422", "at least one word")
    refused(await shell.run(lab.viewer, "show", "ls_nope"), "404")

    bad_source = await shell.run(lab.agent, *add, "--text", "x", "--source", "ftp://x")
    assert bad_source.exit_code == 2 and "task:ID, attempt:ID" in bad_source.stderr
    no_text = await shell.run(lab.agent, *add)
    assert no_text.exit_code == 2 and "--text TEXT, or FILE" in no_text.stderr
    bad_vote = await shell.run(lab.agent, "vote", "ls_x", "meh")
    assert bad_vote.exit_code == 2 and "helpful, not_helpful, wrong" in bad_vote.stderr
    assert await lab.rows() == {"lessons": [], "revisions": [], "votes": []}
    assert await lab.audit() == []


async def test_what_a_lesson_holds_never_drives_the_terminal(
    lab: Lab, shell: Shell, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = await lab.lesson(
        "Beware \x9b2J of escapes", "The CSI \x9b2J clears a screen; a tab\tstays."
    )
    shown = ok(await shell.run(lab.viewer, "show", made["id"])).stdout
    assert "\x9b" not in shown and "Beware \\x9b2J of escapes" in shown and "tab\tstays" in shown
    found = ok(await shell.run(lab.viewer, "search", "escapes")).stdout
    assert "\x9b" not in found and "\\x9b2J" in found
    as_json = ok(await shell.run(lab.viewer, "show", made["id"], "--json")).stdout
    assert "\x9b" not in as_json and json.loads(as_json)["title"] == made["title"]

    # A server that sends what the API never holds is not believed.
    real = Client.request

    def tampered(self: Client, method: str, path: str, *args: Any, **kw: Any) -> Any:
        answer = real(self, method, path, *args, **kw)
        if path.endswith(made["id"]):
            answer["title"] = "\x1b]0;owned\x07"
        return answer

    monkeypatch.setattr(Client, "request", tampered)
    line = refused(await shell.run(lab.viewer, "show", made["id"]), "malformed", "title")
    assert "\x1b" not in line


async def test_the_typed_client_pages_refuses_and_acts_once(lab: Lab, live_server: str) -> None:
    space = lab.space.slug
    task = await lab.call("POST", "/tasks", json={"project": "web", "title": "Cache"}, expect=201)

    def scenario(lessons: LessonsClient) -> dict[str, Any]:
        made = lessons.publish(
            space,
            "gotcha",
            "Cache keys carry the tenant",
            "Keys without the tenant leak between tenants.",
            project="web",
            applies_to=AppliesTo(task_kinds=("code",), tags=("cache",)),
            sources=[Source.parse(f"task:{task['id']}"), "https://example.test/cache"],
            idempotency_key="cache-keys-1",
        )
        again = lessons.publish(
            space,
            "gotcha",
            "Cache keys carry the tenant",
            "Keys without the tenant leak between tenants.",
            project="web",
            applies_to=AppliesTo(task_kinds=("code",), tags=("cache",)),
            sources=[Source.parse(f"task:{task['id']}"), "https://example.test/cache"],
            idempotency_key="cache-keys-1",
        )
        notes = [
            lessons.publish(space, "note", f"Tenant note {n}", "tenants leak", project="web").id
            for n in range(3)
        ]
        hits = list(lessons.search(space, "tenants", project="web", page_size=2))
        newest = list(itertools.islice(lessons.list(space, kind="note", page_size=1), 2))
        fixed = lessons.correct(space, made.id, 1, "clearer", title="Cache keys hold the tenant")
        with pytest.raises(LessonChanged) as changed:
            lessons.correct(space, made.id, 1, "late", title="Other")
        with pytest.raises(InvalidLessonSource):
            lessons.publish(space, "note", "t", "x", sources=["submission:sb_nope"])
        with pytest.raises(ValidationError):
            list(lessons.search(space, "***"))
        voted = lessons.vote(space, made.id, "wrong", note="it is the locale")
        gone = lessons.supersede(space, notes[0], made.id, "merged")
        with pytest.raises(LessonSuperseded):
            lessons.correct(space, gone.id, 1, "x", text="y")
        return {
            "made": made,
            "again": again,
            "hits": hits,
            "newest": newest,
            "fixed": fixed,
            "current": changed.value.current_revision,
            "voted": voted,
            "gone": gone,
            "notes": notes,
            "revisions": lessons.revisions(space, made.id),
            "votes": lessons.votes(space, made.id),
        }

    def work() -> dict[str, Any]:
        with Client(live_server, lab.agent.token, retries=0) as bmx:
            return scenario(LessonsClient(bmx))

    seen = await asyncio.to_thread(work)
    made = seen["made"]
    assert seen["again"] == made, "the same idempotency key made one lesson"
    assert made.sources == (
        Source("task", id=task["id"]),
        Source("url", url="https://example.test/cache"),
    )
    assert made.applies_to == AppliesTo(task_kinds=("code",), tags=("cache",))
    assert len(seen["hits"]) == 4 and len({h.id for h in seen["hits"]}) == 4
    assert {h.id for h in seen["hits"]} == {made.id, *seen["notes"]}
    for hit in seen["hits"]:
        assert hit.match is not None and "tenant" in {w.lower()[:6] for w in hit.match.words}
    assert [h.title for h in seen["newest"]] == ["Tenant note 2", "Tenant note 1"]
    assert (seen["fixed"].revision, seen["fixed"].title) == (2, "Cache keys hold the tenant")
    assert seen["current"] == 2
    assert seen["voted"].usefulness.score == -2
    assert seen["gone"].superseded_by == made.id
    assert [r.number for r in seen["revisions"]] == [2, 1]
    assert [(v.principal_id, v.vote, v.note) for v in seen["votes"]] == [
        (lab.agent.id, "wrong", "it is the locale")
    ]
    shown = await lab.call("GET", f"/lessons/{made.id}", expect=200)
    async with AsyncClient(live_server, lab.viewer.token, retries=0) as bmx:
        lessons = AsyncLessonsClient(bmx)
        current = await lessons.show(space, made.id)
        assert current.as_dict() == shown
        found = [
            hit async for hit in lessons.search(space, "tenant", common="exclude", page_size=1)
        ]
        assert {h.id for h in found} == {made.id, *seen["notes"][1:]}
        assert [r.number for r in await lessons.revisions(space, made.id)] == [2, 1]
        assert len(await lessons.votes(space, made.id)) == 1


# -- answers the client does not trust --------------------------------------------------


def _lesson(**changes: Any) -> dict[str, Any]:
    lesson: dict[str, Any] = {
        "id": "ls_1",
        "space_id": "sp_1",
        "project_id": None,
        "collection": "common",
        "kind": "gotcha",
        "title": "A title",
        "text": "A text",
        "applies_to": {"task_kinds": [], "paths": [], "tags": []},
        "sources": [],
        "revision": 1,
        "author_id": "pr_1",
        "revised_by": "pr_1",
        "correction_reason": "",
        "usefulness": {"helpful": 0, "not_helpful": 0, "wrong": 0, "score": 0},
        "superseded_by": None,
        "superseded_at": None,
        "superseded_reason": None,
        "supersedes": [],
        "created_at": "2024-01-01T00:00:00.000Z",
        "updated_at": "2024-01-01T00:00:00.000Z",
    }
    lesson.update(changes)
    return lesson


def _serving(answer: Callable[[httpx.Request], Any]) -> LessonsClient:
    def respond(request: httpx.Request) -> httpx.Response:
        body = answer(request)
        if isinstance(body, str):
            return httpx.Response(200, text=body, headers={"Content-Type": "text/html"})
        return httpx.Response(200, json=body)

    client = Client(
        "http://bmx.test", "bmx_fake", retries=0, transport=httpx.MockTransport(respond)
    )
    return LessonsClient(client)


@pytest.mark.engine_independent
@pytest.mark.parametrize(
    ("answer", "named"),
    [
        (_lesson(id="ls_2"), "not the lesson asked for"),
        (_lesson(title="\x1b[2Jhi"), "lesson.title holds a control character"),
        (_lesson(revision="1"), "lesson.revision is the string '1'"),
        (_lesson(revision=True), "lesson.revision is a boolean"),
        (_lesson(collection="project"), "lesson.collection"),
        (_lesson(sources=[{"type": "url", "url": "javascript:alert(1)"}]), "not an http(s) URL"),
        (_lesson(sources=[{"type": "task", "id": "../x"}]), "lesson.sources[0].id"),
        (_lesson(usefulness={"helpful": -1, "not_helpful": 0, "wrong": 0, "score": 0}), "helpful"),
        (_lesson(created_at="yesterday"), "not a time"),
        (_lesson(match={"snippet": "\x1b[31m", "relevance": 1}), "lesson.match.snippet"),
        ({k: v for k, v in _lesson().items() if k != "text"}, "lesson.text is missing"),
        ([_lesson()], "lesson is a list, not an object"),
        ("<html>a proxy's page</html>", "lesson is the string"),
    ],
)
def test_the_client_refuses_a_malformed_answer(answer: Any, named: str) -> None:
    lessons = _serving(lambda request: answer)
    with pytest.raises(MalformedAnswer) as caught:
        lessons.show("web", "ls_1")
    assert named in str(caught.value)


@pytest.mark.engine_independent
def test_the_client_refuses_malformed_pages() -> None:
    endless = _serving(lambda request: {"items": [_lesson()], "next_cursor": "c1"})
    with pytest.raises(MalformedAnswer, match="repeats an earlier page's"):
        list(endless.list("web"))
    for page, named in (
        ({"items": {"id": "ls_1"}, "next_cursor": None}, "page.items is an object"),
        ({"items": [_lesson()], "next_cursor": 7}, "page.next_cursor"),
        ({"items": [_lesson(), _lesson(kind=None)]}, "items[1].kind is null"),
    ):
        with pytest.raises(MalformedAnswer, match=named.replace("[", r"\[").replace("]", r"\]")):
            list(_serving(lambda request, page=page: page).search("web", "x"))
    shown = _serving(lambda request: _lesson(superseded_by="ls_3"))
    with pytest.raises(MalformedAnswer, match="superseded_by"):
        shown.supersede("web", "ls_1", "ls_2")


@pytest.mark.engine_independent
def test_sources_are_read_from_their_text() -> None:
    assert Source.parse("artifact:af_1") == Source("artifact", id="af_1")
    assert str(Source.parse("https://x.test/a?b=1")) == "https://x.test/a?b=1"
    for text in ("ftp://x", "task:", "lesson:ls_1", "task:a b", "https://"):
        with pytest.raises(ValueError, match="not a source"):
            Source.parse(text)


@pytest.mark.engine_independent
def test_help_explains_each_command_with_examples(buildmax_cli: click.Group) -> None:
    runner = CliRunner()
    group = runner.invoke(buildmax_cli, ["lesson", "--help"]).stdout
    for name in ("add", "search", "show", "correct", "supersede", "vote", "revisions", "votes"):
        assert f"\n  {name} " in group
    for name, example in (
        ("add", "buildmax lesson add --project shop --kind gotcha"),
        ("search", "buildmax lesson search '\"lock timeout\"' migration"),
        ("show", "buildmax lesson show ls_..."),
        ("correct", '--reason "not db-specific" --clear tags'),
        ("supersede", "--by ls_new..."),
        ("vote", "buildmax lesson vote ls_... helpful"),
    ):
        shown = runner.invoke(buildmax_cli, ["lesson", name, "--help"])
        assert shown.exit_code == 0 and example in shown.stdout, (name, shown.stdout)
        for option in ("--space SPACE", "--url URL", "--token TOKEN", "--json"):
            assert option in shown.stdout


@pytest.mark.engine_independent
def test_text_that_is_not_utf8_and_an_id_that_is_a_dot_are_one_line_errors(
    tmp_path: Path,
) -> None:
    """Refused before any request: no traceback, no server needed."""
    lesson_group = commands.lesson_group
    runner = CliRunner()
    where = ["--url", "http://127.0.0.1:9", "--token", "t", "--space", "s"]
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe")
    result = runner.invoke(
        lesson_group, ["add", "--kind", "note", "--title", "t", str(bad), *where]
    )
    assert result.exit_code == 1 and "not UTF-8 text" in result.output, result.output
    assert "Traceback" not in result.output
    for command in (["show", "."], ["vote", "..", "helpful"], ["supersede", "ls_a", "--by", "."]):
        result = runner.invoke(lesson_group, [*command, *where])
        assert result.exit_code == 2 and "is not a lesson id" in result.output, result.output
