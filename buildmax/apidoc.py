"""Route declarations and the OpenAPI 3 document built from them.

Decorate a view with :func:`api` to declare what it takes and answers. The
kernel enforces the declaration and the document at ``/v1/openapi.json``
shows it, so the two cannot drift apart: the body and query schemas are the
ones the route validates with, the ``Idempotency-Key`` header is honoured
exactly where the route says so (:mod:`buildmax.idempotency`), and the page
parameters of a list route are those :func:`buildmax.pagination.page_request`
reads. A plugin's routes appear as soon as its blueprint is registered.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from marshmallow import Schema, fields
from quart import current_app, request

from .bodies import validate
from .inputs import IDEMPOTENCY_KEY_PATTERN
from .pagination import PageQuery
from .schemas import Timestamp

if TYPE_CHECKING:
    from .app import BuildMax

F = TypeVar("F", bound=Callable[..., Any])

_PARAM = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")
#: The request body of a route that takes a JSON body.
JSON = "application/json"


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
    not_idempotent: str | None
    tags: tuple[str, ...]
    content_type: str
    body_type: str
    query: type[Schema] | None
    headers: type[Schema] | None
    also: tuple[tuple[int, str], ...]


def api(
    summary: str,
    *,
    body: type[Schema] | None = None,
    response: type[Schema] | None = None,
    status: int = 200,
    auth: bool = True,
    scopes: Iterable[str] = (),
    idempotent: bool = False,
    not_idempotent: str | None = None,
    tags: Iterable[str] = (),
    content_type: str = JSON,
    body_type: str = JSON,
    query: type[Schema] | None = None,
    headers: type[Schema] | None = None,
    also: Mapping[int, str] | None = None,
) -> Callable[[F], F]:
    """Declare a view.

    ``body`` is the schema of its JSON body; a route that reads raw bytes
    names their media type in ``body_type`` instead. ``content_type`` is the
    media type of its success answer, ``status`` that answer's status and
    ``also`` any other success status (with what it means) answered with
    the same body. ``query`` and ``headers`` are schemas of the query
    parameters and request headers it reads. ``idempotent`` routes honour
    ``Idempotency-Key``; a mutating route that cannot says why in
    ``not_idempotent`` (the API guide lists them, and a test walks the
    route table for any that does neither).
    """
    if idempotent and not_idempotent:
        raise ValueError(f"{summary!r}: a route is idempotent or says why not, not both")

    def mark(view: F) -> F:
        view.__buildmax_api__ = RouteDoc(  # type: ignore[attr-defined]
            summary,
            body,
            response,
            status,
            auth,
            tuple(scopes),
            idempotent,
            not_idempotent,
            tuple(tags),
            content_type,
            body_type,
            query,
            headers,
            tuple(sorted((also or {}).items())),
        )
        return view

    return mark


def route_doc(view: Any) -> RouteDoc | None:
    """The declaration of ``view``, if it has one."""
    return getattr(view, "__buildmax_api__", None)


def current_route_doc() -> RouteDoc | None:
    """The declaration of the view serving this request."""
    endpoint = request.endpoint
    return route_doc(current_app.view_functions.get(endpoint)) if endpoint else None


def query_args() -> dict[str, Any]:
    """The query parameters of this request, validated with the route's
    ``query`` schema (422 naming each bad one); only those it declares."""
    doc = current_route_doc()
    if doc is None or doc.query is None:
        raise RuntimeError(f"{request.endpoint} declares no query schema")
    return validate(doc.query(), dict(request.args))


def header_args() -> dict[str, Any]:
    """The request headers the route's ``headers`` schema declares, validated
    (422 naming each bad one)."""
    doc = current_route_doc()
    if doc is None or doc.headers is None:
        raise RuntimeError(f"{request.endpoint} declares no header schema")
    schema = doc.headers()
    wanted = {field.data_key or name for name, field in schema.fields.items()}
    return validate(schema, {key: request.headers[key] for key in wanted if key in request.headers})


_PROBLEM = {
    "description": "An error (application/problem+json)",
    "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}},
}


#: Every JSON value but null: what a raw field that refuses null takes.
_NOT_NULL = [{"type": kind} for kind in ("object", "array", "string", "number", "boolean")]


def _any_but_null(
    converter: Any, field: fields.Field[Any], ret: dict[str, Any], **_: Any
) -> dict[str, Any]:
    """A raw field (any JSON value) that refuses null says so: an empty
    schema would let a client send null and be refused."""
    if type(field) is fields.Raw and not field.allow_none and "type" not in ret:
        return {"anyOf": _NOT_NULL}
    return {}


def build_openapi(app: BuildMax, title: str, version: str) -> dict[str, Any]:
    """The OpenAPI 3 document of every declared route of ``app``."""
    marshmallow = MarshmallowPlugin()
    spec = APISpec(title=title, version=version, openapi_version="3.0.3", plugins=[marshmallow])
    marshmallow.map_to_openapi_type(Timestamp, "string", "date-time")  # type: ignore[no-untyped-call]
    marshmallow.converter.add_attribute_function(_any_but_null)  # type: ignore[union-attr]
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
                "errors": {"type": "object", "description": "Per-field messages (422)"},
            },
        },
    )
    paths: dict[str, dict[str, Any]] = {}
    for rule in app.url_map.iter_rules():
        doc = route_doc(app.view_functions.get(rule.endpoint))
        if doc is None:
            continue
        path = _PARAM.sub(r"{\1}", rule.rule)
        params = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in _PARAM.findall(rule.rule)
        ]
        for method in sorted((rule.methods or set()) - {"HEAD", "OPTIONS"}):
            view = app.view_functions[rule.endpoint]
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
    if doc.query is not None:
        operation["parameters"].append({"in": "query", "schema": doc.query})
    if doc.response is not None and "next_cursor" in doc.response._declared_fields:
        operation["parameters"].append({"in": "query", "schema": PageQuery})
    if doc.headers is not None:
        operation["parameters"].append({"in": "header", "schema": doc.headers})
    if doc.idempotent:
        operation["parameters"].append(
            {
                "name": "Idempotency-Key",
                "in": "header",
                "required": False,
                "description": "A repeat with the same key answers with the first answer",
                "schema": {"type": "string", "pattern": IDEMPOTENCY_KEY_PATTERN},
            }
        )
    if doc.body is not None:
        # An empty body reads as {}: it is required only when a field is.
        required = any(field.required for field in doc.body._declared_fields.values())
        operation["requestBody"] = {
            "required": required,
            "content": {doc.body_type: {"schema": doc.body}},
        }
    elif doc.body_type != JSON:
        operation["requestBody"] = {
            "required": True,
            "content": {doc.body_type: {"schema": {"type": "string", "format": "binary"}}},
        }
    for status, description in ((doc.status, doc.summary), *doc.also):
        operation["responses"][str(status)] = _success(doc, description)
    return operation


#: One event of a ``text/event-stream`` answer (Server-Sent Events).
_SSE_EVENT = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "event": {"type": "string"},
        "data": {"type": "string", "description": "JSON"},
    },
}


def _success(doc: RouteDoc, description: str) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": description}
    if doc.response is not None:
        answer["content"] = {doc.content_type: {"schema": doc.response}}
    elif doc.content_type == "text/event-stream":
        answer["content"] = {doc.content_type: {"schema": _SSE_EVENT}}
    elif doc.content_type != JSON:
        answer["content"] = {doc.content_type: {"schema": {"type": "string", "format": "binary"}}}
    return answer
