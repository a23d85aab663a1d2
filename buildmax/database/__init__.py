"""The kernel's database interface: one API, two engines.

Plugins write SQLAlchemy Core statements once and run them with
``async with app.db.write() as tx`` (a serialised write transaction on
SQLite, a pooled row-locking transaction on PostgreSQL) or
``async with app.db.read() as conn`` (autocommit reads).
"""

from __future__ import annotations

from .base import Database, DatabaseError, DatabaseLogFull, NestedTransactionError
from .engines import open_database

__all__ = [
    "Database",
    "DatabaseError",
    "DatabaseLogFull",
    "NestedTransactionError",
    "open_database",
]
