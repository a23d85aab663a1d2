"""The stage hooks fire the same from a background job, which has no request
and no app context: the reviews plugin uses the app the hook is given."""

from __future__ import annotations

import asyncio

from buildmax_hookspecs import Actor, TaskQueue
from buildmax_reviews.tables import activities, reviews
from quart import has_app_context, has_request_context


async def test_a_review_handed_in_by_a_background_job_is_judged_recorded_and_audited(flow):
    subject, handed = await flow.implemented()
    (review_task,) = handed["work_ids"]
    human = Actor(principal_id=flow.human.id, kind="human", name=flow.human.name)

    async def job() -> dict[str, object]:
        # What a scheduled job or a queue consumer sees: no request, no app.
        assert not has_request_context() and not has_app_context()
        async with flow.app.db.write() as tx:
            return dict(
                await flow.app.services.get(TaskQueue).hand_in(
                    tx,
                    review_task,
                    actor=human,
                    summary="approved by the nightly job",
                    candidate={"decision": "approve", "findings": []},
                )
            )

    answer = await asyncio.get_running_loop().create_task(job())

    # buildmax_attempt_submitted judged it: a review row, its audit event,
    # and the subject moved on to the next stage.
    assert answer["task_state"] == "done"
    (review,) = await flow.rows(reviews)
    assert (review["reviewer_id"], review["reviewer_kind"], review["decision"]) == (
        flow.human.id,
        "human",
        "approve",
    )
    assert review["summary"] == "approved by the nightly job"
    (event,) = await flow.audited("review.recorded")
    assert event["actor_id"] == flow.human.id
    shown = await flow.state(subject["id"])
    assert (shown["state"], shown["stage"]) == ("waiting", "integrate")
    # buildmax_stage_entered recorded the integrate stage's activity too.
    kinds = sorted(row["kind"] for row in await flow.rows(activities))
    assert kinds == ["integration", "review"]
