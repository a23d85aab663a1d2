"""The task forms of the board: a new task, an edit, a bulk action. Each is
read into the body of the tasks plugin's route; what a form cannot carry
(a number that is not one) is refused here with the route's own problem
type, and the route checks everything else (lengths, kinds, label and
resource patterns, a prerequisite of another space, a cycle).

An edit sends only the fields that differ from the task as it stands, with
the revision the form was opened at: the route refuses it (409
``revision-conflict``) when the task changed since, and an edit that
changes nothing is not sent (no empty revision, no audit event).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from buildmax.problems import Problem, ValidationFailed

from .web import MultiForm

#: An integer as a form carries it.
_INTEGER = re.compile(r"-?[0-9]{1,9}")
#: Labels and prerequisites are typed separated by commas or white space.
_SEPARATORS = re.compile(r"[\s,]+")
#: Most prerequisites or selected tasks one form names (the route's limit
#: for prerequisites, and a bulk action's).
MAX_REFS = 100
#: Fields an edit may change, in the order the form shows them.
EDITABLE = ("title", "kind", "priority", "labels", "agent", "max_attempts", "body", "criteria")


def _words(text: str) -> list[str]:
    return [w for w in _SEPARATORS.split(text.strip()) if w]


def _text(value: str) -> str:
    """A textarea's text as it was typed: a browser sends its line breaks
    as CR LF (the API keeps what it is given, so an untouched field would
    differ from the task's own)."""
    return value.replace("\r\n", "\n")


def _fields(form: Mapping[str, str], errors: dict[str, list[str]]) -> dict[str, Any]:
    """The task's fields as the form holds them (numbers parsed)."""
    fields: dict[str, Any] = {
        "title": form.get("title", "").strip(),
        "body": _text(form.get("body", "")),
        "criteria": _text(form.get("criteria", "")),
        "labels": sorted(set(_words(form.get("labels", "")))),
        "agent": form.get("agent") or None,
    }
    for name, default in (("priority", "0"), ("max_attempts", "3")):
        value = form.get(name, "").strip() or default
        if _INTEGER.fullmatch(value):
            fields[name] = int(value)
        else:
            errors[name] = ["a whole number"]
    if "kind" in form:
        fields["kind"] = form["kind"]
    return fields


def refused(errors: dict[str, list[str]]) -> Problem:
    """The 422 of fields a form got wrong, named as the API names them."""
    return ValidationFailed("invalid fields: " + ", ".join(sorted(errors)), errors=errors)


def prerequisites(posted: MultiForm) -> list[str]:
    """The prerequisites a form names: the ticked tasks, then the ids typed
    (each once, in order)."""
    typed = _words(" ".join(posted.getlist("more_prerequisites")))
    named = [*posted.getlist("prerequisite"), *typed]
    return list(dict.fromkeys(n for n in named if n))


def create_body(
    form: Mapping[str, str], posted: MultiForm, project: str
) -> tuple[dict[str, Any], Problem | None]:
    """The create route's body for the new-task form, or the problem that
    stops it being sent."""
    errors: dict[str, list[str]] = {}
    body = {"project": project, **_fields(form, errors), "prerequisites": prerequisites(posted)}
    if len(body["prerequisites"]) > MAX_REFS:
        errors["prerequisites"] = [f"at most {MAX_REFS}"]
    return body, refused(errors) if errors else None


def _current(task: Mapping[str, Any]) -> dict[str, Any]:
    """A task's editable fields as the API shows them, as a form names them."""
    return {
        "title": task["title"],
        "kind": task["kind"],
        "priority": task["priority"],
        "labels": sorted(task["labels"]),
        "agent": task["agent_id"],
        "max_attempts": task["max_attempts"],
        "body": task["body"],
        "criteria": task["criteria"],
    }


def update_body(
    form: Mapping[str, str], task: Mapping[str, Any]
) -> tuple[dict[str, Any], Problem | None]:
    """The update route's body for the edit form: the fields that differ
    from ``task`` (the task as it stands), with the revision the form was
    opened at; ``{}`` when nothing differs. A task's kind is fixed once it
    exists, so the form does not offer it."""
    errors: dict[str, list[str]] = {}
    edited = _fields(form, errors)
    edited.pop("kind", None)
    revision = form.get("expected_revision", "")
    if not _INTEGER.fullmatch(revision):
        errors["expected_revision"] = ["reload the page: the form lost its revision"]
    if errors:
        return {}, refused(errors)
    now = _current(task)
    changes = {k: v for k, v in edited.items() if v != now[k]}
    if not changes:
        return {}, None
    body: dict[str, Any] = {"expected_revision": int(revision), **changes}
    if form.get("override_reason", "").strip():
        body["override_reason"] = form["override_reason"].strip()
    return body, None


def form_values(task: Mapping[str, Any] | None, form: Mapping[str, str] | None) -> dict[str, Any]:
    """What a task form shows: what the person posted (shown again with a
    refusal), else the task as it stands, else a new task's defaults."""
    if form is not None:
        return dict(form)
    if task is None:
        return {"kind": "code", "priority": "0", "max_attempts": "3"}
    now = _current(task)
    return {**now, "labels": " ".join(now["labels"]), "agent": now["agent"] or ""}


#: What a space admin may do to many tasks at once.
BULK_ACTIONS = ("hold", "release", "cancel")


def bulk_selection(posted: MultiForm) -> tuple[list[str], Problem | None]:
    """The tasks a bulk form selected (each once), or the problem."""
    chosen = list(dict.fromkeys(t for t in posted.getlist("task") if t))
    if not chosen:
        return [], refused({"task": ["select at least one task"]})
    if len(chosen) > MAX_REFS:
        return [], refused({"task": [f"at most {MAX_REFS} tasks at once"]})
    return chosen, None
