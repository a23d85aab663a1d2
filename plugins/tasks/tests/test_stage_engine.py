"""The stage engine, driven by a stage plugin defined here, and the other
workflow hooks the tasks plugin calls.

``StagePlugin`` implements ``buildmax_workflow_stages`` (a two-slot
``check`` stage by default) and ``buildmax_attempt_submitted``: a linked work
item's submission carries ``candidate["decision"]`` (``approve``,
``changes`` or ``reject``); approvals are counted through the ``TaskQueue``
service and the stage passes once every slot approved. The same plugin
answers ``buildmax_claim_check``, ``buildmax_run_environment`` and
``buildmax_agent_revision`` as each test tells it to.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_hookspecs import (
    RunEnvironmentRefused,
    StageSpec,
    TaskQueue,
    Verdict,
    hookimpl,
)
from buildmax_tasks.search import rebuild
from buildmax_tasks.tables import (
    agent_plugins,
    agent_revisions,
    agents,
    attempts,
    projects,
    reservations,
    submissions,
    tasks,
)

from buildmax.app import create_app
from buildmax.spaces import put_member

CHECK = StageSpec("check", order=10, work_kind="review", slots=2, description="check it twice")


class StagePlugin:
    """A test-only workflow plugin (registered as ``stagetest``)."""

    def __init__(self, stages: list[StageSpec]) -> None:
        self.stages = stages
        self.app: Any = None
        #: (work item id, stage, outcome) for every verdict given.
        self.judged: list[tuple[str, str, str]] = []
        #: (task id, principal id) -> reason: claim checks that deny.
        self.vetoes: dict[tuple[str, str], str] = {}
        #: (task id, principal id) for every claim check asked.
        self.checked: list[tuple[str, str | None]] = []
        #: task id -> reason: run environments that cannot be resolved.
        self.refused: dict[str, str] = {}
        #: (attempt id, agent revision) for every run environment asked.
        self.environments: list[tuple[str, Any]] = []
        #: plugin name -> reason: agent revisions naming it are refused.
        self.banned_plugins: dict[str, str] = {}
        #: every agent revision validated.
        self.revisions: list[Any] = []
        #: (subject id, subject state, stage, work ids, actor id) per stage entered.
        self.entered: list[tuple[str, str, str, list[str], str | None]] = []
        #: when set, entering a stage raises it (the hand-in must roll back).
        self.enter_error: Exception | None = None
        #: when set, a judging hand-in waits here (bounded) after counting,
        #: so concurrent hand-ins overlap inside their transactions.
        self.rendezvous: asyncio.Barrier | None = None

    @hookimpl
    def buildmax_startup(self, app: Any) -> None:
        self.app = app

    @hookimpl
    def buildmax_workflow_stages(self) -> list[StageSpec]:
        return list(self.stages)

    @hookimpl
    def buildmax_stage_entered(
        self, tx: Any, subject: Any, stage: str, work: Any, actor: Any
    ) -> None:
        if self.enter_error is not None:
            raise self.enter_error
        ids = [item.id for item in work]
        self.entered.append((subject.id, subject.state, stage, ids, actor.principal_id))

    @hookimpl
    def buildmax_claim_check(self, tx: Any, task: Any, principal: Any) -> Verdict | None:
        self.checked.append((task.id, principal.principal_id))
        reason = self.vetoes.get((task.id, principal.principal_id))
        return Verdict("deny", reason) if reason else None

    @hookimpl
    async def buildmax_run_environment(
        self, tx: Any, attempt: Any, agent_revision: Any
    ) -> dict[str, Any]:
        self.environments.append((attempt.id, agent_revision))
        if attempt.task_id in self.refused:
            raise RunEnvironmentRefused(self.refused[attempt.task_id])
        return {
            "stagetest": {
                "image": "stagetest:1",
                "generation": attempt.generation,
                "agent_revision": agent_revision.id if agent_revision else None,
                "plugins": list(agent_revision.plugins) if agent_revision else [],
            }
        }

    @hookimpl
    def buildmax_agent_revision(
        self, tx: Any, space_id: str, revision: Any, actor: Any
    ) -> Verdict | None:
        self.revisions.append(revision)
        for name in revision.plugins:
            if name in self.banned_plugins:
                return Verdict("deny", self.banned_plugins[name])
        return None

    @hookimpl
    async def buildmax_attempt_submitted(
        self, tx: Any, task: Any, attempt: Any, submission: Any
    ) -> Verdict | None:
        if task.subject_task_id is None or task.stage not in {s.name for s in self.stages}:
            return None
        decision = submission.candidate.get("decision")
        if decision == "changes":
            verdict = Verdict(
                "changes",
                submission.candidate.get("reason", "changes requested"),
                finding_ids=tuple(submission.candidate.get("findings", ())),
            )
        elif decision == "reject":
            verdict = Verdict("reject", submission.candidate.get("reason", "rejected"))
        elif decision == "approve":
            queue = self.app.services.get(TaskQueue)
            slots = [
                w for w in await queue.linked_work(tx, task.submission_id) if w.stage == task.stage
            ]
            approvals = 0
            for item in slots:
                if item.state != "done":
                    continue
                handed_in = await queue.submissions(tx, item.id)
                if handed_in and handed_in[-1].candidate.get("decision") == "approve":
                    approvals += 1
            if self.rendezvous is not None:
                with contextlib.suppress(TimeoutError, asyncio.BrokenBarrierError):
                    await asyncio.wait_for(self.rendezvous.wait(), 1.0)
            verdict = Verdict("pass" if approvals == len(slots) else "pending")
        else:
            raise ValueError(f"no decision in {submission.candidate!r}")
        self.judged.append((task.id, task.stage, verdict.outcome))
        return verdict


@pytest.fixture
def stages() -> list[StageSpec]:
    return [CHECK]


@pytest.fixture
def stage_plugin(stages: list[StageSpec]) -> StagePlugin:
    return StagePlugin(stages)


@pytest.fixture
async def app(buildmax_settings, clock, stage_plugin):
    application = create_app(
        buildmax_settings,
        clock=clock,
        extra_plugins=[("stagetest", stage_plugin)],
        auto_migrate=True,
    )
    async with application.test_app():
        yield application


@pytest.fixture
async def reviewer(work, make_principal):
    """A third agent member of the work space."""
    who = await make_principal("agent")
    async with work.app.db.write() as tx:
        await put_member(tx, work.space.pk, who.pk, "member", work.app.clock.now_ms())
    return who


# -- helpers ------------------------------------------------------------------


async def hand_in(work: Any, claim: dict[str, Any], expect: int = 201, **candidate: Any) -> Any:
    """Submit a claimed attempt with its own token."""
    attempt = claim["attempt"]
    return await work.call(
        "POST",
        f"/attempts/{attempt['id']}/submit",
        claim["token"],
        json={"generation": attempt["generation"], "summary": "handed in", "candidate": candidate},
        expect=expect,
    )


async def linked_rows(work: Any, subject_id: str) -> list[dict[str, Any]]:
    subject = await work.task_row(subject_id)
    async with work.app.db.read() as conn:
        rows = await conn.fetch_all(
            sa.select(tasks).where(tasks.c.subject_task_id == subject["id"]).order_by(tasks.c.id)
        )
    return [dict(r) for r in rows]


async def submission_verdict(work: Any, submission_id: str) -> str | None:
    (row,) = await work.rows(submissions, submissions.c.public_id == submission_id)
    return row["verdict"]


async def submitted_subject(work: Any, **fields: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A task claimed and handed in by ``work.agent``: (task, submit body)."""
    subject = await work.task("the subject", **fields)
    claim = await work.claim(subject["id"])
    return subject, await hand_in(work, claim)


# -- pending, pass, changes, reject ---------------------------------------------


async def test_two_approvals_pass_the_stage_and_release_dependents(
    work, reviewer, stage_plugin, audit_log
):
    """buildmax_workflow_stages supplies a two-slot stage; buildmax_attempt_submitted
    answers pending after the first approval and pass after the second."""
    subject = await work.task("the subject")
    dependent = await work.task("after the subject", prerequisites=[subject["id"]])
    assert dependent["state"] == "open"
    claim = await work.claim(subject["id"])
    handed = await hand_in(work, claim)

    # The subject waits in the first stage; one work item per slot exists.
    assert handed["task"]["state"] == "waiting" and handed["task"]["stage"] == "check"
    assert handed["stage"] == "check" and len(handed["work_ids"]) == 2
    submission_id = handed["submission"]["id"]
    shown = await work.call("GET", f"/tasks/{subject['id']}", work.viewer, expect=200)
    assert shown["state"] == "waiting" and shown["stage_missing"] is False
    assert shown["current_submission_id"] == submission_id
    items = [await work.call("GET", f"/tasks/{w}", expect=200) for w in handed["work_ids"]]
    assert [(i["kind"], i["stage"], i["slot"], i["state"]) for i in items] == [
        ("review", "check", 0, "ready"),
        ("review", "check", 1, "ready"),
    ]
    assert {(i["subject_task_id"], i["submission_id"]) for i in items} == {
        (subject["id"], submission_id)
    }
    assert not any(i["human_only"] for i in items)
    assert await work.ready_ids() == handed["work_ids"]
    rows = await linked_rows(work, subject["id"])
    assert [(r["public_id"], r["slot"], r["stage"]) for r in rows] == [
        (handed["work_ids"][0], 0, "check"),
        (handed["work_ids"][1], 1, "check"),
    ]
    (entered,) = audit_log.of("task.stage_entered", subject["id"])
    assert entered.details == {"stage": "check", "work_ids": handed["work_ids"]}

    # First approval: pending. The subject keeps waiting, the dependent stays open.
    first = await work.claim(handed["work_ids"][0], work.agent2)
    approved = await hand_in(work, first, decision="approve")
    assert approved["task"]["state"] == "done"
    # Done stage work still says which stage and slot it was.
    assert (approved["task"]["stage"], approved["task"]["slot"]) == ("check", 0)
    assert await submission_verdict(work, approved["submission"]["id"]) == "pending"
    assert (await work.task_row(subject["id"]))["state"] == "waiting"
    assert (await work.task_row(dependent["id"]))["state"] == "open"
    assert stage_plugin.judged == [(handed["work_ids"][0], "check", "pending")]
    assert audit_log.of("task.done", subject["id"]) == []

    # Second approval: pass. No further stage: the subject is done and its
    # dependent ready.
    second = await work.claim(handed["work_ids"][1], reviewer)
    passed = await hand_in(work, second, decision="approve")
    assert await submission_verdict(work, passed["submission"]["id"]) == "pass"
    done = await work.call("GET", f"/tasks/{subject['id']}", expect=200)
    assert done["state"] == "done" and done["stage"] is None
    released = await work.call("GET", f"/tasks/{dependent['id']}", expect=200)
    assert released["state"] == "ready"
    assert await work.ready_ids() == [dependent["id"]]
    assert stage_plugin.judged[-1] == (handed["work_ids"][1], "check", "pass")
    assert len(audit_log.of("task.done", subject["id"])) == 1
    # Forbidden: no other work was created, nothing reopened or failed, the
    # subject's one attempt stayed its only one.
    assert len(await linked_rows(work, subject["id"])) == 2
    assert audit_log.of("task.reopened") == audit_log.of("task.failed") == []
    subject_pk = (await work.task_row(subject["id"]))["id"]
    assert [
        (a["generation"], a["state"])
        for a in await work.rows(attempts, attempts.c.task_id == subject_pk)
    ] == [(1, "submitted")]


async def test_changes_reopen_the_subject_with_findings_for_its_next_attempt(
    work, reviewer, stage_plugin, audit_log
):
    """A changes verdict cancels the other slot (ending its active attempt and
    token), reopens the subject with the finding ids, and the next attempt
    sees them; the old work stays attached to the old submission."""
    subject, handed = await submitted_subject(work)
    old_submission = handed["submission"]["id"]
    slot0, slot1 = handed["work_ids"]
    asking = await work.claim(slot0, work.agent2)
    busy = await work.claim(slot1, reviewer)

    changed = await hand_in(
        work, asking, decision="changes", findings=["F-1", "F-2"], reason="fix the tests"
    )
    assert changed["task"]["state"] == "done"
    assert await submission_verdict(work, changed["submission"]["id"]) == "changes"
    reopened = await work.call("GET", f"/tasks/{subject['id']}", expect=200)
    assert reopened["state"] == "ready" and reopened["stage"] is None
    assert reopened["finding_ids"] == ["F-1", "F-2"]
    assert subject["id"] in await work.ready_ids()
    (event,) = audit_log.of("task.reopened", subject["id"])
    assert event.details == {
        "stage": "check",
        "finding_ids": ["F-1", "F-2"],
        "reason": "fix the tests",
    }

    # The other slot was canceled with its active attempt; its hand-in is refused.
    other = await work.call("GET", f"/tasks/{slot1}", expect=200)
    assert other["state"] == "canceled" and other["outcome_reason"] == "fix the tests"
    (other_attempt,) = await work.rows(attempts, attempts.c.public_id == busy["attempt"]["id"])
    assert other_attempt["state"] == "canceled" and other_attempt["end_reason"] == "fix the tests"
    revoked = await hand_in(work, busy, expect=401, decision="approve")
    assert revoked["type"].endswith(":unauthenticated")
    refused = await hand_in(work, {**busy, "token": reviewer.token}, expect=409, decision="approve")
    assert refused["type"].endswith(":attempt-ended")
    assert len(await work.rows(submissions, submissions.c.attempt_id == other_attempt["id"])) == 0

    # The next attempt of the subject sees the findings.
    again = await work.claim(subject["id"])
    assert again["attempt"]["generation"] == 2
    assert again["task"]["finding_ids"] == ["F-1", "F-2"]
    seen = await work.call("GET", f"/tasks/{subject['id']}", again["token"], expect=200)
    assert seen["finding_ids"] == ["F-1", "F-2"]
    resubmitted = await hand_in(work, again)
    new_submission = resubmitted["submission"]["id"]
    assert new_submission != old_submission
    assert resubmitted["task"]["state"] == "waiting" and resubmitted["task"]["finding_ids"] == []

    # Old work stays attached to the old submission; new work to the new one.
    for old in (slot0, slot1):
        body = await work.call("GET", f"/tasks/{old}", expect=200)
        assert body["submission_id"] == old_submission
    for new in resubmitted["work_ids"]:
        body = await work.call("GET", f"/tasks/{new}", expect=200)
        assert (body["submission_id"], body["state"]) == (new_submission, "ready")
    queue = work.app.services.get(TaskQueue)
    async with work.app.db.read() as conn:
        old_work = await queue.linked_work(conn, old_submission)
        new_work = await queue.linked_work(conn, new_submission)
    assert [(w.id, w.state) for w in old_work] == [(slot0, "done"), (slot1, "canceled")]
    assert [w.id for w in new_work] == resubmitted["work_ids"]
    assert len(await linked_rows(work, subject["id"])) == 4
    assert audit_log.of("task.failed") == audit_log.of("task.done", subject["id"]) == []


async def test_reject_fails_the_subject_with_the_reason(work, stage_plugin, audit_log):
    """A reject verdict fails the subject with the plugin's reason, cancels
    the unfinished slot and never releases the subject's dependents."""
    subject = await work.task("the subject")
    dependent = await work.task("after the subject", prerequisites=[subject["id"]])
    claim = await work.claim(subject["id"])
    handed = await hand_in(work, claim)
    slot0, slot1 = handed["work_ids"]

    rejecting = await work.claim(slot0, work.agent2)
    rejected = await hand_in(work, rejecting, decision="reject", reason="out of scope")
    assert await submission_verdict(work, rejected["submission"]["id"]) == "reject"
    failed = await work.call("GET", f"/tasks/{subject['id']}", expect=200)
    assert failed["state"] == "failed" and failed["outcome_reason"] == "out of scope"
    assert failed["stage"] is None
    assert (await work.call("GET", f"/tasks/{slot1}", expect=200))["state"] == "canceled"
    assert (await work.task_row(dependent["id"]))["state"] == "open"
    assert await work.ready_ids() == []
    (event,) = audit_log.of("task.failed", subject["id"])
    assert event.details == {"reason": "out of scope"}
    assert stage_plugin.judged == [(slot0, "check", "reject")]
    # Forbidden: no done subject, no reopened subject, no new linked work.
    assert audit_log.of("task.done", subject["id"]) == []
    assert audit_log.of("task.reopened") == []
    assert len(await linked_rows(work, subject["id"])) == 2
    refused = await work.call(
        "POST", f"/tasks/{subject['id']}/claim", json={}, expect=409, problem="task-not-claimable"
    )
    assert refused["state"] == "failed"


# -- exactly once under concurrent hand-ins --------------------------------------


@pytest.mark.parametrize(
    "stages",
    [[CHECK, StageSpec("final", order=20, work_kind="integration", slots=1)]],
)
async def test_concurrent_last_approvals_advance_the_subject_exactly_once(
    work, reviewer, stage_plugin, audit_log
):
    """Both slots' approvals are handed in at the same moment: the subject
    moves to the next stage once, with exactly one set of its work.

    Mutation caught (PostgreSQL): with no lock on the subject row (drop
    ``for_update=True`` of the subject in ``StageEngine.submitted`` and the
    subject lock in ``attempts.fenced``) each hand-in counts only its own
    approval, both answer pending and the subject never leaves the stage.
    The kernel's event publication also serialises the writes of one space
    (it updates the space row before the verdict is asked), so the mutation
    goes red only with that serialisation taken out as well."""
    subject, handed = await submitted_subject(work)
    slot0, slot1 = handed["work_ids"]
    first = await work.claim(slot0, work.agent2)
    second = await work.claim(slot1, reviewer)
    barrier = asyncio.Barrier(2)
    stage_plugin.rendezvous = asyncio.Barrier(2)

    async def approve(claim: dict[str, Any]) -> Any:
        await barrier.wait()
        return await hand_in(work, claim, decision="approve")

    results = await asyncio.gather(approve(first), approve(second))
    verdicts = sorted([await submission_verdict(work, r["submission"]["id"]) for r in results])
    assert verdicts == ["pass", "pending"]

    moved = await work.call("GET", f"/tasks/{subject['id']}", expect=200)
    assert moved["state"] == "waiting" and moved["stage"] == "final"
    rows = await linked_rows(work, subject["id"])
    assert sorted((r["stage"], r["slot"], r["state"]) for r in rows) == [
        ("check", 0, "done"),
        ("check", 1, "done"),
        ("final", 0, "ready"),
    ]
    entered = audit_log.of("task.stage_entered", subject["id"])
    assert [e.details["stage"] for e in entered] == ["check", "final"]
    (final,) = [r for r in rows if r["stage"] == "final"]
    assert entered[1].details["work_ids"] == [final["public_id"]]
    assert final["kind"] == "integration"

    # The final stage's single approval completes the subject.
    closing = await work.claim(final["public_id"], work.agent2)
    await hand_in(work, closing, decision="approve")
    assert (await work.task_row(subject["id"]))["state"] == "done"
    assert len(audit_log.of("task.done", subject["id"])) == 1


# -- slots from the policy, the human slot ------------------------------------------


@pytest.mark.parametrize(
    "stages",
    [
        [
            StageSpec(
                "review",
                order=10,
                work_kind="review",
                slots="approvals_required",
                human_slot="human_review_required",
            )
        ]
    ],
)
async def test_slot_count_and_human_slot_come_from_the_project_policy(
    work, reviewer, stage_plugin, audit_log
):
    """``slots="approvals_required"`` takes the count from the current
    policy; ``human_slot`` makes slot 0 claimable by humans only (an agent's
    named claim is 403 claim-vetoed, claim-next skips it); a count of 0
    skips the stage."""
    # The default policy: one approval, no human review.
    _, handed = await submitted_subject(work)
    (only,) = handed["work_ids"]
    body = await work.call("GET", f"/tasks/{only}", expect=200)
    assert (body["slot"], body["human_only"]) == (0, False)
    await hand_in(work, await work.claim(only, work.agent2), decision="approve")

    # Three approvals, the first by a human.
    await work.call(
        "POST",
        "/projects/main/policy",
        json={"approvals_required": 3, "human_review_required": True},
        expect=201,
    )
    subject, handed = await submitted_subject(work)
    assert len(handed["work_ids"]) == 3
    items = [await work.call("GET", f"/tasks/{w}", expect=200) for w in handed["work_ids"]]
    assert [(i["slot"], i["human_only"]) for i in items] == [(0, True), (1, False), (2, False)]
    human_slot = handed["work_ids"][0]
    vetoed = await work.call(
        "POST",
        f"/tasks/{human_slot}/claim",
        work.agent2,
        json={},
        expect=403,
        problem="claim-vetoed",
    )
    assert "human" in vetoed["detail"]
    slot_row = await work.task_row(human_slot)
    assert (slot_row["state"], slot_row["generation"]) == ("ready", 0)
    assert await work.rows(attempts, attempts.c.task_id == slot_row["id"]) == []

    # Claim-next as an agent passes over the human slot and takes slot 1.
    taken = await work.call("POST", "/claims", work.agent2, json={}, expect=201)
    assert taken["task"]["id"] == handed["work_ids"][1] and taken["skipped"] == 1
    (claimed,) = audit_log.of("task.claimed", handed["work_ids"][1])
    assert claimed.details["skipped"] == 1

    # A human claims slot 0; three approvals pass the stage.
    human = await work.claim(human_slot, work.owner)
    third = await work.claim(handed["work_ids"][2], reviewer)
    await hand_in(work, human, decision="approve")
    await hand_in(work, taken, decision="approve")
    assert (await work.task_row(subject["id"]))["state"] == "waiting"
    await hand_in(work, third, decision="approve")
    assert (await work.task_row(subject["id"]))["state"] == "done"

    # No approvals required: the stage is skipped and submit completes the task.
    await work.call("POST", "/projects/main/policy", json={"approvals_required": 0}, expect=201)
    skipped, handed = await submitted_subject(work)
    assert handed["task"]["state"] == "done" and handed["work_ids"] == []
    assert await linked_rows(work, skipped["id"]) == []
    assert audit_log.of("task.stage_entered", skipped["id"]) == []


# -- a stage whose plugin is gone ------------------------------------------------


async def test_a_task_waiting_in_an_unloaded_stage_is_reported_not_completed(
    work, buildmax_settings, clock, audit_log
):
    """The same database served by an app without the stage plugin shows the
    waiting subject with ``stage_missing``; its linked work is shown the same
    way and cannot be claimed there (nobody would judge it), so nothing is
    completed or lost; new work skips the stage and is done on submit."""
    subject, handed = await submitted_subject(work)
    assert (await work.call("GET", f"/tasks/{subject['id']}", expect=200))["stage_missing"] is False

    bare = create_app(buildmax_settings, clock=clock, auto_migrate=True)
    async with bare.test_app():
        assert bare.plugins.pm.get_plugin("stagetest") is None
        other = dataclasses.replace(work, app=bare, client=bare.test_client())
        shown = await other.call("GET", f"/tasks/{subject['id']}", work.viewer, expect=200)
        assert shown["state"] == "waiting" and shown["stage"] == "check"
        assert shown["stage_missing"] is True
        listed = await other.call("GET", "/tasks?state=waiting", expect=200)
        assert [(t["id"], t["stage_missing"]) for t in listed["items"]] == [(subject["id"], True)]

        # Linked work of the missing stage is reported and refused, named or next.
        item = handed["work_ids"][0]
        shown = await other.call("GET", f"/tasks/{item}", work.viewer, expect=200)
        assert (shown["state"], shown["stage_missing"]) == ("ready", True)
        refused = await other.call(
            "POST",
            f"/tasks/{item}/claim",
            work.agent2,
            json={},
            expect=409,
            problem="stage-not-loaded",
        )
        assert "'check'" in refused["detail"]
        nothing = await other.call("POST", "/claims", work.agent2, json={}, expect=200)
        assert nothing["task"] is None and nothing["skipped"] == 2
        assert await work.attempts_of(item) == []
        still = await other.call("GET", f"/tasks/{subject['id']}", expect=200)
        assert (still["state"], still["stage_missing"]) == ("waiting", True)
        assert subject["id"] not in [t["id"] for t in (await other.call("GET", "/ready"))["items"]]

        # New work skips the unloaded stage: submit completes it.
        fresh = await other.task("after the stage went away")
        claim = await other.claim(fresh["id"], work.agent)
        done = await hand_in(other, claim)
        assert (done["task"]["state"], done["stage"], done["work_ids"]) == ("done", None, [])

    row = await work.task_row(subject["id"])
    assert (row["state"], row["stage"], row["outcome_reason"]) == ("waiting", "check", None)
    assert audit_log.of("task.done", subject["id"]) == []
    assert audit_log.of("task.failed", subject["id"]) == []


# -- claim checks -------------------------------------------------------------------


async def test_a_claim_check_veto_refuses_a_named_claim_and_claim_next_skips_it(
    work, stage_plugin, audit_log
):
    """buildmax_claim_check denying (task, principal): a named claim answers
    403 claim-vetoed with the plugin's reason and writes nothing; claim-next
    passes over it (counted in ``skipped``); another principal may claim it."""
    vetoed = await work.task("not for agent", priority=10)
    other = await work.task("anyone", priority=0)
    stage_plugin.vetoes[(vetoed["id"], work.agent.id)] = "you wrote the spec"

    refused = await work.call(
        "POST",
        f"/tasks/{vetoed['id']}/claim",
        json={},
        expect=403,
        problem="claim-vetoed",
        who=work.agent,
    )
    assert refused["detail"] == "you wrote the spec"
    assert (vetoed["id"], work.agent.id) in stage_plugin.checked
    row = await work.task_row(vetoed["id"])
    assert (row["state"], row["generation"], row["current_attempt_id"]) == ("ready", 0, None)
    assert await work.rows(attempts) == []
    assert audit_log.of("task.claimed") == []

    taken = await work.call("POST", "/claims", work.agent, json={}, expect=201)
    assert taken["task"]["id"] == other["id"] and taken["skipped"] == 1
    (event,) = audit_log.of("task.claimed")
    assert (event.target_id, event.details["skipped"]) == (other["id"], 1)
    assert (await work.task_row(vetoed["id"]))["generation"] == 0
    (attempt,) = await work.rows(attempts)
    assert attempt["task_id"] == (await work.task_row(other["id"]))["id"]

    # Vetoed for that claimant only.
    allowed = await work.claim(vetoed["id"], work.agent2)
    assert allowed["attempt"]["generation"] == 1


# -- run environments ---------------------------------------------------------------


async def test_the_run_environment_is_recorded_on_the_attempt(work, stage_plugin, audit_log):
    """buildmax_run_environment's answer is what the attempt records."""
    task = await work.task("run me")
    before = len(audit_log.events)
    claim = await work.claim(task["id"])
    expected = {
        "stagetest": {
            "image": "stagetest:1",
            "generation": 1,
            "agent_revision": None,
            "plugins": [],
        }
    }
    assert claim["attempt"]["run_environment"] == expected
    (row,) = await work.rows(attempts, attempts.c.public_id == claim["attempt"]["id"])
    assert json.loads(row["run_environment"]) == expected
    shown = await work.call(
        "GET", f"/attempts/{claim['attempt']['id']}", claim["token"], expect=200
    )
    assert shown["run_environment"] == expected
    assert stage_plugin.environments == [(claim["attempt"]["id"], None)]
    assert [e.action for e in audit_log.events[before:]] == ["task.claimed"]


async def test_an_unresolvable_run_environment_creates_no_attempt(work, stage_plugin, audit_log):
    """RunEnvironmentRefused: a named claim answers 422 naming the cause and
    leaves no attempt and no reservation; claim-next skips the candidate and
    claims the next, whose resources alone are reserved."""
    stuck = await work.task("cannot run", priority=10, resources=["repo:https://x.test/r@main"])
    other = await work.task("can run", priority=0, resources=["path:r/src/"])
    stage_plugin.refused[stuck["id"]] = "plugin lint is not active in this space"

    refused = await work.call(
        "POST",
        f"/tasks/{stuck['id']}/claim",
        work.agent,
        json={},
        expect=422,
        problem="run-environment-unresolved",
    )
    assert "plugin lint is not active in this space" in refused["detail"]
    row = await work.task_row(stuck["id"])
    assert (row["state"], row["generation"], row["current_attempt_id"]) == ("ready", 0, None)
    assert await work.rows(attempts) == []
    assert await work.rows(reservations) == []
    assert audit_log.of("task.claimed") == []

    taken = await work.call("POST", "/claims", work.agent, json={}, expect=201)
    assert taken["task"]["id"] == other["id"] and taken["skipped"] == 1
    held = await work.rows(reservations)
    assert [(r["resource"], r["attempt_public_id"]) for r in held] == [
        ("path:r/src/", taken["attempt"]["id"])
    ]
    (only,) = await work.rows(attempts)
    assert only["public_id"] == taken["attempt"]["id"]
    assert (await work.task_row(stuck["id"]))["generation"] == 0
    (event,) = audit_log.of("task.claimed")
    assert event.details["skipped"] == 1


# -- agent revisions ----------------------------------------------------------------


async def test_agent_revisions_are_validated_and_reach_the_run_environment(
    work, stage_plugin, audit_log
):
    """buildmax_agent_revision denying answers 422 agent-revision-refused and
    saves nothing; an accepted revision is saved and handed to
    buildmax_run_environment as ``agent_revision`` when a task assigned to the
    agent is claimed."""
    stage_plugin.banned_plugins["shady"] = "shady is not in the catalog"

    refused = await work.call(
        "POST",
        "/agents",
        json={"name": "rogue", "plugins": ["shady"]},
        expect=422,
        problem="agent-revision-refused",
    )
    assert refused["detail"] == "shady is not in the catalog"
    assert await work.rows(agents) == []
    assert await work.rows(agent_revisions) == []
    assert audit_log.of("agent.revised") == []

    made = await work.call(
        "POST", "/agents", json={"name": "coder", "plugins": ["lint"]}, expect=201
    )
    first = made["revision"]
    assert (first["number"], first["plugins"]) == (1, ["lint"])
    refused = await work.call(
        "POST",
        "/agents/coder/revisions",
        json={"instructions": "worse", "plugins": ["lint", "shady"]},
        expect=422,
        problem="agent-revision-refused",
    )
    (agent_row,) = await work.rows(agents)
    saved = await work.rows(agent_revisions, agent_revisions.c.agent_id == agent_row["id"])
    assert [r["public_id"] for r in saved] == [first["id"]]
    assert agent_row["current_revision_id"] == saved[0]["id"]
    assert {r["plugin"] for r in await work.rows(agent_plugins)} == {"lint"}

    revised = await work.call(
        "POST",
        "/agents/coder/revisions",
        json={"instructions": "be careful", "plugins": ["lint", "format"], "expected_revision": 1},
        expect=201,
    )
    second = revised["revision"]
    assert (second["number"], second["plugins"]) == (2, ["format", "lint"])
    validated = stage_plugin.revisions[-1]
    assert (validated.id, validated.number, validated.plugins) == (
        second["id"],
        2,
        ("format", "lint"),
    )
    assert validated.space_id == work.space.id and validated.agent_name == "coder"
    saved = await work.rows(agent_revisions, agent_revisions.c.agent_id == agent_row["id"])
    assert sorted(r["number"] for r in saved) == [1, 2]
    assert [e.details for e in audit_log.of("agent.revised")] == [
        {"revision": 1, "plugins": ["lint"]},
        {"revision": 2, "plugins": ["format", "lint"]},
    ]

    task = await work.task("assigned", agent="coder")
    claim = await work.claim(task["id"])
    assert claim["attempt"]["agent_revision_id"] == second["id"]
    ((attempt_id, seen),) = stage_plugin.environments
    assert attempt_id == claim["attempt"]["id"]
    assert (seen.id, seen.agent_name, seen.number, seen.plugins, seen.instructions) == (
        second["id"],
        "coder",
        2,
        ("format", "lint"),
        "be careful",
    )
    assert claim["attempt"]["run_environment"]["stagetest"]["agent_revision"] == second["id"]
    (row,) = await work.rows(attempts)
    revision_pk = next(r["id"] for r in saved if r["number"] == 2)
    assert row["agent_revision_id"] == revision_pk
    (event,) = audit_log.of("task.claimed")
    assert event.details["agent_revision_id"] == second["id"]


# -- stage entered ------------------------------------------------------------------


async def test_a_stage_plugin_hears_of_the_work_it_gets_and_can_refuse_it(
    work, stage_plugin, audit_log
):
    """``buildmax_stage_entered`` names the waiting subject, the stage, its
    new work items and who handed in; raising there rolls the hand-in back."""
    subject, handed = await submitted_subject(work)
    assert stage_plugin.entered == [
        (subject["id"], "waiting", "check", handed["work_ids"], work.agent.id)
    ]

    from buildmax.problems import Conflict

    stage_plugin.enter_error = Conflict("the stage cannot take work now")
    other = await work.task("refused by the stage")
    claim = await work.claim(other["id"])
    before = await work.snapshot()
    refused = await hand_in(work, claim, expect=409)
    assert refused["detail"] == "the stage cannot take work now"
    after = await work.snapshot()
    assert after == before
    assert len(stage_plugin.entered) == 1


async def test_the_queue_answers_a_projects_policy_by_its_public_id(work):
    """The policy the seam hands other plugins: the defaults before any
    revision, the latest revision after one, LookupError for no project."""
    queue = work.app.services.get(TaskQueue)
    project = await work.call("GET", "/projects/main", work.viewer, expect=200)
    async with work.app.db.read() as conn:
        before = dict(await queue.policy(conn, project["id"]))
    assert (before["revision"], before["approvals_required"]) == (0, 1)
    await work.call("POST", "/projects/main/policy", json={"approvals_required": 2}, expect=201)
    async with work.app.db.read() as conn:
        after = dict(await queue.policy(conn, project["id"]))
        with pytest.raises(LookupError):
            await queue.policy(conn, "pj_nosuchproject")
    assert (after["revision"], after["approvals_required"]) == (1, 2)


async def test_a_policy_read_again_after_its_revision_in_one_transaction_is_the_new_one(work):
    """A transaction remembers the policies it read (a hand-in and the
    reviews plugin read the same one), and forgets them when it revises one.

    Catches: the remembered policy kept after the revision."""
    from buildmax_hookspecs import Actor
    from buildmax_tasks.change import Change
    from buildmax_tasks.engine import current_policy, policy_of_project
    from buildmax_tasks.projects import revise_policy

    project = await work.call("GET", "/projects/main", work.viewer, expect=200)
    owner = Actor(principal_id=work.owner.id, kind="human", name="owner")
    async with work.app.db.write() as tx:
        ch = Change(work.app, tx, owner, work.space.pk, work.space.id, work.app.clock.now_ms())
        by_id = await policy_of_project(tx, project["id"])
        assert by_id is not None and by_id["revision"] == 0
        pk = await tx.fetch_val(
            sa.select(projects.c.id).where(projects.c.public_id == project["id"])
        )
        assert (await current_policy(tx, pk))["revision"] == 0
        revised = {"approvals_required": 3, "human_review_required": False}
        await revise_policy(
            ch, work.owner.pk, "main", 0, {**revised, "integration": by_id["integration"]}
        )
        again = await policy_of_project(tx, project["id"])
        assert again is not None
        assert (again["revision"], again["approvals_required"]) == (1, 3)
        assert (await current_policy(tx, pk))["approvals_required"] == 3


# -- search ---------------------------------------------------------------------


async def test_stage_work_is_left_out_of_search_and_its_subject_found(work):
    """Stage work is not indexed when the engine creates it, nor when it is
    edited, nor by a rebuild: a search finds the subject task it examines."""
    subject, handed = await submitted_subject(work)

    async def searched(q: str) -> list[str]:
        page = await work.call("GET", f"/tasks?q={q}", work.viewer, expect=200)
        return [t["id"] for t in page["items"]]

    assert await searched("subject") == [subject["id"]]
    item = handed["work_ids"][0]
    await work.call(
        "PATCH",
        f"/tasks/{item}",
        json={"expected_revision": 1, "title": "edited check"},
        expect=200,
    )
    assert await searched("edited") == []
    async with work.app.db.write() as tx:
        assert await rebuild(tx) == 1
    assert await searched("subject") == [subject["id"]]
    assert await searched("edited") == []
