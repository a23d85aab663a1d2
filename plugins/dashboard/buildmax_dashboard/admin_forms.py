"""The administration forms, each read into the body of the API route it
posts to: a new principal, a new token, a member's role, a hold.

The routes check everything (names, kinds, roles, lengths, lifetimes, who
may); a form only turns its fields into the body's types. What a form
cannot carry (a lifetime that is not a number) goes to the route as text,
which refuses it with its own problem.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from buildmax.problems import ValidationFailed

#: A whole number as a form carries it.
_NUMBER = re.compile(r"[0-9]{1,11}")
#: The lifetimes a new token may be given, in seconds ("" never expires),
#: with what the form calls them.
LIFETIMES = (
    ("3600", "1 hour"),
    ("86400", "1 day"),
    ("604800", "7 days"),
    ("2592000", "30 days"),
    ("7776000", "90 days"),
    ("31536000", "1 year"),
    ("", "never"),
)
#: The lifetime a new token's form starts at.
DEFAULT_LIFETIME = "7776000"
#: Fields a refused form shows again as typed (never the password).
_ECHOED = ("kind", "name", "display_name", "system_role", "principal", "role", "reason", "target")
#: What a page says after a change it sent the browser back from.
DONE = {
    "created": "Principal created.",
    "disabled": "Principal disabled: its tokens stop working on the next request.",
    "enabled": "Principal enabled.",
    "revoked": "Token revoked: it stops working on the next request.",
    "saved": "Role saved.",
    "removed": "Member removed.",
    "placed": "Hold placed.",
    "lifted": "Hold lifted.",
}


def _number(value: str) -> int | str | None:
    """A whole number, ``None`` for nothing, anything else as typed."""
    if not value:
        return None
    return int(value) if _NUMBER.fullmatch(value) else value


def principal_body(form: Mapping[str, str]) -> dict[str, Any]:
    """``POST /v1/principals``: a password only when one was typed."""
    body: dict[str, Any] = {
        "kind": form.get("kind", ""),
        "name": form.get("name", "").strip(),
        "display_name": form.get("display_name", "").strip(),
        "system_role": form.get("system_role") or None,
    }
    if form.get("password"):
        body["password"] = form["password"]
    return body


def token_body(form: Mapping[str, str], principal: str | None) -> dict[str, Any]:
    """``POST /v1/tokens``: a name and a lifetime, for ``principal`` (a
    system admin's choice) or for the person."""
    body: dict[str, Any] = {
        "name": form.get("name", "").strip(),
        "expires_in_seconds": _number(form.get("expires_in_seconds", "")),
    }
    if principal is not None:
        body["principal_id"] = principal
    return body


def member_put(form: Mapping[str, str]) -> tuple[str, dict[str, Any]]:
    """The principal (a name or id) and the body of ``PUT
    /v1/spaces/{space}/members/{principal}``; 422 when no principal is
    named (the path would name another route)."""
    principal = member_named(form)
    return principal, {"role": form.get("role", "")}


def member_named(form: Mapping[str, str]) -> str:
    """The principal a member form names; 422 when it names none."""
    principal = form.get("principal", "").strip()
    if not principal:
        raise ValidationFailed(
            "name the principal", errors={"principal": ["A name or id is required."]}
        )
    return principal


def hold_body(form: Mapping[str, str]) -> dict[str, Any]:
    """``POST /v1/spaces/{space}/holds``: on the project the form names,
    or on the whole space when it names none."""
    target = form.get("target") or None
    return {
        "scope": "space" if target is None else "project",
        "target": target,
        "strength": form.get("strength", ""),
        "reason": form.get("reason", "").strip(),
    }


def echo(form: Mapping[str, str]) -> dict[str, str]:
    """What a refused form shows again as typed (never a password)."""
    return {key: form[key] for key in _ECHOED if key in form}


def done(value: str | None) -> str | None:
    """The notice of a ``done`` query the pages set (``None`` for others)."""
    return DONE.get(value or "")
