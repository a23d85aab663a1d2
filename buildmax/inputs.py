"""What the kernel accepts from outside, whatever the route.

Both engines must see the same values: PostgreSQL refuses text containing
NUL and integers beyond 64 bits, SQLite stores the first and overflows on
the second, and a lone UTF-16 surrogate cannot even be encoded as UTF-8.
Such input is refused at the edge (bodies, cursors, path and query values)
so a route never meets it.
"""

from __future__ import annotations

import re
from typing import Any

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_UNSAFE = re.compile("[\x00\ud800-\udfff]")


def unsafe_text(value: str) -> bool:
    """True when ``value`` holds NUL or a lone surrogate."""
    return _UNSAFE.search(value) is not None


def first_unsafe_value(data: Any) -> str | None:
    """A description of the first string or integer in a parsed JSON value
    (keys included) that the engines cannot store alike, or ``None``."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if unsafe_text(item):
                return "a string containing NUL or an unpaired surrogate"
        elif isinstance(item, bool) or item is None or isinstance(item, float):
            continue
        elif isinstance(item, int):
            if not INT64_MIN <= item <= INT64_MAX:
                return "an integer outside the signed 64-bit range"
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None
