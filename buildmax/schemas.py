"""marshmallow schemas of the kernel's request bodies and responses."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from marshmallow import Schema, ValidationError, fields, validate
from quart import current_app

from . import passwords
from .clock import to_rfc3339
from .inputs import INT32_MAX
from .roles import PRINCIPAL_KINDS, SPACE_ROLES, SYSTEM_ROLES

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}$"
SLUG_PATTERN = r"^[a-z0-9][a-z0-9-]{1,62}$"
MAX_TOKEN_LIFETIME = 10 * 365 * 24 * 3600


class Timestamp(fields.Field[Any]):
    """UTC epoch milliseconds inside, RFC 3339 outside."""

    def _serialize(self, value: Any, attr: Any, obj: Any, **kwargs: Any) -> str | None:
        return to_rfc3339(value)


class Pattern(validate.Regexp):
    """A regular expression the whole value must match. Written with ``^``
    and ``$`` as JSON Schema (ECMA 262) reads them, so the OpenAPI document
    shows a pattern every client understands; matched in full, so ``$``
    lets no trailing newline through."""

    def __call__(self, value: Any) -> Any:
        if self.regex.fullmatch(value) is None:
            raise ValidationError(self._format_error(value))
        return value


#: A bound of an integer input: a number, or a function of the serving app
#: (for a bound its settings decide, such as the longest lease).
Bound = int | Callable[[Any], int]


def _resolve(bound: Bound) -> int:
    if isinstance(bound, int):
        return bound
    return bound(current_app._get_current_object())  # type: ignore[attr-defined]


class Bounds(validate.Validator):
    """``minimum <= value <= maximum``, both inclusive. ``min`` and ``max``
    are what marshmallow's ``Range`` has, so the OpenAPI document shows
    them as ``minimum`` and ``maximum``; a bound that is a function is read
    from the app when a request is validated or the document is built."""

    def __init__(self, minimum: Bound, maximum: Bound) -> None:
        self._minimum, self._maximum = minimum, maximum

    @property
    def min(self) -> int:
        """The smallest value accepted."""
        return _resolve(self._minimum)

    @property
    def max(self) -> int:
        """The largest value accepted."""
        return _resolve(self._maximum)

    def __call__(self, value: Any) -> Any:
        low, high = self.min, self.max
        if not low <= value <= high:
            raise ValidationError(f"Must be between {low} and {high}.")
        return value


class BoundedInteger(fields.Integer):
    """The one way an integer enters the server (body, query, header): a
    whole JSON number, never a float, a bool or a string, within bounds
    that the column it reaches holds on both engines.

    ``text=True`` reads it from text (a query or header value): optional
    ``-`` and 1 to 19 digits, nothing else."""

    def __init__(
        self, minimum: Bound, maximum: Bound, *, text: bool = False, **kwargs: Any
    ) -> None:
        validators = kwargs.pop("validate", None) or []
        if callable(validators):
            validators = [validators]
        super().__init__(
            strict=not text, validate=[Bounds(minimum, maximum), *validators], **kwargs
        )
        self.text = text

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> Any:
        if self.text:
            if not (isinstance(value, str) and _DIGITS.match(value)):
                raise self.make_error("invalid")
            value = int(value)
        return super()._deserialize(value, attr, data, **kwargs)


_DIGITS = re.compile(r"^-?[0-9]{1,19}\Z")


class StrictBoolean(fields.Boolean):
    """A JSON ``true`` or ``false``, nothing else: marshmallow's own takes
    ``1``, ``"yes"`` or ``"on"``, and even ``truthy={True}`` takes ``1``
    (which equals ``True``)."""

    def _deserialize(self, value: Any, attr: Any, data: Any, **kwargs: Any) -> Any:
        if not isinstance(value, bool):
            raise self.make_error("invalid", input=value)
        return value


def revision_number(**kwargs: Any) -> BoundedInteger:
    """A revision or generation number a client names (an ``expected_revision``,
    an attempt's ``generation``): kept in an ``Integer`` column, counting from
    1, with 0 for the state before the first (a project without a policy, a
    task never claimed)."""
    return BoundedInteger(0, INT32_MAX, **kwargs)


# -- principals -------------------------------------------------------------


#: A new password (the rule ``buildmax.passwords.check_password_rules`` applies).
PASSWORD = validate.Length(
    min=passwords.MIN_LENGTH,
    max=passwords.MAX_LENGTH,
    error=f"a password has {passwords.MIN_LENGTH} to {passwords.MAX_LENGTH} characters",
)

#: Names that would collide with route words (``/v1/principals/me``).
RESERVED_NAMES = ("me",)
#: Slugs with another meaning (``system`` names the audit trail's system chain).
RESERVED_SLUGS = ("system",)


class PrincipalCreate(Schema):
    kind = fields.String(required=True, validate=validate.OneOf(PRINCIPAL_KINDS))
    name = fields.String(
        required=True,
        validate=[
            Pattern(NAME_PATTERN, error="lowercase letters, digits, '.', '_', '-'"),
            validate.NoneOf(RESERVED_NAMES, error="this name is reserved"),
        ],
    )
    display_name = fields.String(load_default="", validate=validate.Length(max=200))
    system_role = fields.String(
        load_default=None, allow_none=True, validate=validate.OneOf(SYSTEM_ROLES)
    )
    password = fields.String(
        load_default=None,
        allow_none=True,
        load_only=True,
        validate=PASSWORD,
        metadata={"secret": True},
    )


class PrincipalUpdate(Schema):
    display_name = fields.String(validate=validate.Length(max=200))
    system_role = fields.String(allow_none=True, validate=validate.OneOf(SYSTEM_ROLES))
    disabled = StrictBoolean()
    password = fields.String(load_only=True, validate=PASSWORD, metadata={"secret": True})
    current_password = fields.String(
        load_only=True, validate=validate.Length(max=1024), metadata={"secret": True}
    )


class PrincipalOut(Schema):
    id = fields.String(attribute="public_id")
    kind = fields.String()
    name = fields.String()
    display_name = fields.String()
    system_role = fields.String(allow_none=True)
    created_at = Timestamp()
    disabled_at = Timestamp(allow_none=True)


class PrincipalPage(Schema):
    items = fields.List(fields.Nested(PrincipalOut))
    next_cursor = fields.String(allow_none=True)


# -- sessions and tokens ----------------------------------------------------


class SessionCreate(Schema):
    name = fields.String(required=True, validate=validate.Length(min=1, max=64))
    password = fields.String(
        required=True, validate=validate.Length(min=1, max=1024), metadata={"secret": True}
    )


class TokenCreate(Schema):
    name = fields.String(load_default="", validate=validate.Length(max=100))
    principal_id = fields.String(
        load_default=None, allow_none=True, validate=validate.Length(max=64)
    )
    expires_in_seconds = BoundedInteger(60, MAX_TOKEN_LIFETIME, load_default=None, allow_none=True)
    scope = fields.String(
        load_default=None,
        allow_none=True,
        validate=validate.OneOf(["metrics"]),
        metadata={
            "description": "metrics: a token that reads /metrics and nothing else "
            "(for a system admin or operator)"
        },
    )


class ScopeOut(Schema):
    type = fields.String()
    id = fields.String()


class TokenOut(Schema):
    id = fields.String()
    name = fields.String()
    principal_id = fields.String()
    origin = fields.String()
    scope = fields.Nested(ScopeOut, allow_none=True)
    created_at = Timestamp()
    expires_at = Timestamp(allow_none=True)
    revoked_at = Timestamp(allow_none=True)
    last_used_at = Timestamp(allow_none=True)


class TokenIssued(TokenOut):
    token = fields.String(
        metadata={"description": "The secret; shown only in this response.", "secret": True}
    )


class TokenPage(Schema):
    items = fields.List(fields.Nested(TokenOut))
    next_cursor = fields.String(allow_none=True)


# -- spaces and members -----------------------------------------------------


class SpaceCreate(Schema):
    slug = fields.String(
        required=True,
        validate=[
            Pattern(SLUG_PATTERN, error="2-63 lowercase letters, digits or '-'"),
            validate.NoneOf(RESERVED_SLUGS, error="this slug is reserved"),
        ],
    )
    name = fields.String(load_default=None, validate=validate.Length(min=1, max=200))
    owner_id = fields.String(load_default=None, allow_none=True, validate=validate.Length(max=64))


class SpaceUpdate(Schema):
    name = fields.String(required=True, validate=validate.Length(min=1, max=200))


class SpaceOut(Schema):
    id = fields.String(attribute="public_id")
    slug = fields.String()
    name = fields.String()
    created_at = Timestamp()
    role = fields.String(allow_none=True, metadata={"description": "The caller's role"})


class SpacePage(Schema):
    items = fields.List(fields.Nested(SpaceOut))
    next_cursor = fields.String(allow_none=True)


class MemberPut(Schema):
    role = fields.String(required=True, validate=validate.OneOf(SPACE_ROLES))


class MemberOut(Schema):
    principal_id = fields.String()
    name = fields.String()
    kind = fields.String()
    role = fields.String()
    created_at = Timestamp()


class MemberPage(Schema):
    items = fields.List(fields.Nested(MemberOut))
    next_cursor = fields.String(allow_none=True)


class Health(Schema):
    status = fields.String()
    checks = fields.Dict()


class AttentionTarget(Schema):
    type = fields.String()
    id = fields.String()


class AttentionOut(Schema):
    kind = fields.String(metadata={"description": "A stable dotted code, e.g. lease.lapsed"})
    severity = fields.String(metadata={"description": "warning or critical"})
    summary = fields.String()
    since = fields.Integer(allow_none=True, metadata={"description": "epoch ms"})
    space = fields.String(allow_none=True, metadata={"description": "slug; null: server-wide"})
    role = fields.String(metadata={"description": "the least space role that sees it"})
    target = fields.Nested(AttentionTarget, allow_none=True)


class AttentionList(Schema):
    generated_at = fields.Integer()
    items = fields.List(fields.Nested(AttentionOut))


class GaugeOut(Schema):
    name = fields.String()
    help = fields.String()
    value = fields.Float()
    labels = fields.Dict(keys=fields.String(), values=fields.String())


class ServerOut(Schema):
    version = fields.String()
    engine = fields.String()
    workers = fields.Integer()
    draining = fields.Boolean()
    in_flight = fields.Integer()


class Diagnostics(Schema):
    generated_at = fields.Integer()
    server = fields.Nested(ServerOut)
    facts = fields.List(fields.Nested(GaugeOut))
    attention = fields.List(fields.Nested(AttentionOut))


#: Shared instances for rendering: a schema instance is stateless once built,
#: and building one per response costs more than the dump itself.
PRINCIPAL_OUT = PrincipalOut()
TOKEN_OUT = TokenOut()
SPACE_OUT = SpaceOut()
MEMBER_OUT = MemberOut()
