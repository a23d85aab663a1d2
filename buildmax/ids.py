"""Opaque random public ids.

Numeric keys never leave the server; every record has a public id such as
``sp_3kTq9x...``: a short type prefix and 128 bits of randomness.
"""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    """A new public id with the given type prefix (``sp``, ``pr``, ``tk``...)."""
    return f"{prefix}_{secrets.token_urlsafe(16)}"
