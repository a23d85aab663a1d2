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
from marshmallow import EXCLUDE, Schema, fields
from quart import current_app, request

from .bodies import validate
from .inputs import first_unsafe_value
from .problems import BadCursor
from .schemas import BoundedInteger

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


class PageQuery(Schema):
    """The query of every list route (every route answering a page): the
    OpenAPI document lists these for each such route."""

    class Meta:
        unknown = EXCLUDE

    limit = BoundedInteger(
        1,
        lambda app: app.settings.page_size_max,
        text=True,
        metadata={"description": "Items per page (default: the server's page_size_default)"},
    )
    cursor = fields.String(
        metadata={
            "description": "The next_cursor of the previous page, unchanged",
            "maxLength": MAX_CURSOR_LENGTH,
        },
    )


_PAGE_QUERY = PageQuery()


def page_request(key_types: tuple[type, ...] = (str,)) -> PageRequest:
    """Read ``limit`` and ``cursor`` from the query string (:class:`PageQuery`);
    ``key_types`` describes the sort key the route pages by."""
    query = validate(_PAGE_QUERY, dict(request.args))
    limit = query.get("limit") or current_app.settings.page_size_default  # type: ignore[attr-defined]
    cursor = query.get("cursor")
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
