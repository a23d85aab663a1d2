"""A submission carries other plugins' data (``extensions``), committed with
it or not at all: the seam through which a plugin adds its own records to
the tasks plugin's hand-in without importing it or touching its tables.

A throwaway plugin takes ``notes`` the way a lessons plugin would: it
declares the name, refuses bad lessons in ``buildmax_submission_check`` and
writes its own rows in ``buildmax_attempt_submitted``, in the submit's
transaction.
"""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_hookspecs import Actor, App, Migration, TaskQueue, Transaction, Verdict, hookimpl
from buildmax_tasks.engine import StageError, stage_engine
from buildmax_tasks.schemas import MAX_SUBMISSION_EXTENSION_BYTES
from buildmax_tasks.tables import attempts, submissions

from buildmax.app import create_app
from buildmax.migrations import create_tables
from buildmax.problems import ValidationFailed

from .conftest import PROBLEM

metadata = sa.MetaData()
learned = sa.Table(
    "learned_lessons",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("submission_id", sa.String(64), nullable=False),
    sa.Column("text", sa.String(500), nullable=False),
)


class Lessons:
    """Takes ``extensions.notes``: a list of short texts."""

    def __init__(self) -> None:
        #: Refuse from buildmax_attempt_submitted (after writing) when a lesson says this.
        self.fail_on = "fail late"
        self.seen: list[Any] = []
        self.refs: list[Any] = []

    @hookimpl
    def buildmax_migrations(self) -> list[Migration]:
        return [Migration("notes", 1, "lessons learned", create_tables(learned))]

    @hookimpl
    def buildmax_submission_extensions(self) -> list[str]:
        return ["notes"]

    @hookimpl
    def buildmax_submission_check(self, submission: Any) -> Verdict | None:
        lessons = submission.extensions.get("notes") or []
        self.seen.append(dict(submission.extensions))
        self.refs.append(submission)
        if not isinstance(lessons, list) or not all(isinstance(t, str) for t in lessons):
            return Verdict("deny", "notes are a list of texts")
        return None

    @hookimpl
    async def buildmax_attempt_submitted(self, app: App, tx: Transaction, submission: Any) -> None:
        for text in submission.extensions.get("notes") or []:
            await tx.execute(learned.insert().values(submission_id=submission.id, text=text))
            if text == self.fail_on:
                raise ValidationFailed("a lesson was refused after the others were written")


@pytest.fixture
def lessons() -> Lessons:
    return Lessons()


@pytest.fixture
async def app(buildmax_settings, clock, lessons):
    application = create_app(
        buildmax_settings, clock=clock, extra_plugins=[("notes", lessons)], auto_migrate=True
    )
    async with application.test_app():
        yield application


async def submit(work: Any, claim: dict[str, Any], expect: int, **body: Any) -> Any:
    return await work.report(claim, "submit", expect=expect, summary="done", **body)


async def learned_rows(work: Any) -> list[tuple[str, str]]:
    return sorted((r["submission_id"], r["text"]) for r in await work.rows(learned))


async def test_two_lessons_are_committed_with_the_submission_and_not_kept_by_the_tasks_plugin(
    work, lessons, app
):
    claim = await work.claim((await work.task())["id"])
    two = ["run the migrations first", "the cache needs a warm-up"]
    handed = await submit(work, claim, 201, extensions={"notes": two})
    submission = handed["submission"]
    assert await learned_rows(work) == sorted((submission["id"], text) for text in two)
    assert lessons.seen == [{"notes": two}]
    # The tasks plugin keeps none of it: not in its row, not in its views.
    assert "extensions" not in submission
    queue = app.services.get(TaskQueue)
    async with app.db.read() as conn:
        kept = await queue.submission(conn, submission["id"])
    assert kept is not None and kept.extensions == {}


async def test_a_refused_submission_commits_no_lesson(work, lessons, audit_log):
    claim = await work.claim((await work.task())["id"])
    before = await work.snapshot()
    refused = await submit(work, claim, 422, extensions={"notes": ["fine", 7]})
    assert refused["type"] == PROBLEM + "submission-refused"
    assert refused["detail"] == "notes are a list of texts"
    assert await learned_rows(work) == []
    assert await work.snapshot() == before
    assert audit_log.of("attempt.submitted") == []


async def test_a_plugin_refusing_after_writing_rolls_back_its_lessons_and_the_submission(
    work, lessons
):
    claim = await work.claim((await work.task())["id"])
    before = await work.snapshot()
    late = await submit(work, claim, 422, extensions={"notes": ["kept?", "fail late"]})
    assert late["type"] == PROBLEM + "validation-error"
    assert await learned_rows(work) == []
    assert await work.snapshot() == before
    assert [row["state"] for row in await work.rows(attempts)] == ["active"]


async def test_data_for_a_name_no_plugin_takes_is_refused_before_anyone_is_asked(work, lessons):
    claim = await work.claim((await work.task())["id"])
    before = await work.snapshot()
    refused = await submit(
        work, claim, 422, extensions={"notes": ["ok"], "lesons": ["a typo loses nothing"]}
    )
    assert refused["type"] == PROBLEM + "validation-error"
    assert list(refused["errors"]["extensions"]) == ["lesons"]
    assert lessons.seen == []
    assert await learned_rows(work) == []
    assert await work.snapshot() == before


async def test_extensions_are_bounded_and_optional(work, lessons):
    claim = await work.claim((await work.task())["id"])
    big = ["x" * 1000] * (MAX_SUBMISSION_EXTENSION_BYTES // 1000 + 1)
    refused = await submit(work, claim, 422, extensions={"notes": big})
    assert "extensions" in refused["errors"]
    handed = await submit(work, claim, 201)
    assert lessons.seen == [{}]
    assert await learned_rows(work) == []
    assert [r["public_id"] for r in await work.rows(submissions)] == [handed["submission"]["id"]]


async def test_a_name_declared_by_two_plugins_stops_the_app(buildmax_settings, clock):
    app = create_app(
        buildmax_settings,
        clock=clock,
        extra_plugins=[("notes", Lessons()), ("more-notes", Lessons())],
    )
    with pytest.raises(StageError, match="'notes' is declared by both"):
        stage_engine(app)


async def test_the_data_is_read_only_for_the_hooks_and_null_is_a_value(work, lessons):
    claim = await work.claim((await work.task())["id"])
    await submit(work, claim, 201, extensions={"notes": None})
    (ref,) = lessons.refs
    assert ref.extensions == {"notes": None}
    with pytest.raises(TypeError):
        ref.extensions["injected"] = True  # type: ignore[index]


async def test_data_nested_past_what_json_encodes_is_refused_not_a_server_error(work, lessons):
    claim = await work.claim((await work.task())["id"])
    depth = 935
    raw = (
        '{"generation": 1, "summary": "s", "extensions": {"notes": '
        + "[" * depth
        + "]" * depth
        + "}}"
    )
    response = await work.client.post(
        f"{work.base}/attempts/{claim['attempt']['id']}/submit",
        data=raw,
        headers={"Authorization": f"Bearer {claim['token']}", "Content-Type": "application/json"},
    )
    assert response.status_code in (400, 422), await response.get_data()
    assert await work.rows(submissions) == []


async def test_a_hand_in_through_the_task_queue_carries_extensions_too(work, lessons, app):
    task = await work.task()
    claim = await work.claim(task["id"])
    agent = Actor(principal_id=work.agent.id, kind="agent", name=work.agent.name)
    queue = app.services.get(TaskQueue)
    with pytest.raises(ValidationFailed):
        async with app.db.write() as tx:
            await queue.hand_in(
                tx, task["id"], actor=agent, summary="s", candidate={}, extensions={"lesons": []}
            )
    async with app.db.write() as tx:
        handed = await queue.hand_in(
            tx,
            task["id"],
            actor=agent,
            summary="s",
            candidate={},
            generation=claim["attempt"]["generation"],
            extensions={"notes": ["from a job"]},
        )
    assert await learned_rows(work) == [(handed["submission_id"], "from a job")]


@pytest.mark.parametrize(
    ("declared", "why"),
    [("notes", "as a string"), ([""], "1 to 64 characters"), ([7], "1 to 64 characters")],
)
async def test_a_malformed_declaration_stops_the_app(buildmax_settings, clock, declared, why):
    class Odd:
        @hookimpl
        def buildmax_submission_extensions(self) -> Any:
            return declared

    app = create_app(buildmax_settings, clock=clock, extra_plugins=[("odd", Odd())])
    with pytest.raises(StageError, match=why):
        stage_engine(app)
