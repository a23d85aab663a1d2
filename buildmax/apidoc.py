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

import functools
import inspect
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

from apispec import APISpec
from apispec.ext.marshmallow import MarshmallowPlugin
from marshmallow import Schema, fields
from quart import Response, request

from .access import caller_and_space, require_found
from .auth import authenticate
from .bodies import load_body, raw_body, validate
from .current import current_buildmax
from .declaration import RouteDoc, current_route_doc, route_doc
from .idempotency import VIEW_RUNNING, Work
from .inputs import IDEMPOTENCY_KEY_PATTERN
from .pagination import PageQuery
from .problems import Forbidden
from .roles import SPACE_ROLES, SYSTEM_ROLES
from .schemas import Timestamp

if TYPE_CHECKING:
    from .app import BuildMax

_PARAM = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")
#: The request body of a route that takes a JSON body.
JSON = "application/json"
#: Methods that change nothing: their handlers need no write admission.
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


#: What a handler returns: its answer, or (an idempotent route) the work
#: the kernel runs in a write transaction under the request's key.
Answer = Response | Work
View = Callable[..., Awaitable[Answer]]


def api(
    summary: str,
    *,
    body: type[Schema] | None = None,
    response: type[Schema] | None = None,
    status: int = 200,
    auth: bool = True,
    scopes: Iterable[str] = (),
    role: str | None = None,
    action: str | None = None,
    system_roles: Iterable[str] = (),
    idempotent: bool = False,
    not_idempotent: str | None = None,
    secret_fields: Iterable[str] = (),
    tags: Iterable[str] = (),
    content_type: str = JSON,
    body_type: str = JSON,
    query: type[Schema] | None = None,
    headers: type[Schema] | None = None,
    also: Mapping[int, str] | None = None,
    relays: bool = False,
) -> Callable[[View], Callable[..., Awaitable[Response]]]:
    """Declare a view; the kernel applies the declaration before the view
    runs and hands it what that produced.

    In order: with ``auth`` (the default) the caller is authenticated, a
    token scoped to something accepted only when ``scopes`` names its scope
    type, and handed over as ``caller``; with ``system_roles`` the caller
    needs one of them (403); with ``role`` the caller needs that role in
    the space of the path's ``<space>`` (404 to a stranger, 403 to a member
    below it; ``action`` is what ``buildmax_permission`` is asked) and the
    space is handed over as ``access``; with ``body`` the JSON body is
    validated (422 naming each bad field) and handed over as ``data``. A
    view names, as keyword parameters, what it wants of these and of the
    path's parameters.

    An ``idempotent`` view returns its work, ``async (tx) -> Reply``: the
    kernel runs it in a write transaction honouring ``Idempotency-Key`` (a
    retry replays the first answer without running it, so the view checks
    all it must before returning it); ``secret_fields`` are body fields
    (passwords) left out of the key's fingerprint. A view whose body
    streams (an upload) answers itself under
    :meth:`buildmax.idempotency.Idempotency.streamed`. A mutating route that
    cannot honour the key says why in ``not_idempotent`` (the API guide
    lists them, and a test walks the route table for any that does
    neither).

    ``response`` is the schema of its answer, ``status`` the success
    status and ``also`` any other success status (with what it means)
    answered with the same body; ``content_type`` is the media type of that
    answer. A route that reads raw bytes names their media type in
    ``body_type``. ``query`` and ``headers`` are schemas of the query
    parameters and request headers it reads (:func:`query_args`,
    :func:`header_args`). A route that ``relays`` writes nothing itself:
    it calls other routes in-process (:class:`buildmax.internal.InternalApi`),
    each admitted on its own, so its handler takes no write admission.
    """
    doc = RouteDoc(
        summary,
        body,
        response,
        status,
        auth,
        tuple(scopes),
        role,
        action,
        tuple(system_roles),
        idempotent,
        not_idempotent,
        tuple(secret_fields),
        tuple(tags),
        content_type,
        body_type,
        query,
        headers,
        tuple(sorted((also or {}).items())),
    )
    _check(doc)

    def mark(view: View) -> Callable[..., Awaitable[Response]]:
        parameters = inspect.signature(view).parameters
        takes_all = any(p.kind is p.VAR_KEYWORD for p in parameters.values())

        @functools.wraps(view)
        async def serve(**path: Any) -> Response:
            given = await _apply(doc, path)
            if request.method in SAFE_METHODS or doc.body_type != JSON or relays:
                return await handle(given)
            # A mutating request's handler waits for write admission, after
            # its authentication and its body (declared or not: an
            # idempotency key's fingerprint reads it), which arrives at the
            # client's pace and must not hold the slot.
            await raw_body()
            async with current_buildmax().admission.admitted():
                return await handle(given)

        async def handle(given: dict[str, Any]) -> Response:
            # Per request, not per task: a request the view makes meanwhile
            # (in process, or from a task it started) has a scope of its own.
            scope = cast(dict[str, Any], request.scope)
            scope[VIEW_RUNNING] = True
            try:
                answer = await view(
                    **{k: v for k, v in given.items() if takes_all or k in parameters}
                )
            finally:
                scope[VIEW_RUNNING] = False
            if isinstance(answer, Response):
                if doc.idempotent and doc.body_type == JSON:
                    raise RuntimeError(f"{request.endpoint} is idempotent but returned no work")
                return answer
            return await current_buildmax().idempotency.run(
                given["caller"], answer, secret_fields=doc.secret_fields
            )

        serve.__buildmax_api__ = doc  # type: ignore[attr-defined]
        return serve

    return mark


def _check(doc: RouteDoc) -> None:
    """Refuse, at import, a declaration the kernel could not apply."""
    where = repr(doc.summary)
    if doc.idempotent and doc.not_idempotent:
        raise ValueError(f"{where}: a route is idempotent or says why not, not both")
    if (doc.role is None) != (doc.action is None):
        raise ValueError(f"{where}: a space role needs the action it allows, and the reverse")
    if doc.role is not None and doc.role not in SPACE_ROLES:
        raise ValueError(f"{where}: {doc.role!r} is not a space role")
    if not set(doc.system_roles) <= set(SYSTEM_ROLES):
        raise ValueError(f"{where}: system roles are {', '.join(SYSTEM_ROLES)}")
    if not doc.auth and (doc.role or doc.system_roles or doc.scopes or doc.idempotent):
        raise ValueError(f"{where}: roles, scopes and idempotency keys need a caller")
    if doc.secret_fields and not doc.idempotent:
        raise ValueError(f"{where}: secret_fields are for an idempotent route's fingerprint")


async def _apply(doc: RouteDoc, path: dict[str, Any]) -> dict[str, Any]:
    """What the declaration produces for this request, with the path's
    parameters: refused (401, 403, 404, 413, 415, 422) as it says."""
    given = dict(path)
    if not doc.auth:
        if doc.body is not None:
            given["data"] = await load_body(schema_of(doc.body))
        return given
    if doc.role is None:
        caller = given["caller"] = await authenticate(accept_scopes=doc.scopes)
        found = None
    else:
        if "space" not in path:
            raise RuntimeError(f"{request.endpoint} declares a space role but has no <space>")
        caller, found = await caller_and_space(path["space"], doc.scopes)
        given["caller"] = caller
    if doc.system_roles and caller.actor.system_role not in doc.system_roles:
        raise Forbidden(f"this needs the {' or '.join(doc.system_roles)} system role")
    if doc.role is not None:
        assert doc.action is not None
        given["access"] = require_found(found, doc.role, caller, doc.action)
    if doc.body is not None:
        given["data"] = await load_body(schema_of(doc.body))
    return given


@functools.cache
def schema_of(declared: type[Schema]) -> Schema:
    """The one instance of a declared schema: marshmallow's schemas keep
    nothing between loads, and building one deep-copies every field."""
    return declared()


def query_args() -> dict[str, Any]:
    """The query parameters of this request, validated with the route's
    ``query`` schema (422 naming each bad one); only those it declares."""
    doc = current_route_doc()
    if doc is None or doc.query is None:
        raise RuntimeError(f"{request.endpoint} declares no query schema")
    return validate(schema_of(doc.query), dict(request.args))


def header_args() -> dict[str, Any]:
    """The request headers the route's ``headers`` schema declares, validated
    (422 naming each bad one)."""
    doc = current_route_doc()
    if doc is None or doc.headers is None:
        raise RuntimeError(f"{request.endpoint} declares no header schema")
    schema = schema_of(doc.headers)
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


def build_openapi(
    app: BuildMax, title: str, version: str, openapi_version: str = "3.0.3"
) -> dict[str, Any]:
    """The OpenAPI 3 document of every declared route of ``app``. With
    ``openapi_version`` 3.1 its schemas are JSON Schema (a nullable field is
    ``type: [..., "null"]``), as tool schemas need."""
    marshmallow = MarshmallowPlugin()
    spec = APISpec(
        title=title, version=version, openapi_version=openapi_version, plugins=[marshmallow]
    )
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
        "description": " ".join(filter(None, [(view.__doc__ or "").strip(), _who(doc)])),
        "parameters": list(params),
        "responses": {"default": _PROBLEM},
    }
    if doc.tags:
        operation["tags"] = list(doc.tags)
    if doc.auth:
        operation["security"] = [{"bearer": []}]
    if doc.scopes:
        operation["x-token-scopes"] = list(doc.scopes)
    if doc.role is not None:
        operation["x-space-role"] = doc.role
        operation["x-permission-action"] = doc.action
    if doc.system_roles:
        operation["x-system-roles"] = list(doc.system_roles)
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


def _who(doc: RouteDoc) -> str:
    """Who may call the route, in words, from its declaration."""
    if doc.system_roles:
        return f"Needs the {' or '.join(doc.system_roles)} system role."
    if doc.role is not None:
        return f"Needs at least the {doc.role} role in the space (`{doc.action}`)."
    return ""


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
