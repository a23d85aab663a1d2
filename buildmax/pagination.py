"""Cursor pagination: opaque cursors, a default and a maximum page size.

A cursor encodes the sort key of the last item of the previous page
(never a numeric database key). A client passes it back unchanged.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from quart import request

from .inputs import first_unsafe_value
from .problems import BadCursor, ValidationFailed

#: Longer than any cursor this server issues.
MAX_CURSOR_LENGTH = 1024


@dataclass(frozen=True)
class PageRequest:
    """What the client asked for: how many, and after which key."""

    limit: int
    after: list[Any] | None


def encode_cursor(key: list[Any]) -> str:
    """An opaque cursor for a sort key."""
    raw = json.dumps(key, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, key_types: tuple[type, ...]) -> list[Any]:
    """The sort key inside ``cursor``, checked against ``key_types`` (``str``
    or ``int`` per position); :class:`BadCursor` if it is not one of ours."""
    refused = BadCursor("the cursor is not one this server issued")
    if len(cursor) > MAX_CURSOR_LENGTH:
        raise refused
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        key = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")))
    except (ValueError, UnicodeError, binascii.Error, RecursionError):
        raise refused from None
    if not isinstance(key, list) or len(key) != len(key_types):
        raise refused
    for part, kind in zip(key, key_types, strict=True):
        if type(part) is not kind:
            raise refused
    if first_unsafe_value(key) is not None:
        raise refused
    return key


def page_request(default: int, maximum: int, key_types: tuple[type, ...] = (str,)) -> PageRequest:
    """Read ``limit`` and ``cursor`` from the query string; ``key_types``
    describes the sort key the route pages by."""
    raw_limit = request.args.get("limit")
    limit = default
    if raw_limit is not None:
        try:
            limit = int(raw_limit)
        except ValueError:
            raise ValidationFailed(
                "limit must be an integer", errors={"limit": ["Not a valid integer."]}
            ) from None
        if not 1 <= limit <= maximum:
            raise ValidationFailed(
                f"limit must be between 1 and {maximum}",
                errors={"limit": [f"Must be between 1 and {maximum}."]},
            )
    cursor = request.args.get("cursor")
    after = decode_cursor(cursor, key_types) if cursor else None
    return PageRequest(limit, after)


def older_than(table: Any, public_id: str) -> Any:
    """Rows of ``table`` written before the row ``public_id``: the keyset
    condition of a newest-first page whose cursor names the last row shown
    by its public id (its numeric key never leaves the server)."""
    return (
        table.c.id < sa.select(table.c.id).where(table.c.public_id == public_id).scalar_subquery()
    )


def page_body(items: list[dict[str, Any]], rows: list[Any], limit: int, key: Any) -> dict[str, Any]:
    """``{"items": [...], "next_cursor": ...}`` from ``limit + 1`` fetched rows.

    ``key(row)`` gives the sort key of a row; ``next_cursor`` is ``None`` on
    the last page.
    """
    has_more = len(rows) > limit
    next_cursor = encode_cursor(list(key(rows[limit - 1]))) if has_more else None
    return {"items": items[:limit], "next_cursor": next_cursor}
