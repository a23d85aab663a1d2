"""What the fixtures hand out and watch: principal and space handles, the
audit recorder, and the watch for secrets in logs and stored rows."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ..app import BuildMax


@dataclass(frozen=True)
class PrincipalHandle:
    """A principal made for a test, with a working token."""

    pk: int
    id: str
    name: str
    kind: str
    token: str

    @property
    def headers(self) -> dict[str, str]:
        """``Authorization`` header for this principal's token."""
        return {"Authorization": f"Bearer {self.token}"}


@dataclass(frozen=True)
class SpaceHandle:
    """A space made for a test."""

    pk: int
    id: str
    slug: str


#: Secrets shorter than this are not looked for (they would match by chance).
MIN_WATCHED_SECRET = 8

#: Nor are secrets of fewer distinct characters: a generated password of
#: eight zeros is inside every audit chain's genesis hash (64 zeros).
MIN_WATCHED_DISTINCT = 3

#: The audit trail's tables (every plugin's tables carry its prefix).
_AUDIT_TABLES = {
    "sqlite": "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'audit\\_%' "
    "ESCAPE '\\'",
    "postgresql": "SELECT tablename AS name FROM pg_tables WHERE schemaname = current_schema() "
    "AND tablename LIKE 'audit\\_%' ESCAPE '\\'",
}


class SecretWatch:
    """Every secret a test's server minted (token secrets) or was sent
    (values of request fields marked ``metadata={"secret": True}``)."""

    def __init__(self) -> None:
        self.values: set[str] = set()

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Start watching ``buildmax.tokens.new_secret`` and request bodies."""
        from .. import bodies, tokens

        mint, validate = tokens.new_secret, bodies.validate

        def new_secret() -> str:
            secret = mint()
            self.values.add(secret)
            return secret

        def watched_validate(schema: Any, payload: Any) -> dict[str, Any]:
            if isinstance(payload, dict):
                for name, field in schema.fields.items():
                    value = payload.get(field.data_key or name)
                    if field.metadata.get("secret") and isinstance(value, str):
                        self.values.add(value)
            return validate(schema, payload)

        monkeypatch.setattr(tokens, "new_secret", new_secret)
        monkeypatch.setattr(bodies, "validate", watched_validate)

    def _watched(self) -> set[str]:
        """The watched secrets, as written and as they read inside JSON."""
        watched = [
            v
            for v in self.values
            if len(v) >= MIN_WATCHED_SECRET and len(set(v)) >= MIN_WATCHED_DISTINCT
        ]
        return {*watched, *(json.dumps(v, ensure_ascii=False)[1:-1] for v in watched)}

    def found_in(self, text: str) -> list[str]:
        """``"<secret prefix>..."`` for every watched secret in ``text``."""
        return [f"{s[:6]}..." for s in self._watched() if s in text]

    async def found_in_audit_tables(self, app: BuildMax) -> list[str]:
        """``"<table>: <secret prefix>..."`` for every watched secret an
        audit table holds anywhere in a row."""
        import sqlalchemy as sa

        # As written, and as it reads inside stored JSON (quotes, backslashes
        # and control characters escaped).
        secrets_ = self._watched()
        found = []
        # Every row of every audit table: a long read, off the event loop.
        async with app.db.read(background=True) as conn:
            names = [r["name"] for r in await conn.fetch_all(sa.text(_AUDIT_TABLES[conn.dialect]))]
            for name in names:
                for row in await conn.fetch_all(sa.text(f'SELECT * FROM "{name}"')):
                    text = " ".join(str(value) for value in row.values())
                    found += [f"{name}: {s[:6]}..." for s in secrets_ if s in text]
        return found


class LogWatch(logging.Handler):
    """Every record the server logs during a test, at every level, formatted
    as the server's log would print it (message and traceback)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self._formatter = logging.Formatter("%(levelname)s %(name)s: %(message)s")

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self._formatter.format(record))
        fields = getattr(record, "fields", None)
        if fields:
            self.lines.append(json.dumps(fields, default=str))

    @contextlib.contextmanager
    def watching(self) -> Iterator[LogWatch]:
        """Collect every record of the BuildMax loggers (at DEBUG and up)
        while the block runs."""
        root, kernel = logging.getLogger(), logging.getLogger("buildmax")
        level = kernel.level
        kernel.setLevel(logging.DEBUG)
        root.addHandler(self)
        try:
            yield self
        finally:
            root.removeHandler(self)
            kernel.setLevel(level)


class AuditRecorder:
    """A plugin that keeps every audit event handed to ``buildmax_audit_record``."""

    def __init__(self) -> None:
        self.events: list[Any] = []

    def actions(self) -> list[str]:
        """The recorded actions, in order."""
        return [event.action for event in self.events]

    def of(self, action: str, target_id: str | None = None) -> list[Any]:
        """The recorded events of ``action`` (about ``target_id``, when given)."""
        return [
            event
            for event in self.events
            if event.action == action and (target_id is None or event.target_id == target_id)
        ]
