"""``buildmax review`` and ``buildmax_reviews.client`` against a live server:
the whole J07 path by CLI and typed client, and the typed refusals.

Commands and the sync client run in worker threads because the live server
shares the test's event loop.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import click
import pytest
from buildmax_reviews.client import (
    AsyncReviewsClient,
    HumanReviewRefused,
    InvalidReview,
    ReviewsClient,
    finding,
)
from buildmax_tasks.client import ClaimVetoed, TasksClient
from click.testing import CliRunner, Result

from buildmax.cli import _register_commands, cli
from buildmax.client import TOKEN_ENV, URL_ENV, AsyncClient, Client
from buildmax.commands.identity import SPACE_ENV


@pytest.fixture(scope="module")
def buildmax_cli() -> click.Group:
    _register_commands()
    return cli


@pytest.fixture(autouse=True)
def isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for name in (URL_ENV, TOKEN_ENV, SPACE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def run(buildmax_cli, url: str, space: str, token: str, *args: str) -> Any:
    argv = [*args, "--url", url, "--token", token, "--space", space]
    return asyncio.to_thread(CliRunner().invoke, buildmax_cli, argv, catch_exceptions=False)


def ok(result: Result) -> Result:
    assert result.exit_code == 0, (result.stdout, result.stderr)
    return result


def sync(url: str, token: str, scenario):
    def work():
        with Client(url, token, retries=0) as bmx:
            return scenario(TasksClient(bmx), ReviewsClient(bmx))

    return asyncio.to_thread(work)


async def test_j07_by_cli_and_client(flow, live_server, buildmax_cli, tmp_path):
    space = flow.space.slug
    subject = await flow.task("by the command line")

    def implement(tasks: TasksClient, reviews: ReviewsClient):
        claim = tasks.claim(space, subject["id"])
        attempt = claim["attempt"]
        return tasks.submit(space, attempt["id"], attempt["generation"], summary="done")

    handed = await sync(live_server, flow.author.token, implement)
    (review_task,) = handed["work_ids"]

    def own_review(tasks: TasksClient, reviews: ReviewsClient):
        with pytest.raises(ClaimVetoed) as refused:
            tasks.claim(space, review_task)
        return str(refused.value)

    assert "handed in the work under review" in await sync(
        live_server, flow.author.token, own_review
    )

    claimed = await sync(live_server, flow.reviewer.token, lambda t, r: t.claim(space, review_task))
    listed = ok(await run(buildmax_cli, live_server, space, flow.viewer.token, "review", "list"))
    assert review_task in listed.stdout and "stale" in listed.stdout.splitlines()[0]

    bad = await run(
        buildmax_cli,
        live_server,
        space,
        claimed["token"],
        "review",
        "request-changes",
        review_task,
        "--finding",
        "huge:oops",
    )
    assert bad.exit_code == 2 and "SEVERITY[@PATH[:LINE]]:TEXT" in bad.stderr

    extra = tmp_path / "findings.json"
    extra.write_text(json.dumps([{"severity": "note", "text": "nice tests"}]))
    shown = ok(
        await run(
            buildmax_cli,
            live_server,
            space,
            claimed["token"],
            "review",
            "approve",
            review_task,
            "--json",
            "--summary",
            "reads well",
            "--finding",
            "minor@src/app.py:7:a name could be clearer",
            "--findings-file",
            str(extra),
        )
    )
    item = json.loads(shown.stdout)
    assert item["review"]["decision"] == "approve"
    assert [(f["severity"], f["path"], f["line"]) for f in item["findings"]] == [
        ("minor", "src/app.py", 7),
        ("note", None, None),
    ]
    detail = ok(
        await run(
            buildmax_cli, live_server, space, flow.viewer.token, "review", "show", review_task
        )
    )
    assert "approve" in detail.stdout and "a name could be clearer" in detail.stdout

    (integration,) = [r for r in await flow.linked(subject["id"]) if r["stage"] == "integrate"]

    def integrate(tasks: TasksClient, reviews: ReviewsClient):
        claim = tasks.claim(space, integration["public_id"])
        attempt = claim["attempt"]
        return reviews.integrated(
            space, attempt["id"], attempt["generation"], before="0a1b", after="2c3d"
        )

    merged = await sync(live_server, flow.integrator.token, integrate)
    assert merged["task"]["state"] == "done"
    assert (await flow.state(subject["id"]))["state"] == "done"

    open_findings = ok(
        await run(
            buildmax_cli,
            live_server,
            space,
            flow.viewer.token,
            "review",
            "findings",
            "--json",
            "--state",
            "open",
        )
    )
    first = json.loads(open_findings.stdout)[-1]
    resolved = ok(
        await run(
            buildmax_cli,
            live_server,
            space,
            flow.author.token,
            "review",
            "resolve",
            "--json",
            first["id"],
            "--resolution",
            "renamed",
        )
    )
    assert json.loads(resolved.stdout)["resolved"] is True


async def test_the_typed_client_raises_the_plugins_problems(flow, live_server):
    space = flow.space.slug
    await flow.policy(approvals_required=2, human_review_required=True)
    _, handed = await flow.implemented()
    human_slot, agent_slot = handed["work_ids"]

    def refusals(tasks: TasksClient, reviews: ReviewsClient):
        tasks.claim(space, agent_slot)
        with pytest.raises(InvalidReview):
            reviews.request_changes(space, agent_slot, [])
        with pytest.raises(HumanReviewRefused):
            reviews.client.request(
                "POST",
                f"/v1/spaces/{space}/reviews/{agent_slot}",
                json={"decision": "approve", "human": True},
            )
        return reviews.approve(space, agent_slot, findings=[finding("note", "fine")])

    approved = await sync(live_server, flow.reviewer.token, refusals)
    assert approved["review"]["human"] is False

    async with AsyncClient(live_server, flow.human.token, retries=0) as bmx:
        reviews = AsyncReviewsClient(bmx)
        pending = await reviews.list(space, pending=True)
        assert [i["task_id"] for i in pending] == [human_slot]
        recorded = await reviews.approve(space, human_slot, summary="by hand")
        assert recorded["review"]["human"] is True
        assert (await reviews.get(space, recorded["review"]["id"]))["task_id"] == human_slot
