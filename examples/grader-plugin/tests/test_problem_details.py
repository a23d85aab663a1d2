"""The example grader on answers shaped like the runner saves them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from buildmax_example_grader import ProblemDetailsGrader, buildmax_graders


class Saved:
    """A grading context holding one saved answer."""

    workdir = Path(".")

    def __init__(self, answer: Mapping[str, Any]) -> None:
        self.answer = answer

    def value(self, ref: str) -> Any:
        if ref != "answer":
            raise KeyError(ref)
        return self.answer

    def render(self, template: Any) -> Any:
        return template

    async def scalar(self, sql: str, params: Mapping[str, Any] | None = None) -> Any:
        raise AssertionError("not used")

    async def audit_events(self) -> Sequence[Mapping[str, Any]]:
        return []

    def server_log(self) -> str:
        return ""

    def secrets(self) -> Sequence[str]:
        return []

    def environment(self) -> Mapping[str, str]:
        return {}


def answer(status: int, body: Any, kind: str = "application/problem+json") -> dict[str, Any]:
    return {"status": status, "headers": {"content-type": kind}, "body": body}


GOOD = {"type": "urn:buildmax:problem:not-found", "title": "Not found", "status": 404}


async def grade(saved: Mapping[str, Any]) -> Any:
    return await ProblemDetailsGrader({"of": "answer"}).grade(Saved(saved))


def test_the_hook_offers_the_grader_by_name() -> None:
    assert buildmax_graders() == {"problem_details": ProblemDetailsGrader}


async def test_a_well_formed_problem_passes() -> None:
    result = await grade(answer(404, GOOD))
    assert result.passed, result.reason
    assert result.reason == "answer: 404 urn:buildmax:problem:not-found"


@pytest.mark.parametrize(
    ("saved", "reason"),
    [
        (answer(200, {"id": "x"}, "application/json"), "status 200 is not an error"),
        (answer(404, GOOD, "application/json"), "content type 'application/json'"),
        (answer(404, "Not found", "application/problem+json"), "the body is not a JSON object"),
        (answer(404, {**GOOD, "title": ""}), "no 'title' string"),
        (answer(404, {**GOOD, "status": 500}), "body status 500 differs from the HTTP status 404"),
        (
            answer(500, {**GOOD, "status": 500, "detail": 'File "/srv/app.py", line 3'}),
            "'detail' leaks a traceback",
        ),
    ],
)
async def test_each_broken_rule_fails_naming_it(saved: dict[str, Any], reason: str) -> None:
    result = await grade(saved)
    assert not result.passed
    assert reason in result.reason


def test_a_spec_without_of_is_refused_when_the_journey_loads() -> None:
    with pytest.raises(ValueError, match="'of' must name a saved answer"):
        ProblemDetailsGrader({})
    with pytest.raises(ValueError, match="unknown key"):
        ProblemDetailsGrader({"of": "answer", "statuss": 404})
