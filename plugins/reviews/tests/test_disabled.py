"""Disabling the reviews plugin (``BUILDMAX_LOAD_PLUGINS`` without it): new
work goes implement → done; work already waiting in its stages is reported
as waiting on a stage whose plugin is not loaded, never completed or lost,
and carries on when the plugin is back."""

from __future__ import annotations

import dataclasses

from buildmax_reviews.tables import reviews

from buildmax.app import create_app
from buildmax.testing import without_plugins


async def test_disabled_reviews_report_waiting_work_and_new_work_skips_the_stages(
    flow, buildmax_settings, clock
):
    waiting, handed = await flow.implemented("waiting in review")
    (review_task,) = handed["work_ids"]

    bare = create_app(without_plugins(buildmax_settings, "reviews"), clock=clock, auto_migrate=True)
    async with bare.test_app():
        assert bare.plugins.pm.get_plugin("reviews") is None
        other = dataclasses.replace(flow, app=bare, client=bare.test_client())

        shown = await other.state(waiting["id"])
        assert (shown["state"], shown["stage"], shown["stage_missing"]) == (
            "waiting",
            "review",
            True,
        )
        stranded = await other.call("GET", "/tasks?state=waiting", expect=200)
        assert [(t["id"], t["stage_missing"]) for t in stranded["items"]] == [(waiting["id"], True)]
        item = await other.state(review_task)
        assert (item["state"], item["stage_missing"]) == ("ready", True)
        await other.claim(review_task, flow.reviewer, expect=409, problem="stage-not-loaded")
        # The reviews routes are gone with the plugin.
        await other.call("GET", "/reviews", expect=404)

        fresh, done = await other.implemented("after the plugin went away")
        assert (done["task"]["state"], done["stage"], done["work_ids"]) == ("done", None, [])

    # Back with the plugin: the waiting work carries on where it was.
    assert (await flow.state(waiting["id"]))["stage_missing"] is False
    claim = await flow.claim(review_task, flow.reviewer)
    await flow.review(review_task, claim["token"], "approve")
    assert (await flow.state(waiting["id"]))["stage"] == "integrate"
    assert (await flow.state(fresh["id"]))["state"] == "done"
    assert len(await flow.rows(reviews)) == 1
