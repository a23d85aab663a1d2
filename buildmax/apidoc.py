"""Route documentation and the OpenAPI 3 document built from it.

Decorate a view with :func:`api` to give it a summary and its schemas; the
OpenAPI document at ``/v1/openapi.json`` is built from the app's routes, so a
plugin's routes appear there as soon as its blueprint is registered.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from marshmallow import Schema

F = TypeVar("F", bound=Callable[..., Any])

_PARAM = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")


@dataclass(frozen=True)
class RouteDoc:
    """What :func:`api` records on a view."""

    summary: str
    body: type[Schema] | None
    response: type[Schema] | None
    status: int
    auth: bool
    scopes: tuple[str, ...]
    idempotent: bool
    tags: tuple[str, ...]
    content_type: str


def api(
    summary: str,
    *,
    body: type[Schema] | None = None,
    response: type[Schema] | None = None,
    status: int = 200,
    auth: bool = True,
    scopes: Iterable[str] = (),
    idempotent: bool = False,
    tags: Iterable[str] = (),
    content_type: str = "application/json",
) -> Callable[[F], F]:
    """Document a view for the OpenAPI document."""

    def mark(view: F) -> F:
        view.__buildmax_api__ = RouteDoc(  # type: ignore[attr-defined]
            summary,
            body,
            response,
            status,
            auth,
            tuple(scopes),
            idempotent,
            tuple(tags),
            content_type,
        )
        return view

    return mark


_PROBLEM = {
    "description": "An error (application/problem+json)",
    "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
}


def build_openapi(app: Any, title: str, version: str) -> dict[str, Any]:
    """The OpenAPI 3 document of every documented route of ``app``."""
    spec = APISpec(
        title=title, version=version, openapi_version="3.0.3", plugins=[MarshmallowPlugin()]
    )
    spec.components.security_scheme("bearer", {"type": "http", "scheme": "bearer"})
    spec.components.schema(
        "Problem",
        {
            "type": "object",
            "properties": {
                "type": {"type": "string"},
                "title": {"type": "string"},
                "status": {"type": "integer"},
                "detail": {"type": "string"},
                "instance": {"type": "string"},
                "request_id": {"type": "string"},
            },
        },
    )
    paths: dict[str, dict[str, Any]] = {}
    for rule in app.url_map.iter_rules():
        view = app.view_functions.get(rule.endpoint)
        doc: RouteDoc | None = getattr(view, "__buildmax_api__", None)
        if doc is None:
            continue
        path = _PARAM.sub(r"{\1}", rule.rule)
        params = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in _PARAM.findall(rule.rule)
        ]
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            paths.setdefault(path, {})[method.lower()] = _operation(doc, params, view)
    for path, operations in sorted(paths.items()):
        spec.path(path=path, operations=operations)
    return spec.to_dict()


def _operation(doc: RouteDoc, params: list[dict[str, Any]], view: Any) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "summary": doc.summary,
        "description": (view.__doc__ or "").strip(),
        "parameters": list(params),
        "responses": {"default": _PROBLEM},
    }
    if doc.tags:
        operation["tags"] = list(doc.tags)
    if doc.auth:
        operation["security"] = [{"bearer": []}]
    if doc.scopes:
        operation["x-token-scopes"] = list(doc.scopes)
    if doc.idempotent:
        operation["parameters"].append(
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "schema": {"type": "string"},
            }
        )
    if doc.body is not None:
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": doc.body}},
        }
    success: dict[str, Any] = {"description": doc.summary}
    if doc.response is not None:
        success["content"] = {doc.content_type: {"schema": doc.response}}
    operation["responses"][str(doc.status)] = success
    return operation
