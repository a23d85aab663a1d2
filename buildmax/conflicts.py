"""``INSERT ... ON CONFLICT DO NOTHING`` on both engines.

A unique violation inside a PostgreSQL transaction aborts it, so inserts
that may collide use this instead of catching an error.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite


def insert_ignoring_conflict(dialect: str, table: sa.Table) -> Any:
    """An insert into ``table`` that silently skips rows violating a unique key.

    Chain ``.values(...).returning(...)``: no row comes back when skipped."""
    if dialect == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    return sqlite.insert(table).on_conflict_do_nothing()
