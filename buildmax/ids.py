"""Opaque random public ids.

Numeric keys never leave the server; every record has a public id such as
``sp_3kTq9x...``: a short type prefix and 128 bits of randomness.
"""

from __future__ import annotations

import re
import secrets

_ID = re.compile(r"^[a-z]{2,4}_[A-Za-z0-9_-]{22}$")


def new_id(prefix: str) -> str:
    """A new public id with the given type prefix (``sp``, ``pr``, ``tk``...)."""
    return f"{prefix}_{secrets.token_urlsafe(16)}"


def looks_like_id(value: str, prefix: str | None = None) -> bool:
    """Cheap syntactic check, so a malformed id is a 404 without a query."""
    if not _ID.match(value):
        return False
    return prefix is None or value.startswith(prefix + "_")
