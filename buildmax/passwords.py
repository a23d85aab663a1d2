"""Password hashing with Argon2id, for human sign-in only.

Argon2 costs about 100 ms per verification at library defaults, so it is
used at sign-in, never per request (API tokens use a SHA-256 verifier).
"""

from __future__ import annotations

import asyncio
import functools

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from .admission import stepped_out

_hasher = PasswordHasher()

MIN_LENGTH = 12
MAX_LENGTH = 1024


@functools.cache
def _dummy_hash() -> str:
    """Verified against when the principal does not exist, so timing does not
    reveal which names exist."""
    return _hasher.hash("buildmax-dummy-password")


def prepare() -> None:
    """Make the dummy hash now, so that the first sign-in naming nobody
    takes no longer than the others. Server processes call it as they
    start; a command that signs nobody in never pays for it."""
    _dummy_hash()


def check_password_rules(password: str) -> str | None:
    """Why ``password`` is unacceptable, or ``None`` if it is fine."""
    if len(password) < MIN_LENGTH:
        return f"a password needs at least {MIN_LENGTH} characters"
    if len(password) > MAX_LENGTH:
        return f"a password may have at most {MAX_LENGTH} characters"
    return None


async def hash_password(password: str) -> str:
    """An Argon2id hash, computed off the event loop."""
    async with stepped_out():
        return await asyncio.to_thread(_hasher.hash, password)


async def verify_password(stored_hash: str | None, password: str) -> bool:
    """True when ``password`` matches; constant work when there is no hash."""

    def verify() -> bool:
        try:
            matches = _hasher.verify(stored_hash or _dummy_hash(), password)
            return matches and stored_hash is not None
        except (VerificationError, InvalidHashError):
            return False

    async with stepped_out():
        return await asyncio.to_thread(verify)
