"""The tools an agent sees: every plugin's :class:`AgentTool`, with the
JSON Schemas of the route each one calls.

The schemas come from the OpenAPI document the kernel builds from the
routes' declarations (in its JSON Schema form, OpenAPI 3.1), so a tool's
arguments are exactly what its route validates, and cannot drift from it.
"""

from __future__ import annotations

import copy
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import mcp_types as types
from buildmax_hookspecs import AgentTool

from buildmax import __version__
from buildmax.apidoc import build_openapi

from .lifecycle import ToolDeclarationError

if TYPE_CHECKING:
    from buildmax.app import BuildMax

#: The argument carrying a retried call's key (the route's ``Idempotency-Key``).
IDEMPOTENCY_ARGUMENT = "idempotency_key"
#: The arguments of a tool whose route takes raw bytes.
CONTENT, CONTENT_BASE64, MEDIA_TYPE = "content", "content_base64", "media_type"
#: What every path's ``{space}`` is.
_SPACE = "The space to act in: its slug or id."
_COMPONENTS = "#/components/schemas/"
#: A parameter of a resource's URI template.
TEMPLATE_PARAMETER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class Binding:
    """How one tool's arguments become a request to its route."""

    spec: AgentTool
    plugin: str
    path_params: tuple[str, ...]
    query: frozenset[str]
    body: frozenset[str]
    idempotent: bool
    tool: types.Tool
    #: The values the tool sets itself, in the query and in the body.
    fixed_query: Mapping[str, Any]
    fixed_body: Mapping[str, Any]

    @property
    def arguments(self) -> frozenset[str]:
        """Every argument the tool takes."""
        taken = set(self.path_params) | self.query | self.body
        if self.idempotent:
            taken.add(IDEMPOTENCY_ARGUMENT)
        if self.spec.body == "bytes":
            taken |= {CONTENT, CONTENT_BASE64, MEDIA_TYPE}
        return frozenset(taken)


@dataclass(frozen=True)
class Catalog:
    """The tools of this server, by name, in the order plugins offered them."""

    bindings: Mapping[str, Binding]

    @property
    def tools(self) -> list[types.Tool]:
        """The tools, as ``tools/list`` answers them."""
        return [binding.tool for binding in self.bindings.values()]

    def input_schema(self, name: str) -> Mapping[str, Any] | None:
        """The input schema of the tool ``name`` (``None``: no such tool)."""
        binding = self.bindings.get(name)
        return binding.tool.input_schema if binding is not None else None

    def resources(self) -> list[Binding]:
        """The tools also offered as a resource template."""
        return [b for b in self.bindings.values() if b.spec.resource is not None]


#: Catalogs built in this process, by what they are built from (an app's
#: routes and its plugins' tools): every app of a process with the same
#: plugins shares one, built once (the OpenAPI document takes tens of ms).
_BUILT: OrderedDict[tuple[Any, ...], Catalog] = OrderedDict()
_KEPT = 16


def build_catalog(app: BuildMax) -> Catalog:
    """The catalog of ``app``'s tools (``buildmax_agent_tools``)."""
    offered = [(plugin, tuple(specs)) for plugin, specs in app.hooks.agent_tools()]
    key = (
        tuple(
            (rule.rule, tuple(sorted(rule.methods or ())), rule.endpoint)
            for rule in app.url_map.iter_rules()
        ),
        repr(offered),
    )
    found = _BUILT.get(key)
    if found is None:
        found = _BUILT[key] = _build(app, offered)
        while len(_BUILT) > _KEPT:
            _BUILT.popitem(last=False)
    return found


def _build(app: BuildMax, offered: list[tuple[str, tuple[AgentTool, ...]]]) -> Catalog:
    document = build_openapi(app, "BuildMax", __version__, openapi_version="3.1.0")
    components = document.get("components", {}).get("schemas", {})
    bindings: dict[str, Binding] = {}
    for plugin, specs in offered:
        for spec in specs:
            # Names and routes were checked at start-up (lifecycle.check_tools).
            where = f"tool {spec.name!r} of plugin {plugin!r}"
            operation = document["paths"][spec.path][spec.method.lower()]
            bindings[spec.name] = _bind(where, plugin, spec, operation, components)
    return Catalog(bindings)


def _bind(
    where: str,
    plugin: str,
    spec: AgentTool,
    operation: Mapping[str, Any],
    components: Mapping[str, Any],
) -> Binding:
    properties: dict[str, Any] = {}
    required: list[str] = []

    def take(name: str, schema: Any, is_required: bool) -> None:
        if name in properties:
            raise ToolDeclarationError(f"{where}: the argument {name!r} is named twice")
        schema = dict(schema)
        described = spec.arguments.get(name) or (_SPACE if name == "space" else None)
        if described and not schema.get("description"):
            schema["description"] = described
        properties[name] = schema
        if is_required:
            required.append(name)

    path_params, query, idempotent = [], set(), False
    for parameter in operation.get("parameters", []):
        name, where_in = parameter["name"], parameter["in"]
        schema = {**parameter.get("schema", {})}
        if parameter.get("description"):
            schema.setdefault("description", parameter["description"])
        if where_in == "path":
            path_params.append(name)
            take(name, schema, True)
        elif where_in == "query":
            query.add(name)
            take(name, schema, bool(parameter.get("required")))
        elif where_in == "header" and name == "Idempotency-Key":
            idempotent = True
    body: set[str] = set()
    if spec.body == "bytes":
        take(CONTENT, {"type": "string", "description": "The artifact as text (UTF-8)."}, False)
        take(
            CONTENT_BASE64,
            {"type": "string", "description": "The artifact's bytes, base64 (instead of content)."},
            False,
        )
        take(
            MEDIA_TYPE,
            {
                "type": "string",
                "description": "Its media type [default: text/plain for content, "
                "application/octet-stream for content_base64].",
            },
            False,
        )
    else:
        schema = _json_schema(operation.get("requestBody"))
        if schema is not None:
            declared = _resolve(schema, components)
            for name, field_schema in declared.get("properties", {}).items():
                body.add(name)
                take(name, field_schema, name in declared.get("required", ()))
    if idempotent:
        take(
            IDEMPOTENCY_ARGUMENT,
            {
                "type": "string",
                "description": "Any unique string: a retry of this call with the same key "
                "and arguments answers the first call's answer and changes nothing again.",
            },
            False,
        )
    for name in spec.fixed:
        if name not in properties:
            raise ToolDeclarationError(
                f"{where}: the fixed argument {name!r} is not one of the route's"
            )
        del properties[name]
        if name in required:
            required.remove(name)
    input_schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        input_schema["required"] = required
    output = _output_schema(operation, components)
    defs = _definitions([input_schema, output or {}], components)
    if defs:
        input_schema["$defs"] = defs
        if output is not None:
            output["$defs"] = defs
    if spec.resource is not None and set(TEMPLATE_PARAMETER.findall(spec.resource)) != set(
        path_params
    ):
        raise ToolDeclarationError(f"{where}: its resource template names other than {path_params}")
    tool = types.Tool(
        name=spec.name,
        title=spec.title,
        description=spec.description,
        input_schema=_local_refs(input_schema),
        output_schema=_local_refs(output) if output is not None else None,
        annotations=types.ToolAnnotations(
            read_only_hint=spec.method == "GET",
            destructive_hint=spec.method == "DELETE",
            # A change repeats harmlessly only with the same idempotency_key.
            idempotent_hint=spec.method == "GET",
            open_world_hint=False,
        ),
    )
    return Binding(
        spec=spec,
        plugin=plugin,
        path_params=tuple(path_params),
        query=frozenset(query) - set(spec.fixed),
        body=frozenset(body) - set(spec.fixed),
        idempotent=idempotent,
        tool=tool,
        fixed_query={k: v for k, v in spec.fixed.items() if k in query},
        fixed_body={k: v for k, v in spec.fixed.items() if k not in query},
    )


def _json_schema(container: Mapping[str, Any] | None) -> Any:
    """The ``application/json`` schema of a request body or an answer."""
    if not container:
        return None
    return container.get("content", {}).get("application/json", {}).get("schema")


def _output_schema(
    operation: Mapping[str, Any], components: Mapping[str, Any]
) -> dict[str, Any] | None:
    """The schema of the route's main success answer, when it is a JSON
    object: the object's own schema at the root (clients of protocol
    versions up to 2025-11-25 require ``type: object`` there)."""
    statuses = sorted(code for code in operation.get("responses", {}) if code.isdigit())
    for code in statuses:
        schema = _json_schema(operation["responses"][code])
        if schema is not None:
            root = copy.deepcopy(dict(_resolve(schema, components)))
            return root if root.get("type") == "object" else None
    return None


def _resolve(schema: Mapping[str, Any], components: Mapping[str, Any]) -> Mapping[str, Any]:
    """``schema``, or the component it refers to."""
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith(_COMPONENTS):
        found: Mapping[str, Any] = components[ref.removeprefix(_COMPONENTS)]
        return found
    return schema


def _refs(value: Any) -> Iterable[str]:
    """The component names ``value`` refers to, at any depth."""
    if isinstance(value, dict):
        ref = value.get("$ref")
        if isinstance(ref, str) and ref.startswith(_COMPONENTS):
            yield ref.removeprefix(_COMPONENTS)
        for item in value.values():
            yield from _refs(item)
    elif isinstance(value, list):
        for item in value:
            yield from _refs(item)


def _definitions(schemas: Iterable[Any], components: Mapping[str, Any]) -> dict[str, Any]:
    """The components ``schemas`` need, each with the ones it needs."""
    found: dict[str, Any] = {}
    pending = [name for schema in schemas for name in _refs(schema)]
    while pending:
        name = pending.pop()
        if name in found:
            continue
        found[name] = _local_refs(copy.deepcopy(components[name]))
        pending.extend(_refs(components[name]))
    return found


def _local_refs(value: Any) -> Any:
    """``value`` with its component references pointing into its ``$defs``."""
    if isinstance(value, dict):
        return {
            key: (
                "#/$defs/" + item.removeprefix(_COMPONENTS)
                if key == "$ref" and isinstance(item, str) and item.startswith(_COMPONENTS)
                else _local_refs(item)
            )
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_local_refs(item) for item in value]
    return value
