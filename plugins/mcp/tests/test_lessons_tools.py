"""The lessons plugin's tools over MCP: an agent publishes a lesson, finds
it by a stemmed search, reads it and votes on it, as the routes allow; a
viewer searches but does not publish."""

from __future__ import annotations

from .conftest import Team, http_session


async def test_an_agent_publishes_searches_reads_and_votes_on_a_lesson(team: Team) -> None:
    space = team.space.slug
    async with http_session(team.base_url, team.author.token) as tools:
        made = await tools.ok(
            "publish_lesson",
            space=space,
            project="main",
            kind="gotcha",
            title="Flaky tests need a retry budget",
            text="Retrying failed tests hides real failures unless the retries are counted.",
            idempotency_key="lesson-1",
        )
        found = await tools.ok("search_lessons", space=space, q="retry failing test")
        assert [item["id"] for item in found["items"]] == [made["id"]]
        assert "\x02" in found["items"][0]["match"]["snippet"]
        shown = await tools.ok("show_lesson", space=space, lesson=made["id"])
        assert shown["title"] == "Flaky tests need a retry budget"
        voted = await tools.ok("vote_lesson", space=space, lesson=made["id"], vote="helpful")
        assert voted["usefulness"]["helpful"] == 1
    async with http_session(team.base_url, team.viewer.token) as tools:
        assert (await tools.ok("search_lessons", space=space, q="retries"))["items"]
        await tools.refused(
            "publish_lesson", "forbidden", space=space, kind="note", title="t", text="x"
        )
    events = await team.api("GET", "/audit?action=lesson.", team.owner, expect=200)
    assert [e["action"] for e in events["items"]] == ["lesson.voted", "lesson.created"]
