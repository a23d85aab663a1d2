"""What a route declares: read by the kernel that applies it
(:func:`buildmax.apidoc.api`), the OpenAPI document and the idempotency
layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from marshmallow import Schema
from quart import current_app, request


@dataclass(frozen=True)
class RouteDoc:
    """What :func:`buildmax.apidoc.api` records on a view."""

    summary: str
    body: type[Schema] | None
    response: type[Schema] | None
    status: int
    auth: bool
    scopes: tuple[str, ...]
    #: The space role the caller needs in the ``<space>`` of the path, and
    #: the action ``buildmax_permission`` is asked about.
    role: str | None
    action: str | None
    #: System roles of which the caller needs one (empty: any caller).
    system_roles: tuple[str, ...]
    idempotent: bool
    not_idempotent: str | None
    #: Body fields left out of an idempotency receipt's fingerprint.
    secret_fields: tuple[str, ...]
    tags: tuple[str, ...]
    content_type: str
    body_type: str
    query: type[Schema] | None
    headers: type[Schema] | None
    also: tuple[tuple[int, str], ...]


def route_doc(view: Any) -> RouteDoc | None:
    """The declaration of ``view``, if it has one."""
    return getattr(view, "__buildmax_api__", None)


def current_route_doc() -> RouteDoc | None:
    """The declaration of the view serving this request."""
    endpoint = request.endpoint
    return route_doc(current_app.view_functions.get(endpoint)) if endpoint else None
