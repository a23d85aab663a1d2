"""schemathesis hooks of the `schema` tox env: every answer's status, by
operation, appended to the file ``BUILDMAX_SCHEMA_STATUSES`` names (one JSON
line each), for ``schema_run.py`` to count the operations that reached a 2xx.
The method actually sent is kept too: some checks send another method to
the operation's path (``OPTIONS``, ``TRACE``)."""

from __future__ import annotations

import json
import os
from typing import Any

import schemathesis


@schemathesis.hook
def after_call(context: Any, case: Any, response: Any) -> None:
    """Record ``[method, path template, method sent, status]``."""
    operation = case.operation
    sent = response.request.method.upper()
    line = json.dumps([operation.method.upper(), operation.path, sent, response.status_code])
    with open(os.environ["BUILDMAX_SCHEMA_STATUSES"], "a", encoding="utf-8") as log:
        log.write(line + "\n")
