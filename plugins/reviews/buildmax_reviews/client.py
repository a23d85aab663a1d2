"""Typed calls for the reviews plugin's routes.

:class:`ReviewsClient` wraps a kernel :class:`~buildmax.client.Client` (and
:class:`AsyncReviewsClient` an :class:`~buildmax.client.AsyncClient`)::

    with Client(url, token) as client:
        reviews = ReviewsClient(client)
        reviews.approve("web", "ta_...", summary="reads well")
        reviews.request_changes(
            "web", "ta_...", [finding("major", "the loop never ends", "src/app.py", 12)]
        )

An integrator hands in its integration work item's attempt with
:meth:`~ReviewsClient.integrated` (merged, with the target's refs before and
after) or :meth:`~ReviewsClient.integration_failed`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

from buildmax.client import (
    BuildMaxError,
    Calls,
    Conflict,
    Forbidden,
    OverAsyncClient,
    OverClient,
    ValidationError,
    present,
    space_path,
)
from buildmax_reviews import problems

_One = TypeVar("_One")
_Many = TypeVar("_Many")
_Done = TypeVar("_Done")


class InvalidReview(ValidationError, answers=problems.InvalidReview):
    """the review or integration handed in is not valid."""


class NotIndependent(Forbidden, answers=problems.NotIndependent):
    """the reviewer submitted the work, or
    holds another review slot of the same submission."""


class HumanReviewRefused(Forbidden, answers=problems.HumanReviewRefused):
    """only a human records a human review."""


class ReviewStale(Conflict, answers=problems.ReviewStale):
    """the subject's criteria changed since it was submitted."""


#: The plugin's exception classes, one per problem of :mod:`buildmax_reviews.problems`.
ERRORS: tuple[type[BuildMaxError], ...] = (
    InvalidReview,
    NotIndependent,
    HumanReviewRefused,
    ReviewStale,
)


def finding(
    severity: str, text: str, path: str | None = None, line: int | None = None
) -> dict[str, Any]:
    """One finding: ``severity`` is ``blocker``, ``major``, ``minor`` or ``note``."""
    return present(severity=severity, text=text, path=path, line=line)


class _ReviewRoutes(Calls[_One, _Many, _Done]):
    """The calls, shared by the sync and async clients."""

    def list(
        self,
        space: str,
        *,
        kind: str | None = None,
        subject: str | None = None,
        pending: bool | None = None,
    ) -> _Many:
        """Review and integration work, newest first (viewers)."""
        params = present(
            kind=kind,
            subject=subject,
            pending=None if pending is None else str(pending).lower(),
        )
        return self._many(space_path(space, "reviews"), params)

    def get(self, space: str, ident: str) -> _One:
        """One work item (by task id, review id or integration id) with its findings."""
        return self._one("GET", space_path(space, "reviews", ident))

    def record(
        self,
        space: str,
        task: str,
        decision: str,
        *,
        summary: str = "",
        findings: Sequence[dict[str, Any]] = (),
        generation: int | None = None,
    ) -> _One:
        """Record a review on review work item ``task`` (its holder, or a
        human on an unheld one). Refusals: :class:`NotIndependent`,
        :class:`HumanReviewRefused`, :class:`ReviewStale`, :class:`InvalidReview`."""
        body = {
            "decision": decision,
            "summary": summary,
            "findings": list(findings),
            **present(generation=generation),
        }
        return self._one("POST", space_path(space, "reviews", task), json=body)

    def approve(self, space: str, task: str, *, summary: str = "", **kw: Any) -> _One:
        """Approve (findings may still be noted)."""
        return self.record(space, task, "approve", summary=summary, **kw)

    def request_changes(
        self,
        space: str,
        task: str,
        findings: Sequence[dict[str, Any]],
        *,
        summary: str = "",
        **kw: Any,
    ) -> _One:
        """Ask for changes, with at least one finding."""
        return self.record(space, task, "request_changes", summary=summary, findings=findings, **kw)

    def reject(self, space: str, task: str, summary: str, **kw: Any) -> _One:
        """Reject the work for good (the subject task fails with ``summary``)."""
        return self.record(space, task, "reject", summary=summary, **kw)

    def findings(
        self,
        space: str,
        *,
        subject: str | None = None,
        review: str | None = None,
        state: str | None = None,
    ) -> _Many:
        """Findings, newest first; ``state`` is ``open`` or ``resolved``."""
        params = present(subject=subject, review=review, state=state)
        return self._many(space_path(space, "findings"), params)

    def resolve(self, space: str, finding_id: str, resolution: str = "") -> _One:
        """Mark a finding resolved."""
        return self._one(
            "POST",
            space_path(space, "findings", finding_id, "resolve"),
            json={"resolution": resolution},
        )

    def integrated(
        self,
        space: str,
        attempt: str,
        generation: int,
        *,
        before: str,
        after: str,
        summary: str = "",
    ) -> _One:
        """Hand in an integration attempt: merged, moving the target from
        ``before`` to ``after``. The subject task is done."""
        candidate = {"outcome": "merged", "before": before, "after": after}
        return self._submit(space, attempt, generation, summary or "merged", candidate)

    def integration_failed(self, space: str, attempt: str, generation: int, reason: str) -> _One:
        """Hand in an integration attempt that could not merge: the subject
        reopens with ``reason`` and its dependents stay blocked."""
        candidate = {"outcome": "failed", "reason": reason}
        return self._submit(space, attempt, generation, reason, candidate)

    def _submit(
        self, space: str, attempt: str, generation: int, summary: str, candidate: dict[str, Any]
    ) -> _One:
        body = {"generation": generation, "summary": summary, "candidate": candidate}
        return self._one("POST", space_path(space, "attempts", attempt, "submit"), json=body)


class ReviewsClient(OverClient, _ReviewRoutes[dict[str, Any], list[dict[str, Any]], None]):
    """The reviews plugin's calls over a synchronous :class:`~buildmax.client.Client`."""

    ERRORS = ERRORS


class AsyncReviewsClient(
    OverAsyncClient,
    _ReviewRoutes[Awaitable[dict[str, Any]], Awaitable[list[dict[str, Any]]], Awaitable[None]],
):
    """The asynchronous twin of :class:`ReviewsClient`, over an
    :class:`~buildmax.client.AsyncClient`."""

    ERRORS = ERRORS
