"""The human review form: its fields read into the body of the reviews
plugin's record route, and echoed back when the route refuses it.

A finding is a row of four fields (``finding_path``, ``finding_line``,
``finding_severity``, ``finding_text``), repeated; a row left empty is
ignored. What the form cannot carry (a line that is not a number) is
refused here with the route's own problem type; the route checks
everything else (decisions, severities, texts and their lengths, that a
request for changes has a finding, that a rejection says why).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from itertools import zip_longest
from typing import Any

from buildmax.problems import Problem, ValidationFailed

from .web import MultiForm

#: A line number as a form carries it.
_LINE = re.compile(r"[0-9]{1,9}")
#: Most finding rows read from one form (the route allows 100 findings).
MAX_ROWS = 100
_ROW_FIELDS = ("finding_path", "finding_line", "finding_severity", "finding_text")


def _rows(posted: MultiForm) -> list[dict[str, str]]:
    columns = [posted.getlist(name)[: MAX_ROWS + 1] for name in _ROW_FIELDS]
    rows = []
    for path, line, severity, text in zip_longest(*columns, fillvalue=""):
        row = {
            "path": path.strip(),
            "line": line.strip(),
            "severity": severity,
            "text": text.strip(),
        }
        if row["path"] or row["line"] or row["text"]:
            rows.append(row)
    return rows


def review_body(
    form: Mapping[str, str], posted: MultiForm
) -> tuple[dict[str, Any], Problem | None]:
    """The record route's body for the posted form (a human review), or the
    problem that stops it being sent."""
    findings: list[dict[str, Any]] = []
    errors: dict[str, list[str]] = {}
    rows = _rows(posted)
    if len(rows) > MAX_ROWS:
        errors["findings"] = [f"at most {MAX_ROWS} findings"]
    for number, row in enumerate(rows[:MAX_ROWS], start=1):
        finding: dict[str, Any] = {"severity": row["severity"] or "minor", "text": row["text"]}
        if row["path"]:
            finding["path"] = row["path"]
        if row["line"]:
            if not _LINE.fullmatch(row["line"]):
                errors[f"finding {number}"] = ["the line is a number"]
            else:
                finding["line"] = int(row["line"])
        findings.append(finding)
    body = {
        "decision": form.get("decision", ""),
        "summary": form.get("summary", ""),
        "findings": findings,
        "human": True,
    }
    if errors:
        return body, ValidationFailed("invalid fields: " + ", ".join(sorted(errors)), errors=errors)
    return body, None


def echo(form: Mapping[str, str], posted: MultiForm) -> dict[str, Any]:
    """What the person filled in, to show the form again as it was."""
    return {
        "decision": form.get("decision", ""),
        "summary": form.get("summary", ""),
        "findings": _rows(posted)[:MAX_ROWS],
    }
