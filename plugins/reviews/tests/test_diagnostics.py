"""What reviews tell an operator: ``buildmax_reviews_waiting`` per space
and ``review.waiting`` attention items past ``attention_wait_seconds``."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from buildmax_reviews import diagnostics
from buildmax_reviews.plugin import _STILL_WAITING
from buildmax_reviews.settings import ReviewSettings, review_settings
from buildmax_reviews.tables import waiting

from buildmax.app import create_app
from buildmax.config import Config, ConfigError

WAIT = 3600  # the default attention_wait_seconds


async def waiting_gauge(app: Any) -> dict[str, float]:
    """``buildmax_reviews_waiting`` by space label."""
    async with app.db.read() as conn:
        found = await app.hooks.gauges(conn)
    return {
        g.labels[0][1]: g.value
        for plugin, g in found
        if plugin == "reviews" and g.name == "buildmax_reviews_waiting"
    }


async def waited(app: Any, space_pk: int | None = None) -> list[Any]:
    """The ``review.waiting`` items now."""
    async with app.db.read() as conn:
        items = await app.hooks.attention(conn, app.clock.now_ms(), space_pk)
    return [item for item in items if item.kind == "review.waiting"]


def pending(flow: Any, count: int) -> dict[str, float]:
    """The gauge when ``count`` review work items of the flow's space wait."""
    found: dict[str, float] = {diagnostics.OTHER_SPACES: 0}
    if count:
        found[flow.space.slug] = count
    return found


async def test_review_work_waits_until_reviewed_and_members_are_told_once_it_waited_too_long(
    app, flow, clock
):
    await flow.policy(approvals_required=2)
    subject, handed = await flow.implemented("wait for me")
    first, second = handed["work_ids"]
    assert await waiting_gauge(app) == pending(flow, 2)
    await flow.claim(first, flow.reviewer)  # a review in progress still waits for its review
    assert await waiting_gauge(app) == pending(flow, 2)

    clock.advance(seconds=WAIT - 1)
    assert await waited(app) == []
    clock.advance(seconds=1)
    items = await waited(app)
    assert [i.target for i in items] == [("task", first), ("task", second)]
    assert {(i.role, i.space_pk) for i in items} == {("member", flow.space.pk)}
    assert items[0].since == clock.now_ms() - WAIT * 1000
    assert subject["id"] in items[0].summary and "slot 1" in items[0].summary
    assert "wait for me" not in items[0].summary  # ids, never the task's text
    assert await waited(app, flow.space.pk) == items
    assert await waited(app, flow.space.pk + 1000) == []

    await flow.claim(first, flow.reviewer)  # its first lease lapsed meanwhile
    await flow.review(first, flow.reviewer, "approve")
    assert await waiting_gauge(app) == pending(flow, 1)
    assert [i.target for i in await waited(app)] == [("task", second)]

    await flow.claim(second, flow.reviewer2)
    await flow.review(second, flow.reviewer2, "approve")
    assert await waiting_gauge(app) == pending(flow, 0)
    assert await waited(app) == []
    assert await flow.rows(waiting) == []


async def test_changes_on_one_slot_end_the_wait_of_the_others(app, flow):
    await flow.policy(approvals_required=2)
    _, handed = await flow.implemented()
    first, second = handed["work_ids"]
    await flow.claim(first, flow.reviewer)
    await flow.review(
        first, flow.reviewer, "request_changes", findings=[{"severity": "minor", "text": "docs"}]
    )
    assert (await flow.state(second))["state"] == "canceled"
    assert await waiting_gauge(app) == pending(flow, 0)
    assert await flow.rows(waiting) == []


async def test_review_work_of_a_canceled_subject_no_longer_waits(app, flow, clock):
    subject, handed = await flow.implemented()
    (work,) = handed["work_ids"]
    await flow.call(
        "POST", f"/tasks/{subject['id']}/cancel", json={"reason": "dropped"}, expect=200
    )
    assert (await flow.state(work))["state"] == "canceled"
    clock.advance(seconds=WAIT + 1)
    # Its row stays (nothing told this plugin); the task queue says it is over.
    assert len(await flow.rows(waiting)) == 1
    assert await waiting_gauge(app) == pending(flow, 0)
    assert await waited(app) == []

    # A retry hands the work in again: the new review waits, the old row goes.
    await flow.call("POST", f"/tasks/{subject['id']}/retry", json={}, expect=200)
    claim = await flow.claim(subject["id"], flow.author)
    again = await flow.submit(claim)
    assert len(await flow.rows(waiting)) == 1
    assert await waiting_gauge(app) == pending(flow, 1)
    assert [i.target for i in await waited(app)] == []
    clock.advance(seconds=WAIT)
    assert [i.target for i in await waited(app)] == [("task", again["work_ids"][0])]


async def test_the_attention_list_is_bounded_and_skips_work_that_is_over(
    app, flow, clock, monkeypatch
):
    handed = []
    for n in range(4):
        handed.append(await flow.implemented(f"subject {n}"))
        clock.advance(seconds=1)
    # The oldest is canceled: it must not take a place in the bounded list.
    await flow.call(
        "POST", f"/tasks/{handed[0][0]['id']}/cancel", json={"reason": "dropped"}, expect=200
    )
    clock.advance(seconds=WAIT)
    monkeypatch.setattr(diagnostics, "MAX_ITEMS", 2)
    assert [i.target[1] for i in await waited(app)] == [
        handed[1][1]["work_ids"][0],
        handed[2][1]["work_ids"][0],
    ]


async def test_the_backfill_finds_the_review_work_the_workflow_keeps_waiting(app, flow):
    """Migration 2 fills ``review_waiting`` from what was recorded before it:
    the same rows the workflow keeps from then on."""
    await flow.policy(approvals_required=2)
    _, half = await flow.implemented("one of two approved")
    await flow.claim(half["work_ids"][0], flow.reviewer)
    await flow.review(half["work_ids"][0], flow.reviewer, "approve")
    _, changed = await flow.implemented("changes asked")
    await flow.claim(changed["work_ids"][1], flow.reviewer)
    await flow.review(changed["work_ids"][1], flow.reviewer, "reject", summary="not this")
    again, first = await flow.implemented("asked again")
    await flow.claim(first["work_ids"][0], flow.reviewer)
    await flow.review(
        first["work_ids"][0],
        flow.reviewer,
        "request_changes",
        findings=[{"severity": "major", "text": "tests"}],
    )
    claim = await flow.claim(again["id"], flow.author)
    await flow.submit(claim)
    await flow.implemented("untouched")

    kept = sorted(tuple(r.values()) for r in await flow.rows(waiting))
    assert len(kept) == 1 + 2 + 2
    async with app.db.write() as tx:
        await tx.execute(waiting.delete())
        await tx.execute(
            waiting.insert().from_select(["activity_id", "space_id", "created_at"], _STILL_WAITING)
        )
    assert sorted(tuple(r.values()) for r in await flow.rows(waiting)) == kept


@pytest.mark.engine_independent
def test_attention_wait_seconds_is_checked(tmp_path):
    def build(table: dict[str, Any]) -> Any:
        return create_app(Config(data_dir=str(tmp_path), plugins={"reviews": table}))

    assert review_settings(build({})) == ReviewSettings(attention_wait_seconds=3600)
    assert review_settings(build({"attention_wait_seconds": 60})).attention_wait_seconds == 60
    assert review_settings(build({"attention_wait_seconds": 0})).attention_wait_seconds == 0
    for table, message in (
        ({"attention_wait": 60}, r"\[plugins.reviews\]: unknown setting\(s\) attention_wait"),
        (
            {"attention_wait_seconds": -1},
            "attention_wait_seconds: expected an integer of at least 0",
        ),
        ({"attention_wait_seconds": "60"}, "attention_wait_seconds: expected an integer"),
    ):
        with pytest.raises(ConfigError, match=message):
            build(table)


class TestAShorterWait:
    @pytest.fixture
    def buildmax_settings(self, buildmax_settings):
        return dataclasses.replace(
            buildmax_settings, plugins={"reviews": {"attention_wait_seconds": 60}}
        )

    async def test_members_are_told_once_the_configured_wait_is_over(self, app, flow, clock):
        _, handed = await flow.implemented()
        clock.advance(seconds=59)
        assert await waited(app) == []
        clock.advance(seconds=1)
        assert [i.target for i in await waited(app)] == [("task", handed["work_ids"][0])]
