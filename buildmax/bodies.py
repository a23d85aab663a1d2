"""JSON request bodies and responses, validated by marshmallow schemas."""

from __future__ import annotations

import json
from typing import Any

from marshmallow import Schema
from marshmallow import ValidationError as MarshmallowValidationError
from quart import Response, request
from werkzeug.exceptions import RequestEntityTooLarge

from .inputs import first_unsafe_value
from .problems import MalformedJSON, PayloadTooLarge, UnsupportedMediaType, ValidationFailed


async def raw_body() -> bytes:
    """The request body, refused with 413 as soon as it passes the size limit."""
    try:
        return await request.get_data(cache=True, as_text=False, parse_form_data=False)
    except RequestEntityTooLarge:
        raise PayloadTooLarge(
            f"the body exceeds the limit of {request.max_content_length} bytes"
        ) from None


async def json_body() -> Any:
    """The request body parsed as JSON (``{}`` when empty)."""
    data = await raw_body()
    if not data.strip():
        return {}
    mimetype = request.mimetype
    if mimetype and mimetype != "application/json" and not mimetype.endswith("+json"):
        raise UnsupportedMediaType(f"expected application/json, got {mimetype}")
    try:
        payload = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise MalformedJSON(f"the body is not valid JSON: {exc}") from None
    except RecursionError:
        raise MalformedJSON("the body is nested too deeply") from None
    unsafe = first_unsafe_value(payload)
    if unsafe is not None and unsafe.integer:
        # Valid JSON holding a number no column takes: a value out of range,
        # refused like any other, naming where it is.
        where = ".".join(unsafe.path) or "the body"
        raise ValidationFailed(
            f"{where} is {unsafe.problem}",
            errors=unsafe.errors("Not within the signed 64-bit range."),
        )
    if unsafe is not None:
        raise MalformedJSON(f"the body contains {unsafe.problem}")
    return payload


async def load_body(schema: Schema) -> dict[str, Any]:
    """Parse and validate the body; 422 with per-field errors when invalid."""
    payload = await json_body()
    if not isinstance(payload, dict):
        raise ValidationFailed(
            "the body must be a JSON object", errors={"_schema": ["not an object"]}
        )
    return validate(schema, payload)


def validate(schema: Schema, payload: Any) -> dict[str, Any]:
    """Validate ``payload`` (a body or query arguments) with ``schema``."""
    try:
        loaded = schema.load(payload)
    except MarshmallowValidationError as exc:
        raise ValidationFailed(_summary(exc.messages), errors=exc.messages) from None
    return loaded  # type: ignore[no-any-return]


def _summary(messages: Any) -> str:
    if isinstance(messages, dict):
        fields = ", ".join(sorted(str(k) for k in messages))
        return f"invalid fields: {fields}"
    return "the request did not validate"


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """A compact JSON response."""
    return Response(
        json.dumps(body, separators=(",", ":"), ensure_ascii=False),
        status=status,
        headers=headers,
        content_type="application/json",
    )
