"""The server's log: one line per record, readable text or JSON.

``log_format = "json"`` writes one JSON object per line (``time``,
``level``, ``logger``, ``message``, the record's structured ``fields`` and,
for an error, ``exception``), which log shippers read without a parser of
their own. Every request is logged once, by :mod:`buildmax.app`, under
``buildmax.requests``: its request id, method, route template, status,
duration and client address, never its query, body or headers, so no token,
password or task text reaches the log through it.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

#: Loggers that print SQL parameters (password hashes, token verifiers) at
#: DEBUG: never below INFO, whatever ``log_level`` says.
_PARAMETER_LOGGERS = ("aiosqlite", "databases", "asyncpg")

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: The attribute of a record holding its structured fields (``extra=``).
FIELDS = "fields"


def apply_log_level(level: str) -> None:
    """Set the process's log level from the ``log_level`` setting."""
    logging.getLogger().setLevel(level.upper())
    for name in _PARAMETER_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.INFO, logging.getLevelName(level.upper())))


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, FIELDS, None)
        if isinstance(fields, dict):
            entry.update({k: v for k, v in fields.items() if k not in entry})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: str) -> None:
    """Send every record to standard error, in ``log_format`` (``text`` or
    ``json``), at ``level``: the one handler of the process."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    )
    root = logging.getLogger()
    root.handlers = [handler]
    apply_log_level(level)
