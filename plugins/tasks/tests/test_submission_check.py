"""``buildmax_submission_check`` and the submission's ``artifacts`` field.

Two throwaway plugins answer the hook the way a third party would: the
tasks plugin asks both before it records anything, and any refusal is a 422
``submission-refused`` naming every reason, with nothing written. The
artifacts a submission names are stored with it (migration 2 of the tasks
plugin) and shown wherever the submission is.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_hookspecs import TaskQueue, Verdict, hookimpl
from buildmax_tasks.tables import attempts, submission_artifacts, submissions

from buildmax.app import create_app
from buildmax.migrations import migrate
from buildmax.tables import schema_migrations
from buildmax.testing import without_plugins

from .conftest import PROBLEM


class SubmissionChecker:
    """Refuses a submission naming an artifact id it was told to refuse."""

    def __init__(self) -> None:
        #: artifact id -> reason
        self.refuse: dict[str, str] = {}
        #: (task, attempt, submission, actor) for every submission asked about.
        self.asked: list[tuple[Any, Any, Any, Any]] = []

    @hookimpl
    async def buildmax_submission_check(
        self, tx: Any, task: Any, attempt: Any, submission: Any, actor: Any
    ) -> Verdict | None:
        self.asked.append((task, attempt, submission, actor))
        reasons = [self.refuse[a] for a in submission.artifacts if a in self.refuse]
        return Verdict("deny", ", ".join(reasons)) if reasons else None


@pytest.fixture
def buildmax_settings(buildmax_settings):
    """No artifacts plugin: its own check would refuse the made-up ids."""
    return without_plugins(buildmax_settings, "artifacts")


@pytest.fixture
def checkers() -> tuple[SubmissionChecker, SubmissionChecker]:
    return SubmissionChecker(), SubmissionChecker()


@pytest.fixture
async def app(buildmax_settings, clock, checkers):
    first, second = checkers
    application = create_app(
        buildmax_settings,
        clock=clock,
        extra_plugins=[("checker-a", first), ("checker-b", second)],
        auto_migrate=True,
    )
    async with application.test_app():
        yield application


async def submit(work: Any, claim: dict[str, Any], expect: int, **body: Any) -> Any:
    return await work.report(claim, "submit", expect=expect, summary="done", **body)


async def test_a_refusal_records_nothing_and_names_every_reason(work, checkers, audit_log):
    """Each checker refuses one of the ids: 422 submission-refused with both
    reasons; no submission, the attempt still active, no event, no audit.
    Catches: the verdicts not looked at, or asked after the rows are written."""
    first, second = checkers
    first.refuse["af_1"] = "af_1 is not this task's"
    second.refuse["af_2"] = "af_2 was deleted"
    claim = await work.claim((await work.task())["id"])
    before = await work.snapshot()
    refused = await submit(work, claim, 422, artifacts=["af_1", "af_2", "af_3"])
    assert refused["type"] == PROBLEM + "submission-refused"
    assert sorted(refused["detail"].split("; ")) == ["af_1 is not this task's", "af_2 was deleted"]
    assert await work.snapshot() == before
    assert audit_log.of("attempt.submitted") == []
    assert [row["state"] for row in await work.rows(attempts)] == ["active"]
    # Both were asked; a plugin with no opinion does not refuse.
    assert len(first.asked) == len(second.asked) == 1
    second.refuse.clear()
    alone = await submit(work, claim, 422, artifacts=["af_1"])
    assert alone["detail"] == "af_1 is not this task's"


async def test_the_hook_sees_what_is_handed_in_and_the_artifacts_are_kept(work, checkers, app):
    """What the checkers are given is what is then recorded: the
    submission's id, its attempt and task, the artifacts in order, and who
    hands it in. The artifacts are shown by every view of the submission
    and by ``TaskQueue.submission``."""
    first, _ = checkers
    task = await work.task()
    claim = await work.claim(task["id"])
    named = ["af_b", "af_a", "af_c"]
    handed = await submit(work, claim, 201, artifacts=named, evidence={"checks": "green"})
    submission = handed["submission"]
    assert submission["artifacts"] == named and submission["evidence"] == {"checks": "green"}
    [(task_ref, attempt_ref, submission_ref, actor)] = first.asked
    assert (task_ref.id, attempt_ref.id, attempt_ref.state) == (
        task["id"],
        claim["attempt"]["id"],
        "active",
    )
    assert (submission_ref.id, submission_ref.artifacts) == (submission["id"], tuple(named))
    assert (submission_ref.attempt_id, submission_ref.generation) == (claim["attempt"]["id"], 1)
    assert actor.principal_id == work.agent.id and actor.scope_id == claim["attempt"]["id"]

    shown = await work.call("GET", f"/submissions/{submission['id']}", work.viewer, expect=200)
    listed = await work.call("GET", f"/tasks/{task['id']}/submissions", work.viewer, expect=200)
    [listed_one] = listed["items"]
    assert shown["artifacts"] == listed_one["artifacts"] == named
    [row] = await work.rows(submission_artifacts)
    assert json.loads(row["artifact_ids"]) == named
    queue = app.services.get(TaskQueue)
    async with app.db.read() as conn:
        ref = await queue.submission(conn, submission["id"])
    assert ref is not None and ref.artifacts == tuple(named)


async def test_a_submission_naming_no_artifact_stores_no_row_of_them(work, checkers):
    claim = await work.claim((await work.task())["id"])
    handed = await submit(work, claim, 201)
    assert handed["submission"]["artifacts"] == []
    assert await work.rows(submission_artifacts) == []
    assert checkers[0].asked[0][2].artifacts == ()


@pytest.mark.parametrize(
    ("artifacts", "message"),
    [
        ([f"af_{n}" for n in range(101)], "Longer than maximum length 100."),
        (["af_1", "af_1"], "Each artifact is named once."),
        ("af_1", "Not a valid list."),
    ],
)
async def test_the_artifacts_field_is_bounded_and_refused_whole(work, checkers, artifacts, message):
    claim = await work.claim((await work.task())["id"])
    before = await work.snapshot()
    refused = await submit(work, claim, 422, artifacts=artifacts)
    assert refused["type"] == PROBLEM + "validation-error"
    assert refused["errors"]["artifacts"] == [message]
    assert await work.snapshot() == before
    assert checkers[0].asked == []


async def test_an_empty_or_overlong_artifact_id_is_refused(work, checkers):
    claim = await work.claim((await work.task())["id"])
    for bad in ("", "a" * 65, 7):
        refused = await submit(work, claim, 422, artifacts=["af_ok", bad])
        assert list(refused["errors"]["artifacts"]) == ["1"], bad
    assert await work.rows(submissions) == []


async def test_submissions_made_before_migration_2_show_no_artifacts(work, app):
    """A database at tasks migration 1 has no table of submitted artifacts:
    start-up refuses it until migrated, and migration 2 keeps the earlier
    submissions, which then name no artifact."""
    claim = await work.claim((await work.task())["id"])
    handed = await submit(work, claim, 201)
    async with app.db.write() as tx:
        await tx.execute(sa.text("DROP TABLE task_submission_artifacts"))
        await tx.execute(sa.text("DROP TABLE task_search"))
        await tx.execute(
            sa.delete(schema_migrations).where(
                schema_migrations.c.plugin == "tasks", schema_migrations.c.version >= 2
            )
        )
    refused = create_app(app.settings, auto_migrate=False)
    with pytest.raises(Exception, match=r"pending migrations: tasks \(5\)"):
        async with refused.test_app():
            pass
    applied = await migrate(app.db, app.migrations(), app.clock)
    assert [(m.plugin, m.version) for m in applied] == [
        ("tasks", 2),
        ("tasks", 3),
        ("tasks", 4),
        ("tasks", 5),
        ("tasks", 6),
    ]
    shown = await work.call(
        "GET", f"/submissions/{handed['submission']['id']}", work.viewer, expect=200
    )
    assert shown["artifacts"] == []
