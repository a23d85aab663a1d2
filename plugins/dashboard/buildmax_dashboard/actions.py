"""What a person may do to a task from its page, each performed by the
tasks plugin's own route as that person: the route checks the role (a
member cancels; a space admin retries, holds, lifts a hold and cancels
another's attempt, with the reason as its override), validates, audits.

An action is a name in the path; its form's fields become the route's body.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from buildmax.problems import NotFound

from .web import seg

#: An action's route (under the space) and body, from the task's id and
#: the posted form.
Call = tuple[str, dict[str, Any]]
#: A number a form field may hold (anything else goes to the route as text,
#: which refuses it).
_NUMBER = re.compile(r"[0-9]{1,11}")


def _cancel(task: str, form: Mapping[str, str]) -> Call:
    reason = form.get("reason", "")
    body: dict[str, Any] = {"reason": reason}
    if form.get("override"):
        body["override_reason"] = reason
    return f"/tasks/{seg(task)}/cancel", body


def _retry(task: str, form: Mapping[str, str]) -> Call:
    return f"/tasks/{seg(task)}/retry", {}


def _hold(task: str, form: Mapping[str, str]) -> Call:
    return "/holds", {
        "scope": "task",
        "target": task,
        "strength": form.get("strength", ""),
        "reason": form.get("reason", ""),
    }


def _lift(task: str, form: Mapping[str, str]) -> Call:
    return f"/holds/{seg(form.get('hold', ''))}/lift", {}


def _cancel_attempt(task: str, form: Mapping[str, str]) -> Call:
    generation = form.get("generation", "")
    reason = form.get("reason", "")
    return f"/attempts/{seg(form.get('attempt', ''))}/cancel", {
        "generation": int(generation) if _NUMBER.fullmatch(generation) else generation,
        "reason": reason,
        "override_reason": reason,
    }


#: The actions a task page offers, by the name in their path.
ACTIONS: dict[str, Callable[[str, Mapping[str, str]], Call]] = {
    "cancel": _cancel,
    "retry": _retry,
    "hold": _hold,
    "lift": _lift,
    "cancel-attempt": _cancel_attempt,
}


def call_for(action: str, task: str, form: Mapping[str, str]) -> Call:
    """The route (under the space) and body of ``action`` on ``task``; 404
    for an action the dashboard does not offer."""
    build = ACTIONS.get(action)
    if build is None:
        raise NotFound("no such action")
    return build(task, form)
