"""Artifacts bound to attempts (issue 14, item 5).

Attaching bytes to an attempt takes being its current owner at its current
generation, checked again in the transaction that records the artifact (or
a space admin's audited override); and a submission names, in its
``artifacts`` field, only live artifacts of its own task (through the
``buildmax_submission_check`` hook this plugin answers).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_artifacts import routes
from buildmax_artifacts.tables import artifacts
from buildmax_audit.tables import events as audit_events
from buildmax_tasks.tables import attempts, submissions

from buildmax.app import blob_store
from buildmax.spaces import put_member
from buildmax.testing import PrincipalHandle

from .conftest import PROBLEM

DATA = b"a build log\n" * 100


class Desk:
    """A shelf with a project, a second agent member and task helpers."""

    def __init__(self, shelf: Any, other: PrincipalHandle) -> None:
        self.shelf = shelf
        self.other = other
        self.space_base = f"/v1/spaces/{shelf.space.id}"

    async def call(self, method: str, path: str, who: Any, expect: int, **kw: Any) -> Any:
        token = who if isinstance(who, str) else who.token
        response = await self.shelf.client.open(
            self.space_base + path,
            method=method,
            headers={"Authorization": f"Bearer {token}"},
            **kw,
        )
        body = await response.get_json()
        assert response.status_code == expect, body
        return body

    async def task(self, title: str = "t") -> dict[str, Any]:
        body = {"project": "main", "title": title}
        return await self.call("POST", "/tasks", self.shelf.owner, 201, json=body)  # type: ignore[no-any-return]

    async def claim(self, task_id: str, who: PrincipalHandle, **body: Any) -> dict[str, Any]:
        return await self.call("POST", f"/tasks/{task_id}/claim", who, 201, json=body)  # type: ignore[no-any-return]

    async def submit(self, claim: dict[str, Any], expect: int, **body: Any) -> dict[str, Any]:
        attempt = claim["attempt"]
        sent = {"generation": attempt["generation"], "summary": "done", **body}
        return await self.call(  # type: ignore[no-any-return]
            "POST", f"/attempts/{attempt['id']}/submit", claim["token"], expect, json=sent
        )

    async def attempt_row(self, attempt_id: str) -> dict[str, Any]:
        [row] = [r for r in await self.shelf.rows(attempts) if r["public_id"] == attempt_id]
        return row


@pytest.fixture
async def desk(shelf, make_principal) -> Desk:
    other = await make_principal("agent")
    async with shelf.app.db.write() as tx:
        await put_member(tx, shelf.space.pk, other.pk, "member", shelf.app.clock.now_ms())
    made = Desk(shelf, other)
    await made.call("POST", "/projects", shelf.owner, 201, json={"name": "main"})
    return made


def at(claim: dict[str, Any]) -> dict[str, str]:
    """The query naming a claim's attempt at its generation."""
    attempt = claim["attempt"]
    return {"attempt": attempt["id"], "generation": str(attempt["generation"])}


# -- uploads ------------------------------------------------------------------------


async def test_a_member_cannot_attach_to_another_members_attempt(shelf, desk, audit_log):
    """The landed server recorded an upload naming someone else's active
    attempt against it. Catches: the ownership check dropped from the fence."""
    theirs = await desk.claim((await desk.task())["id"], desk.other)
    before = await shelf.leftovers()
    refused = await shelf.upload(DATA, shelf.member, expect=403, **at(theirs))
    assert refused["type"] == PROBLEM + "not-attempt-owner"
    assert await shelf.leftovers() == before  # refused before a byte was stored
    assert audit_log.of("artifact.uploaded") == []
    # Their own upload, with their main token, is theirs to make.
    made = await shelf.upload(DATA, desk.other, **at(theirs))
    assert (made["attempt_id"], made["task_id"]) == (theirs["attempt"]["id"], theirs["task"]["id"])


async def test_an_upload_naming_an_attempt_names_its_generation(shelf, desk):
    """``attempt`` without ``generation`` is a 422; a wrong one is 409
    stale-generation; neither stores anything."""
    mine = await desk.claim((await desk.task())["id"], shelf.member)
    attempt = mine["attempt"]
    before = await shelf.leftovers()
    missing = await shelf.upload(DATA, attempt=attempt["id"], expect=422)
    assert missing["type"] == PROBLEM + "validation-error"
    assert missing["errors"] == {"generation": ["Required with attempt."]}
    for bad in ("one", "-1", "1.0", "99999999999", " 1"):
        refused = await shelf.upload(DATA, attempt=attempt["id"], generation=bad, expect=422)
        assert list(refused["errors"]) == ["generation"], bad
    for stale_generation in ("0", "2"):
        stale = await shelf.upload(
            DATA, attempt=attempt["id"], generation=stale_generation, expect=409
        )
        assert stale["type"] == PROBLEM + "stale-generation"
    # The run token names its attempt too when it says which.
    scoped = await shelf.upload(DATA, mine["token"], attempt=attempt["id"], expect=422)
    assert scoped["errors"] == {"generation": ["Required with attempt."]}
    assert await shelf.leftovers() == before


async def test_the_owner_attaches_with_its_run_token_or_its_main_token(shelf, desk, audit_log):
    mine = await desk.claim((await desk.task())["id"], shelf.member)
    attempt, task = mine["attempt"], mine["task"]
    implicit = await shelf.upload(DATA, mine["token"])  # the run token's own attempt
    explicit = await shelf.upload(DATA, mine["token"], **at(mine))
    main = await shelf.upload(DATA, shelf.member, **at(mine))
    for made in (implicit, explicit, main):
        assert (made["attempt_id"], made["task_id"]) == (attempt["id"], task["id"])
    [event] = audit_log.of("artifact.uploaded", main["id"])
    assert (event.details["attempt_id"], event.details["generation"]) == (attempt["id"], 1)
    assert event.admin_override is False and "override_reason" not in event.details


async def test_a_stale_owner_cannot_attach_to_its_lapsed_or_recovered_attempt(
    shelf, desk, clock, audit_log
):
    """The landed server let the owner of a recovered attempt attach to it
    with its main token. Catches: the ended and lapsed checks dropped."""
    task = await desk.task()
    old = await desk.claim(task["id"], shelf.member, lease_seconds=30)
    clock.advance(seconds=31)
    lapsed = await shelf.upload(DATA, shelf.member, expect=409, **at(old))
    assert lapsed["type"] == PROBLEM + "lease-lapsed"
    await desk.claim(task["id"], desk.other)  # recovers the lapsed attempt
    assert (await desk.attempt_row(old["attempt"]["id"]))["state"] == "expired"
    before = await shelf.leftovers()
    ended = await shelf.upload(DATA, shelf.member, expect=409, **at(old))
    assert ended["type"] == PROBLEM + "attempt-ended"
    revoked = await shelf.upload(DATA, old["token"], expect=401)
    assert revoked["type"] == PROBLEM + "unauthenticated"
    assert await shelf.leftovers() == before
    assert audit_log.of("artifact.uploaded") == []


async def test_a_space_admin_attaches_to_anothers_attempt_only_as_an_audited_override(
    shelf, desk, audit_log
):
    """As on the tasks plugin's own attempt routes: without a reason the
    space owner is asked for one (422), with one it attaches, audited as an
    override with the reason."""
    theirs = await desk.claim((await desk.task())["id"], desk.other)
    unexplained = await shelf.upload(DATA, shelf.owner, expect=422, **at(theirs))
    assert unexplained["errors"] == {
        "override_reason": ["Required to override the attempt's owner."]
    }
    # A plain member cannot override, whatever it says.
    member = await shelf.upload(
        DATA, shelf.member, expect=403, override_reason="trust me", **at(theirs)
    )
    assert member["type"] == PROBLEM + "not-attempt-owner"
    made = await shelf.upload(
        DATA, shelf.owner, override_reason="the agent crashed; attaching its log", **at(theirs)
    )
    assert made["attempt_id"] == theirs["attempt"]["id"]
    assert made["created_by"] == shelf.owner.id
    [event] = audit_log.of("artifact.uploaded", made["id"])
    assert event.admin_override is True
    assert event.details["override_reason"] == "the agent crashed; attaching its log"
    assert [e.target_id for e in audit_log.of("artifact.uploaded")] == [made["id"]]


async def test_an_attempt_that_ends_while_its_bytes_stream_gets_no_artifact(
    shelf, desk, monkeypatch, audit_log
):
    """The attempt is canceled after the early check passed and before the
    artifact is recorded: the upload is refused 409 attempt-ended, no
    artifact names the attempt and the quota comes back. Catches: the fence
    not repeated in the transaction that writes the artifact row."""
    mine = await desk.claim((await desk.task())["id"], shelf.member)
    attempt = mine["attempt"]
    real = blob_store(shelf.app)

    class CancelingStore:
        """The store, but the attempt is canceled while the bytes stream."""

        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        async def put(self, *args: Any, **kwargs: Any) -> Any:
            await desk.call(
                "POST",
                f"/attempts/{attempt['id']}/cancel",
                shelf.owner,
                200,
                json={
                    "generation": attempt["generation"],
                    "reason": "stop",
                    "override_reason": "stopping the run",
                },
            )
            return await real.put(*args, **kwargs)

    monkeypatch.setattr(routes, "blob_store", lambda app: CancelingStore())
    refused = await shelf.upload(DATA, shelf.member, expect=409, **at(mine))
    assert refused["type"] == PROBLEM + "attempt-ended"
    assert await shelf.rows(artifacts) == []
    left = await shelf.leftovers()
    assert (left["uploads"], left["reserved"]) == ([], 0)
    assert audit_log.of("artifact.uploaded") == []
    assert (await desk.attempt_row(attempt["id"]))["state"] == "canceled"


async def test_an_attempt_cannot_end_between_the_fence_and_the_artifact_row(
    shelf, desk, monkeypatch
):
    """A cancel of the attempt is sent while the upload's write transaction
    is between its fence and its commit, and given half a second to land:
    it must wait for that transaction, so the audit trail shows the upload
    before the cancel (never an artifact attached to an ended attempt).
    Meaningful on PostgreSQL, where the two transactions really overlap.
    Catches: the fence taking no lock on the attempt's task row."""
    mine = await desk.claim((await desk.task())["id"], shelf.member)
    attempt = mine["attempt"]
    real_settle = routes.settle
    canceling: list[asyncio.Task[Any]] = []

    async def settle_while_canceling(*args: Any, **kwargs: Any) -> Any:
        body = {"generation": 1, "reason": "stop", "override_reason": "stopping the run"}
        cancel = asyncio.ensure_future(
            desk.call("POST", f"/attempts/{attempt['id']}/cancel", shelf.owner, 200, json=body)
        )
        canceling.append(cancel)
        await asyncio.wait({cancel}, timeout=0.5)
        return await real_settle(*args, **kwargs)

    monkeypatch.setattr(routes, "settle", settle_while_canceling)
    made = await shelf.upload(DATA, shelf.member, **at(mine))
    await canceling[0]
    async with shelf.app.db.read() as conn:
        rows = await conn.fetch_all(
            sa.select(audit_events.c.action, audit_events.c.target_id)
            .where(audit_events.c.action.in_(["artifact.uploaded", "attempt.canceled"]))
            .order_by(audit_events.c.seq)
        )
    assert [(r["action"], r["target_id"]) for r in rows] == [
        ("artifact.uploaded", made["id"]),
        ("attempt.canceled", attempt["id"]),
    ]


# -- submissions name their artifacts -----------------------------------------------


async def test_a_submission_names_only_live_artifacts_of_its_own_task_and_attempt(
    shelf, desk, make_space, audit_log
):
    """Each kind of foreign artifact is refused with 422 submission-refused
    naming it, and nothing is recorded; the submission naming the attempt's
    own and the task's artifacts is recorded with them. The landed server
    had no such field and took any id in ``evidence``."""
    task, other_task = await desk.task("mine"), await desk.task("another")
    earlier = await desk.claim(task["id"], shelf.member)
    from_earlier = await shelf.upload(DATA, earlier["token"])
    await desk.call(
        "POST",
        f"/attempts/{earlier['attempt']['id']}/release",
        earlier["token"],
        200,
        json={"generation": 1},
    )
    claim = await desk.claim(task["id"], shelf.member)
    own = await shelf.upload(DATA, claim["token"])
    of_task = await shelf.upload(DATA, shelf.owner, task=task["id"])
    of_other_task = await shelf.upload(DATA, shelf.owner, task=other_task["id"])
    loose = await shelf.upload(DATA, shelf.owner)
    deleted = await shelf.upload(DATA, claim["token"])
    gone = await shelf.client.delete(f"{shelf.base}/{deleted['id']}", headers=shelf.member.headers)
    assert gone.status_code == 204
    elsewhere = await shelf.client.post(
        f"/v1/spaces/{shelf.other_space.id}/artifacts",
        data=DATA,
        headers={**shelf.outsider.headers, "Content-Type": "text/plain"},
        query_string={"name": "theirs.log"},
    )
    assert elsewhere.status_code == 201
    foreign = (await elsewhere.get_json())["id"]

    refusals = {
        foreign: "no artifact {} in this space",
        "af_never_made": "no artifact {} in this space",
        deleted["id"]: "artifact {} was deleted",
        of_other_task["id"]: "artifact {} is not linked to this task",
        loose["id"]: "artifact {} is not linked to this task",
        from_earlier["id"]: "artifact {} was attached to another attempt",
    }
    for bad, reason in refusals.items():
        refused = await desk.submit(claim, 422, artifacts=[own["id"], bad])
        assert refused["type"] == PROBLEM + "submission-refused", refused
        assert refused["detail"] == reason.format(bad)
    # Several at once are all named, in the order given.
    both = await desk.submit(claim, 422, artifacts=[loose["id"], foreign])
    assert both["detail"] == (
        f"artifact {loose['id']} is not linked to this task; no artifact {foreign} in this space"
    )
    assert await shelf.rows(submissions) == []
    assert (await desk.attempt_row(claim["attempt"]["id"]))["state"] == "active"
    assert audit_log.of("attempt.submitted") == []

    named = [own["id"], of_task["id"]]
    handed = await desk.submit(claim, 201, artifacts=named)
    assert handed["submission"]["artifacts"] == named
    shown = await desk.call("GET", f"/submissions/{handed['submission']['id']}", shelf.owner, 200)
    assert shown["artifacts"] == named
    listed = await desk.call("GET", f"/tasks/{task['id']}/submissions", shelf.owner, 200)
    assert [s["artifacts"] for s in listed["items"]] == [named]
