"""The reviews plugin's problem types (``urn:buildmax:problem:<slug>``)."""

from __future__ import annotations

from buildmax.problems import Conflict, Forbidden, ValidationFailed


class InvalidReview(ValidationFailed):
    slug, title = "invalid-review", "The review or integration handed in is not valid"


class NotIndependent(Forbidden):
    slug, title = "reviewer-not-independent", "The reviewer is not independent of the work"


class HumanReviewRefused(Forbidden):
    slug, title = "human-review-refused", "Only a human principal records a human review"


class ReviewStale(Conflict):
    slug, title = "review-stale", "The subject's criteria changed since it was submitted"
