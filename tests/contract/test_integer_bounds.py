"""Every integer a client sends has one bound, the same on both engines.

The test walks the OpenAPI document the server serves: for every operation,
every integer it takes (a body field at any depth, a query parameter, a
header) must declare a ``minimum`` and a ``maximum``, and the server must
hold to them against a seeded world where every path parameter resolves: at
each bound the answer is anything but a 5xx (accepted, or refused for
another reason), one past either bound is a 422 ``validation-error`` naming
the field. A new route or field is covered as soon as it is declared. Every
boolean a body takes is walked the same way: only ``true`` and ``false``.

Mutation checks: ``revision_number`` bounded at 2**63 - 1 instead of what an
``Integer`` column holds (on PostgreSQL ``PATCH`` of a project with that
``expected_revision`` is a 500 from asyncpg's DataError: red; SQLite holds it);
``FindingIn.line`` without its maximum (the document shows none: red).
A bound the settings decide is checked in ``test_configured_bounds.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .world import World, seed

PROBLEM = "urn:buildmax:problem:"
#: What else an integer may arrive as, in JSON and in text (query, header).
NOT_INTEGERS_JSON: list[Any] = [1.5, 1.0, True, False, "1", [1], {"n": 1}, 10**30, -(10**30)]
NOT_INTEGERS_TEXT = ["1.5", "1e3", "abc", "+1", " 1", "0x10", "9" * 30]
NOT_BOOLEANS: list[Any] = [0, 1, "true", "false", "yes", [True], {"b": True}]


@dataclass(frozen=True)
class Input:
    """One integer (or boolean) an operation takes, where, and its declared bounds."""

    method: str
    path: str
    location: str  # "body", "query" or "header"
    name: tuple[str, ...]  # the parameter, or the keys down to a body field
    minimum: int | None
    maximum: int | None
    streams: bool  # the operation answers a text/event-stream

    def label(self) -> str:
        return f"{self.method} {self.path} {self.location}:{'.'.join(self.name)}"


def _resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = document["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _body_fields(
    document: dict[str, Any], schema: dict[str, Any], at: tuple[str, ...], kind: str
) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    schema = _resolve(document, schema)
    for key in ("anyOf", "oneOf", "allOf"):
        for option in schema.get(key, []):
            # A bare type is one arm of a union (any JSON value but null),
            # not a field of that type.
            if set(option) != {"type"}:
                yield from _body_fields(document, option, at, kind)
    if schema.get("type") == kind:
        yield at, schema
    for name, inner in schema.get("properties", {}).items():
        yield from _body_fields(document, inner, (*at, name), kind)
    if schema.get("type") == "array":
        yield from _body_fields(document, schema.get("items", {}), (*at, "0"), kind)


def integer_inputs(document: dict[str, Any], kind: str = "integer") -> list[Input]:
    """Every integer (or other ``kind``) input of every operation of ``document``."""
    found = []
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            streams = "text/event-stream" in str(operation["responses"])
            for parameter in operation.get("parameters", []):
                schema = parameter["schema"]
                if schema.get("type") == kind:
                    found.append(
                        Input(
                            method.upper(),
                            path,
                            parameter["in"],
                            (parameter["name"],),
                            schema.get("minimum"),
                            schema.get("maximum"),
                            streams,
                        )
                    )
            for content in operation.get("requestBody", {}).get("content", {}).values():
                for at, schema in _body_fields(document, content["schema"], (), kind):
                    found.append(
                        Input(
                            method.upper(),
                            path,
                            "body",
                            at,
                            schema.get("minimum"),
                            schema.get("maximum"),
                            streams,
                        )
                    )
    return found


def valid_bodies(world: World) -> dict[tuple[str, str], dict[str, Any]]:
    """A body each operation with required fields would accept (given the
    state), so a bound reaches the database where it can; an operation
    whose body has required fields must be listed here."""
    finding = {"severity": "minor", "text": "x", "path": "a.py", "line": 1}
    attempt = "/v1/spaces/{space}/attempts/{attempt}"
    # The admin acts on the agent's attempt and task: an audited override.
    fenced = {"generation": world.generation, "override_reason": "contract test"}
    return {
        ("POST", "/v1/spaces/{space}/agents/{agent}/revisions"): {
            "instructions": "x",
            "plugins": [],
        },
        ("POST", f"{attempt}/cancel"): {**fenced, "reason": "x"},
        ("POST", f"{attempt}/fail"): {**fenced, "reason": "x"},
        ("POST", f"{attempt}/checkpoint"): {**fenced, "data": {}},
        ("POST", f"{attempt}/release"): fenced,
        ("POST", f"{attempt}/renew"): fenced,
        ("POST", f"{attempt}/submit"): {**fenced, "summary": "x"},
        ("PATCH", "/v1/spaces/{space}/projects/{project}"): {"expected_revision": 1},
        ("POST", "/v1/spaces/{space}/projects/{project}/policy"): {"approvals_required": 1},
        ("POST", "/v1/spaces/{space}/reviews/{ident}"): {
            "decision": "request_changes",
            "findings": [finding],
        },
        ("POST", "/v1/spaces/{space}/tasks"): {"project": "main", "title": "x"},
        ("POST", "/v1/spaces/{space}/lessons/{lesson}/revisions"): {
            "revision": 1,
            "reason": "contract test",
        },
        ("POST", "/v1/spaces/{space}/lessons/{lesson}/votes"): {"vote": "helpful"},
        ("PATCH", "/v1/spaces/{space}/tasks/{task}"): {
            "expected_revision": 1,
            "override_reason": "contract test",
        },
        ("POST", "/v1/spaces/{space}/tasks/{task}/decisions"): {
            "question": "x",
            "options": ["a", "b"],
        },
    }


def _with(body: Any, name: tuple[str, ...], value: Any) -> Any:
    """``body`` with ``value`` at ``name`` (``("findings", "0", "line")``)."""
    if not name:
        return value
    head, rest = name[0], name[1:]
    if head.isdigit():
        items = list(body) if isinstance(body, list) and body else [{}]
        items[0] = _with(items[0], rest, value)
        return items
    inner = body.get(head, [] if rest and rest[0].isdigit() else {}) if body else None
    return {**(body or {}), head: _with(inner, rest, value)}


def _requires_fields(document: dict[str, Any], item: Input) -> bool:
    operation = document["paths"][item.path][item.method.lower()]
    for content in operation["requestBody"]["content"].values():
        if _resolve(document, content["schema"]).get("required"):
            return True
    return False


def _names_field(errors: Any, name: tuple[str, ...]) -> bool:
    for part in name:
        if not isinstance(errors, dict) or part not in errors:
            return False
        errors = errors[part]
    return True


async def _send(
    client: Any, world: World, item: Input, value: Any, base: dict[str, Any]
) -> tuple[int, Any]:
    path = item.path
    for parameter, ident in world.path_parameters().items():
        path = path.replace("{" + parameter + "}", ident)
    assert "{" not in path, f"no seeded id for a parameter of {item.path}"
    headers = {"Authorization": f"Bearer {world.admin_token}"}
    kwargs: dict[str, Any] = {}
    if item.location == "body":
        kwargs["json"] = _with(base, item.name, value)
    elif item.location == "query":
        kwargs["query_string"] = {item.name[0]: str(value)}
    else:
        headers[item.name[0]] = str(value)
    if not item.streams:
        response = await client.open(path, method=item.method, headers=headers, **kwargs)
        return response.status_code, await response.get_json(silent=True)
    # A stream that is accepted never ends: its status is what counts.
    connection = client.request(path, method=item.method, headers=headers, **kwargs)
    await connection.__aenter__()
    await connection.send_complete()
    try:
        await asyncio.wait_for(asyncio.shield(connection._task), timeout=1)
    except TimeoutError:
        await connection.disconnect()
        await asyncio.wait_for(connection._task, timeout=5)
        return connection.status_code or 0, None
    response = await connection.as_response()
    return response.status_code, await response.get_json(silent=True)


async def _http(client: Any) -> Any:
    async def http(
        method: str,
        path: str,
        *,
        token: str,
        json: Any = None,
        params: dict[str, str] | None = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        sent = {"Authorization": f"Bearer {token}", **(headers or {})}
        kwargs: dict[str, Any] = {"query_string": params or {}}
        if json is not None:
            kwargs["json"] = json
        if content is not None:
            kwargs["data"] = content
        response = await client.open(path, method=method, headers=sent, **kwargs)
        return response.status_code, await response.get_json(silent=True)

    return http


async def test_every_integer_input_has_bounds_the_server_holds_to(client, admin):
    """Each integer input declares both bounds; each bound is not a 5xx;
    one past each, and a float, a bool, a string, a list, an object or a
    number beyond 64 bits (in text: a decimal, an exponent, a sign, spaces,
    hex, 30 digits), is a 422 ``validation-error`` naming the field."""
    world = await seed(await _http(client), admin.token)
    document = await (await client.get("/v1/openapi.json")).get_json()
    inputs = integer_inputs(document)
    assert len(inputs) >= 30, "the walker found too few integer inputs to be reading the document"
    bodies = valid_bodies(world)
    failures = []
    for item in inputs:
        if item.minimum is None or item.maximum is None:
            failures.append(f"{item.label()}: no minimum or no maximum in the document")
            continue
        base = bodies.get((item.method, item.path), {})
        if item.location == "body" and not base and _requires_fields(document, item):
            failures.append(f"{item.label()}: list a valid body for it in valid_bodies()")
            continue
        for value in (item.minimum, item.maximum):
            status, body = await _send(client, world, item, value, base)
            if status >= 500 or status == 0:
                failures.append(f"{item.label()}={value}: {status} {body}")
        wrong = NOT_INTEGERS_JSON if item.location == "body" else NOT_INTEGERS_TEXT
        for value in (item.minimum - 1, item.maximum + 1, *wrong):
            status, body = await _send(client, world, item, value, base)
            problem = body if isinstance(body, dict) else {}
            if (
                status != 422
                or problem.get("type") != PROBLEM + "validation-error"
                or not _names_field(problem.get("errors"), item.name)
            ):
                failures.append(f"{item.label()}={value}: {status} {body}")
    assert not failures, f"{len(failures)} wrong answers:\n" + "\n".join(failures)


async def test_every_boolean_input_takes_only_true_or_false(client, admin):
    """Each boolean a body takes refuses 0, 1, strings, lists and objects
    with a 422 naming the field. Catches marshmallow's ``Boolean`` (which
    takes 1, "yes", "on") and one with ``truthy={True}`` (1 equals True):
    ``PATCH /v1/principals/{ref}`` took ``"disabled": 0``."""
    world = await seed(await _http(client), admin.token)
    document = await (await client.get("/v1/openapi.json")).get_json()
    inputs = integer_inputs(document, "boolean")
    assert len(inputs) >= 4, "the walker found too few boolean inputs to be reading the document"
    bodies = valid_bodies(world)
    failures = []
    for item in inputs:
        base = bodies.get((item.method, item.path), {})
        for value in NOT_BOOLEANS:
            status, body = await _send(client, world, item, value, base)
            problem = body if isinstance(body, dict) else {}
            if status != 422 or not _names_field(problem.get("errors"), item.name):
                failures.append(f"{item.label()}={value!r}: {status} {body}")
    assert not failures, f"{len(failures)} wrong answers:\n" + "\n".join(failures)
