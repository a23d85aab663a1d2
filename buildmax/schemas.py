"""marshmallow schemas of the kernel's request bodies and responses."""

from __future__ import annotations

from typing import Any

from marshmallow import Schema, fields, validate

from .clock import to_rfc3339
from .roles import PRINCIPAL_KINDS, SPACE_ROLES, SYSTEM_ROLES

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,63}\Z"
SLUG_PATTERN = r"^[a-z0-9][a-z0-9-]{1,62}\Z"
MAX_TOKEN_LIFETIME = 10 * 365 * 24 * 3600


class Timestamp(fields.Field[Any]):
    """UTC epoch milliseconds inside, RFC 3339 outside."""

    def _serialize(self, value: Any, attr: Any, obj: Any, **kwargs: Any) -> str | None:
        return to_rfc3339(value)


# -- principals -------------------------------------------------------------


#: Names that would collide with route words (``/v1/principals/me``).
RESERVED_NAMES = ("me",)
#: Slugs with another meaning (``system`` names the audit trail's system chain).
RESERVED_SLUGS = ("system",)


class PrincipalCreate(Schema):
    kind = fields.String(required=True, validate=validate.OneOf(PRINCIPAL_KINDS))
    name = fields.String(
        required=True,
        validate=[
            validate.Regexp(NAME_PATTERN, error="lowercase letters, digits, '.', '_', '-'"),
            validate.NoneOf(RESERVED_NAMES, error="this name is reserved"),
        ],
    )
    display_name = fields.String(load_default="", validate=validate.Length(max=200))
    system_role = fields.String(
        load_default=None, allow_none=True, validate=validate.OneOf(SYSTEM_ROLES)
    )
    password = fields.String(
        load_default=None, allow_none=True, load_only=True, metadata={"secret": True}
    )


class PrincipalUpdate(Schema):
    display_name = fields.String(validate=validate.Length(max=200))
    system_role = fields.String(allow_none=True, validate=validate.OneOf(SYSTEM_ROLES))
    disabled = fields.Boolean(truthy={True}, falsy={False})
    password = fields.String(load_only=True, metadata={"secret": True})
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
    expires_in_seconds = fields.Integer(
        load_default=None,
        allow_none=True,
        strict=True,
        validate=validate.Range(min=60, max=MAX_TOKEN_LIFETIME),
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
            validate.Regexp(SLUG_PATTERN, error="2-63 lowercase letters, digits or '-'"),
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


#: Shared instances for rendering: a schema instance is stateless once built,
#: and building one per response costs more than the dump itself.
PRINCIPAL_OUT = PrincipalOut()
TOKEN_OUT = TokenOut()
SPACE_OUT = SpaceOut()
MEMBER_OUT = MemberOut()
