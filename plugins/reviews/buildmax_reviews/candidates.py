"""What a review or an integration hands in (the submission's ``candidate``).

A review: ``{"decision": "approve" | "request_changes" | "reject",
"findings": [{"severity", "text", "path"?, "line"?}, ...], "human"?: bool}``.
``request_changes`` needs at least one finding, ``reject`` a reason (the
submission's summary). ``human`` may only be claimed by a human principal;
it is never needed: a review is human exactly when its author is.

An integration: ``{"outcome": "merged", "before": REF, "after": REF}`` or
``{"outcome": "failed", "reason": TEXT}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from marshmallow import RAISE, Schema, ValidationError, fields, validate, validates_schema

from buildmax.inputs import INT32_MAX
from buildmax.schemas import BoundedInteger, Pattern, StrictBoolean

from .problems import InvalidReview
from .tables import DECISIONS, OUTCOMES, SEVERITIES

#: Findings one review may carry.
MAX_FINDINGS = 100
#: Characters of one finding's text.
MAX_FINDING_CHARS = 4000
_REF = Pattern(r"^\S{1,200}$", error="A ref is 1 to 200 characters without spaces.")


class FindingIn(Schema):
    """One finding of a review."""

    class Meta:
        unknown = RAISE

    severity = fields.String(required=True, validate=validate.OneOf(SEVERITIES))
    text = fields.String(required=True, validate=validate.Length(min=1, max=MAX_FINDING_CHARS))
    path = fields.String(load_default=None, validate=validate.Length(min=1, max=1000))
    line = BoundedInteger(1, INT32_MAX, load_default=None)

    @validates_schema
    def _line_needs_path(self, data: dict[str, Any], **_: Any) -> None:
        if data.get("line") is not None and data.get("path") is None:
            raise ValidationError("A line needs a path.", "line")


class ReviewIn(Schema):
    """A review handed in."""

    class Meta:
        unknown = RAISE

    decision = fields.String(required=True, validate=validate.OneOf(DECISIONS))
    findings = fields.List(
        fields.Nested(FindingIn),
        load_default=list,
        validate=validate.Length(max=MAX_FINDINGS),
    )
    human = StrictBoolean(load_default=False)

    @validates_schema
    def _changes_need_findings(self, data: dict[str, Any], **_: Any) -> None:
        if data["decision"] == "request_changes" and not data["findings"]:
            raise ValidationError("Requesting changes needs at least one finding.", "findings")


class IntegrationIn(Schema):
    """An integration handed in."""

    class Meta:
        unknown = RAISE

    outcome = fields.String(required=True, validate=validate.OneOf(OUTCOMES))
    before = fields.String(load_default=None, validate=_REF)
    after = fields.String(load_default=None, validate=_REF)
    reason = fields.String(load_default=None, validate=validate.Length(min=1, max=1000))

    @validates_schema
    def _outcome_fields(self, data: dict[str, Any], **_: Any) -> None:
        if data["outcome"] == "merged":
            missing = [k for k in ("before", "after") if data.get(k) is None]
            if missing:
                raise ValidationError(
                    {k: ["A merge names the target's ref before and after it."] for k in missing}
                )
        elif data.get("reason") is None:
            raise ValidationError("A failed integration says why.", "reason")


def parse(schema: Schema, candidate: Mapping[str, Any], what: str) -> dict[str, Any]:
    """``candidate`` loaded by ``schema``; 422 naming every bad field."""
    try:
        loaded: dict[str, Any] = schema.load(dict(candidate))
    except ValidationError as exc:
        errors = exc.messages if isinstance(exc.messages, dict) else {"_schema": exc.messages}
        raise InvalidReview(f"the {what} handed in is not valid", errors=errors) from None
    return loaded
