"""What the kernel accepts from outside, whatever the route.

Both engines must see the same values: PostgreSQL refuses text containing
NUL and integers beyond 64 bits, SQLite stores the first and overflows on
the second, and a lone UTF-16 surrogate cannot even be encoded as UTF-8.
Such input is refused at the edge (bodies, cursors, path and query values)
so a route never meets it: text as malformed (400), an integer beyond 64
bits as a value out of range (422). Each integer a route takes is bounded
further, by what its column holds (``buildmax.schemas.BoundedInteger``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: What an ``Integer`` column holds on PostgreSQL (SQLite's hold 64 bits):
#: the bound of every input stored in, or compared with, such a column.
INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1

#: An ``Idempotency-Key``: 1 to 200 printable ASCII characters.
IDEMPOTENCY_KEY_PATTERN = r"^[\x21-\x7e]{1,200}$"

_UNSAFE = re.compile("[\x00\ud800-\udfff]")


def unsafe_text(value: str) -> bool:
    """True when ``value`` holds NUL or a lone surrogate."""
    return _UNSAFE.search(value) is not None


@dataclass(frozen=True)
class UnsafeValue:
    """A value in parsed JSON that the engines cannot store alike."""

    #: What it is, for a message: "a string containing NUL ...".
    problem: str
    #: The keys and list positions leading to it (empty: the value itself).
    path: tuple[str, ...]
    #: An integer beyond 64 bits (a value out of range), rather than text no
    #: engine stores alike (a malformed document).
    integer: bool

    def errors(self, message: str) -> dict[str, Any]:
        """``message`` at :attr:`path`, nested like marshmallow's errors
        (``{"findings": {"0": {"line": [message]}}}``)."""
        errors: Any = [message]
        for part in reversed(self.path):
            errors = {part: errors}
        return errors if isinstance(errors, dict) else {"_schema": errors}


def first_unsafe_value(data: Any) -> UnsafeValue | None:
    """A string or integer in a parsed JSON value (keys included) that the
    engines cannot store alike, or ``None``. Text comes first: a path to a
    number may only be reported when every key on it is safe text."""
    integer: UnsafeValue | None = None
    stack: list[tuple[Any, tuple[str, ...]]] = [(data, ())]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if unsafe_text(item):
                return UnsafeValue("a string containing NUL or an unpaired surrogate", path, False)
        elif isinstance(item, bool) or item is None or isinstance(item, float):
            continue
        elif isinstance(item, int):
            if integer is None and not INT64_MIN <= item <= INT64_MAX:
                integer = UnsafeValue("an integer outside the signed 64-bit range", path, True)
        elif isinstance(item, dict):
            stack.extend((key, path) for key in item)
            stack.extend((value, (*path, str(key))) for key, value in item.items())
        elif isinstance(item, list):
            stack.extend((value, (*path, str(i))) for i, value in enumerate(item))
    return integer
