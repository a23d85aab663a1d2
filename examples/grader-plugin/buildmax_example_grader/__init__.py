"""``problem_details``: a saved answer is a well-formed problem.

An installable example of a third-party grader. Once this distribution is
installed, ``buildmax qualify`` offers the grader to every journey file::

    [[check]]
    step = "response"
    grader = "problem_details"
    name = "the refusal is a proper problem"
    of = "cross_space_read"

It passes when the saved answer is an error (4xx or 5xx) served as
``application/problem+json`` (RFC 9457) whose body has a string ``type``
and ``title``, a ``status`` equal to the HTTP status, and no traceback or
source path leaking through ``title`` or ``detail``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from buildmax_hookspecs import Grade, GradingContext, hookimpl

#: Text that means the server let an internal error through.
LEAK = re.compile(r"Traceback \(most recent call last\)|File \"/|\.py\", line \d+")


class ProblemDetailsGrader:
    """Checks one saved answer (``of``) against RFC 9457."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        if not isinstance(spec.get("of"), str):
            raise ValueError("problem_details: 'of' must name a saved answer")
        unknown = set(spec) - {"of", "grader", "step", "name"}
        if unknown:
            raise ValueError(f"problem_details: unknown key(s) {', '.join(sorted(unknown))}")
        self.of = spec["of"]

    async def grade(self, context: GradingContext) -> Grade:
        """Pass when the answer is a well-formed problem; the reason names
        the first rule it breaks."""
        answer = context.value(self.of)
        status = answer.get("status")
        kind = answer.get("headers", {}).get("content-type", "")
        body = answer.get("body")
        evidence = {"of": self.of, "status": status, "content_type": kind}
        problem = self._problem(status, kind, body)
        if problem:
            return Grade(False, f"{self.of}: {problem}", evidence)
        return Grade(True, f"{self.of}: {status} {body['type']}", evidence)

    @staticmethod
    def _problem(status: Any, kind: str, body: Any) -> str | None:
        if not isinstance(status, int) or status < 400:
            return f"status {status} is not an error"
        if not kind.startswith("application/problem+json"):
            return f"content type {kind or 'none'!r}, expected application/problem+json"
        if not isinstance(body, Mapping):
            return "the body is not a JSON object"
        for key in ("type", "title"):
            if not isinstance(body.get(key), str) or not body[key]:
                return f"no {key!r} string"
        if body.get("status") != status:
            return f"body status {body.get('status')!r} differs from the HTTP status {status}"
        for key in ("title", "detail"):
            if isinstance(body.get(key), str) and LEAK.search(body[key]):
                return f"{key!r} leaks a traceback or source path"
        return None


@hookimpl
def buildmax_graders() -> dict[str, Any]:
    return {"problem_details": ProblemDetailsGrader}
