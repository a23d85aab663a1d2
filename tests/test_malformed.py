"""Malformed input to the kernel routes: a problem+json 4xx, never a 500.

Every kernel route that takes a body, a query or a path parameter gets
bodies that are not JSON or not objects; fields of the wrong type, missing,
unknown or out of range; a body over the size limit, with and without a
``Content-Length``; bad cursors and limits; bad ids and bad headers.

Each answer must be a 4xx ``application/problem+json`` document (``type``,
``title``, ``status`` equal to the HTTP status, ``detail``), and a refused
request must change nothing: the same rows in every kernel table and no
audit event. Property tests (hypothesis) then throw arbitrary JSON at the
mutation routes: the answer is a success or a problem+json 4xx, never a 5xx.

Cases of one kind run in one test, which collects every wrong answer before
failing: one run reports them all, and the file stays fast.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from buildmax.inputs import first_unsafe_value
from buildmax.routes import kernel_blueprints
from buildmax.schemas import (
    MAX_TOKEN_LIFETIME,
    NAME_PATTERN,
    PRINCIPAL_KINDS,
    SLUG_PATTERN,
    SPACE_ROLES,
    SYSTEM_ROLES,
)
from buildmax.spaces import put_member
from buildmax.tables import (
    events,
    idempotency_receipts,
    principals,
    sign_in_failures,
    space_members,
    spaces,
    tokens,
)

PROBLEM = "application/problem+json"
PREFIX = "urn:buildmax:problem:"
JSON = "application/json"
MIB = 1024 * 1024

#: Tables a refused request must leave exactly as they were. A token's
#: ``last_used_at`` is written in the background by any authenticated
#: request, so it is left out.
TRACKED = (
    principals,
    spaces,
    space_members,
    tokens,
    idempotency_receipts,
    events,
    sign_in_failures,
)


# -- the world every test acts in ---------------------------------------------


@dataclass(frozen=True)
class World:
    """A system admin owning a space, an agent member of it, and their token ids."""

    admin: Any
    agent: Any
    space: Any
    admin_token_id: str
    agent_token_id: str


@pytest.fixture
async def world(app, admin, make_principal, make_space) -> World:
    agent = await make_principal("agent")
    space = await make_space(admin)
    async with app.db.write() as tx:
        await put_member(tx, space.pk, agent.pk, "member", app.clock.now_ms())
    async with app.db.read() as conn:
        rows = await conn.fetch_all(sa.select(tokens.c.principal_id, tokens.c.public_id))
    token_of = {row["principal_id"]: row["public_id"] for row in rows}
    return World(admin, agent, space, token_of[admin.pk], token_of[agent.pk])


async def snapshot(app) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the tracked tables (``last_used_at`` aside)."""
    state: dict[str, list[tuple[Any, ...]]] = {}
    async with app.db.read() as conn:
        for table in TRACKED:
            columns = [c for c in table.c if c.name != "last_used_at"]
            rows = await conn.fetch_all(sa.select(*columns).order_by(*table.primary_key.columns))
            state[table.name] = [tuple(dict(row).values()) for row in rows]
    return state


def changed_tables(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return [name for name in before if before[name] != after[name]]


# -- checking an answer ---------------------------------------------------------


async def problem_errors(
    response: Any, expect: Iterable[int] = (), slug: str | None = None
) -> list[str]:
    """What is wrong with ``response`` as a problem+json 4xx (empty when right)."""
    status = response.status_code
    expect = tuple(expect)
    errors: list[str] = []
    if status < 400:
        return [f"accepted with {status}"]
    if not 400 <= status < 500:
        errors.append(f"status {status}, not a 4xx")
    elif expect and status not in expect:
        errors.append(f"status {status}, expected one of {expect}")
    if response.mimetype != PROBLEM:
        errors.append(f"content-type {response.content_type!r}")
    raw = await response.get_data()
    try:
        body = json.loads(raw)
    except ValueError:
        return [*errors, f"body is not JSON: {raw[:120]!r}"]
    if not isinstance(body, dict):
        return [*errors, f"body is not an object: {raw[:120]!r}"]
    kind = body.get("type")
    if not (isinstance(kind, str) and kind.startswith(PREFIX)):
        errors.append(f"type {kind!r}")
    elif slug is not None and kind != PREFIX + slug:
        errors.append(f"type {kind!r}, expected {PREFIX + slug!r}")
    if not (isinstance(body.get("title"), str) and body["title"]):
        errors.append(f"title {body.get('title')!r}")
    if body.get("status") != status:
        errors.append(f"body status {body.get('status')!r} != HTTP status {status}")
    if not (isinstance(body.get("detail"), str) and body["detail"]):
        errors.append(f"detail {body.get('detail')!r}")
    return errors


@dataclass(frozen=True)
class Case:
    """One malformed request and what it must get."""

    label: str
    method: str
    path: str
    body: bytes | None = None
    content_type: str | None = JSON
    headers: dict[str, str] = field(default_factory=dict)
    expect: tuple[int, ...] = ()
    slug: str | None = None
    auth: bool = True


def as_json(value: Any) -> bytes:
    return json.dumps(value).encode()


async def send(client: Any, case: Case, auth: dict[str, str]) -> Any:
    headers = dict(auth) if case.auth else {}
    if case.content_type is not None:
        headers["Content-Type"] = case.content_type
    headers.update(case.headers)
    if case.body is None:
        return await client.open(case.path, method=case.method, headers=headers)
    return await client.open(case.path, method=case.method, headers=headers, data=case.body)


def describe(case: Case, status: int | str, errors: list[str]) -> str:
    path = case.path if len(case.path) <= 90 else case.path[:87] + "..."
    return f"{case.method} {path} [{case.label}] -> {status}: {'; '.join(errors)}"


async def run_cases(app: Any, client: Any, audit_log: Any, auth: Any, cases: list[Case]) -> None:
    """Send every case; fail listing each wrong answer or each change it made."""
    assert cases
    failures: list[str] = []
    for case in cases:
        before, audited = await snapshot(app), len(audit_log.events)
        response = await send(client, case, auth)
        errors = await problem_errors(response, case.expect, case.slug)
        changed = changed_tables(before, await snapshot(app))
        if case.path == "/v1/sessions" and response.status_code == 401:
            # A well-formed sign-in with a wrong name records the failure.
            changed = [name for name in changed if name != sign_in_failures.name]
        if changed:
            errors.append(f"changed {', '.join(changed)}")
        if len(audit_log.events) != audited:
            actions = [event.action for event in audit_log.events[audited:]]
            errors.append(f"audited {actions}")
        if errors:
            failures.append(describe(case, response.status_code, errors))
    assert not failures, f"{len(failures)} of {len(cases)} cases answered wrongly:\n" + "\n".join(
        failures
    )


# -- the routes and their fields ----------------------------------------------

WRONG_FOR_STRING = [1, 0, -1, 1.5, True, False, [], ["x"], {}, {"x": "y"}]
#: Names violating ``^[a-z0-9][a-z0-9._-]{0,63}$``.
BAD_NAMES = [
    "",
    "Upper",
    "UPPER",
    "has space",
    " lead",
    "trail ",
    "ünïcödé",
    "名前",
    "\uff46\uff55\uff4c\uff4c",  # fullwidth "full"
    "a" * 65,
    "-lead",
    ".lead",
    "_lead",
    "a/b",
    "a:b",
    "a\tb",
    "\nab",
    "ab\n",
    "a\u0000b",
    "a\u200bb",
]
#: Slugs violating ``^[a-z0-9][a-z0-9-]{1,62}$``.
BAD_SLUGS = [
    "",
    "a",
    "Upper",
    "has space",
    "ünïcödé",
    "a" * 64,
    "-lead",
    "a.b",
    "a_b",
    "a/b",
    "١٢٣",
    "ab\n",
    "\nab",
    "a\u0000b",
]
#: A well-formed principal id naming nobody.
UNKNOWN_PRINCIPAL = "pr_AAAAAAAAAAAAAAAAAAAAAA"
#: Strings no text column can hold on every engine: NUL (PostgreSQL refuses it
#: in text; SQLite stores it) and a lone surrogate (not encodable as UTF-8).
#: Either must be refused with a 4xx on both engines, not stored on one and
#: a 500 on the other.
UNSTORABLE = {"NUL": "a\u0000b", "lone surrogate": "a\ud800b"}


@dataclass(frozen=True)
class BodyRoute:
    """A route that validates a JSON body with a schema."""

    name: str
    method: str
    path: str
    valid: dict[str, Any]
    required: tuple[str, ...]
    bad_values: dict[str, list[Any]]
    unknown: tuple[dict[str, Any], ...] = ()
    free_text: tuple[str, ...] = ()
    extra: tuple[tuple[str, dict[str, Any]], ...] = ()


BODY_ROUTE_NAMES = [
    "sign-in",
    "create principal",
    "update principal",
    "update yourself",
    "create token",
    "create space",
    "rename space",
    "put member",
]


def body_routes(w: World) -> list[BodyRoute]:
    return [
        BodyRoute(
            "sign-in",
            "POST",
            "/v1/sessions",
            {"name": "admin", "password": "not-the-password"},
            ("name", "password"),
            {
                "name": [*WRONG_FOR_STRING, None, "", "a" * 65],
                "password": [*WRONG_FOR_STRING, None, "", "p" * 1025],
            },
            unknown=({"token": "x"}, {"expires_in_seconds": 60}),
            free_text=("name", "password"),
        ),
        BodyRoute(
            "create principal",
            "POST",
            "/v1/principals",
            {"kind": "agent", "name": "malformed-agent"},
            ("kind", "name"),
            {
                "kind": [
                    *WRONG_FOR_STRING,
                    None,
                    "",
                    "robot",
                    "Agent",
                    "AGENT",
                    " agent",
                    "agent ",
                ],
                "name": [*WRONG_FOR_STRING, None, *BAD_NAMES],
                "display_name": [*WRONG_FOR_STRING, None, "d" * 201],
                "system_role": [*WRONG_FOR_STRING, "", "root", "Admin", "owner", "admin "],
                "password": [*WRONG_FOR_STRING, "long-enough-password"],  # agents: no password
            },
            unknown=(
                {"id": "pr_AAAAAAAAAAAAAAAAAAAAAA"},
                {"public_id": "pr_AAAAAAAAAAAAAAAAAAAAAA"},
                {"created_at": 0},
                {"disabled": True},
                {"password_hash": "x"},
            ),
            free_text=("display_name",),
            extra=(
                ("human, short password", {"kind": "human", "name": "h1", "password": "short"}),
                (
                    "human, 1025-char password",
                    {"kind": "human", "name": "h1", "password": "p" * 1025},
                ),
                (
                    "human, lone-surrogate password",
                    {"kind": "human", "name": "h1", "password": "a\ud800" * 12},
                ),
            ),
        ),
        BodyRoute(
            "update principal",
            "PATCH",
            f"/v1/principals/{w.agent.id}",
            {"display_name": "renamed"},
            (),
            {
                "display_name": [*WRONG_FOR_STRING, None, "d" * 201],
                "system_role": [*WRONG_FOR_STRING, "", "root", "Admin", "owner"],
                "disabled": [None, "", "maybe", "null", 2, -1, 1.5, [], {}, [True]],
                "password": [*WRONG_FOR_STRING, None, "long-enough-password"],  # not human
            },
            unknown=(
                {"name": "renamed"},
                {"kind": "human"},
                {"id": "pr_AAAAAAAAAAAAAAAAAAAAAA"},
                {"created_at": 0},
                {"disabled_at": None},
            ),
            free_text=("display_name",),
        ),
        BodyRoute(
            "update yourself",
            "PATCH",
            "/v1/principals/me",
            {"display_name": "renamed"},
            (),
            {
                "display_name": [*WRONG_FOR_STRING, None, "d" * 201],
                "system_role": [*WRONG_FOR_STRING, "", "root", "Admin", "owner"],
                "disabled": [None, "", "maybe", "null", 2, -1, 1.5, [], {}, [True]],
            },
            unknown=({"name": "renamed"}, {"id": "pr_AAAAAAAAAAAAAAAAAAAAAA"}),
            free_text=("display_name",),
        ),
        BodyRoute(
            "create token",
            "POST",
            "/v1/tokens",
            {"name": "malformed", "expires_in_seconds": 3600},
            (),
            {
                "name": [*WRONG_FOR_STRING, None, "n" * 101],
                "principal_id": [*WRONG_FOR_STRING, "p" * 65, UNKNOWN_PRINCIPAL],
                "expires_in_seconds": [
                    "3600",
                    "",
                    True,
                    False,
                    3600.5,
                    3600.0,
                    1e3,
                    [],
                    [3600],
                    {},
                    0,
                    -1,
                    59,
                    MAX_TOKEN_LIFETIME + 1,
                    2**63,
                    10**30,
                    -(10**30),
                ],
            },
            unknown=({"scope": {"type": "space", "id": "x"}}, {"origin": "session"}, {"id": "x"}),
            free_text=("name", "principal_id"),
        ),
        BodyRoute(
            "create space",
            "POST",
            "/v1/spaces",
            {"slug": "malformed-space", "name": "Malformed"},
            ("slug",),
            {
                "slug": [*WRONG_FOR_STRING, None, *BAD_SLUGS],
                "name": [*WRONG_FOR_STRING, "", "n" * 201],
                "owner_id": [*WRONG_FOR_STRING, "o" * 65, UNKNOWN_PRINCIPAL],
            },
            unknown=({"id": "sp_AAAAAAAAAAAAAAAAAAAAAA"}, {"role": "owner"}, {"created_at": 0}),
            free_text=("name", "owner_id"),
        ),
        BodyRoute(
            "rename space",
            "PATCH",
            f"/v1/spaces/{w.space.id}",
            {"name": "renamed"},
            ("name",),
            {"name": [*WRONG_FOR_STRING, None, "", "n" * 201]},
            unknown=({"slug": "new-slug"}, {"id": "sp_AAAAAAAAAAAAAAAAAAAAAA"}),
            free_text=("name",),
        ),
        BodyRoute(
            "put member",
            "PUT",
            f"/v1/spaces/{w.space.id}/members/{w.agent.id}",
            {"role": "viewer"},
            ("role",),
            {
                "role": [
                    *WRONG_FOR_STRING,
                    None,
                    "",
                    "superuser",
                    "OWNER",
                    "Viewer",
                    " viewer",
                    "viewer ",
                    "viewer\n",
                ]
            },
            unknown=({"principal_id": w.admin.id}, {"created_at": 0}),
        ),
    ]


def route_named(w: World, name: str) -> BodyRoute:
    return next(route for route in body_routes(w) if route.name == name)


def test_every_body_route_is_named(world):
    assert [route.name for route in body_routes(world)] == BODY_ROUTE_NAMES


def syntax_cases(method: str, path: str, *, schema: bool = True, **extra: Any) -> list[Case]:
    """Bodies that are not JSON, not UTF-8, too deep, too big or of another type."""
    cases = [
        Case("truncated JSON", method, path, b'{"slug":', slug="malformed-json", **extra),
        Case("not JSON", method, path, b"slug=abc", slug="malformed-json", **extra),
        Case("single quotes", method, path, b"{'slug': 'abc'}", slug="malformed-json", **extra),
        Case("trailing garbage", method, path, b'{"a": 1} x', slug="malformed-json", **extra),
        Case(
            "invalid UTF-8", method, path, b'{"name": "\xff\xfe"}', slug="malformed-json", **extra
        ),
        Case("bare invalid bytes", method, path, b"\xff\xfe\xfd", slug="malformed-json", **extra),
        Case(
            "raw NUL in a string", method, path, b'{"n": "a\x00b"}', slug="malformed-json", **extra
        ),
        Case("deeply nested array", method, path, b"[" * 100_000, **extra),
        Case("deeply nested object", method, path, b'{"a":' * 50_000, **extra),
        Case("5000-digit number", method, path, b'{"a": 1' + b"0" * 5000 + b"}", **extra),
        Case(
            "text/plain",
            method,
            path,
            b'{"name": "x"}',
            content_type="text/plain",
            slug="unsupported-media-type",
            **extra,
        ),
        Case(
            "form-encoded",
            method,
            path,
            b"name=x",
            content_type="application/x-www-form-urlencoded",
            slug="unsupported-media-type",
            **extra,
        ),
        Case(
            "multipart",
            method,
            path,
            b'--b\r\nContent-Disposition: form-data; name="name"\r\n\r\nx\r\n--b--\r\n',
            content_type="multipart/form-data; boundary=b",
            slug="unsupported-media-type",
            **extra,
        ),
        Case(
            "2 MiB body",
            method,
            path,
            b'{"name": "' + b"x" * (2 * MIB) + b'"}',
            expect=(413,),
            slug="payload-too-large",
            **extra,
        ),
        Case(
            "2 MiB of whitespace",
            method,
            path,
            b" " * (2 * MIB),
            expect=(413,),
            slug="payload-too-large",
            **extra,
        ),
    ]
    if schema:
        for label, raw in [
            ("array", b"[]"),
            ("array of an object", b'[{"name": "x"}]'),
            ("string", b'"name"'),
            ("number", b"42"),
            ("float", b"4.2"),
            ("NaN", b"NaN"),
            ("null", b"null"),
            ("true", b"true"),
        ]:
            cases.append(Case(label, method, path, raw, slug="validation-error", **extra))
    return cases


def field_cases(route: BodyRoute) -> list[Case]:
    """Wrong types, missing, unknown and out-of-range fields of one route."""
    cases: list[Case] = []

    def case(label: str, body: dict[str, Any], **kw: Any) -> None:
        cases.append(Case(label, route.method, route.path, as_json(body), **kw))

    for name in route.required:
        body = {k: v for k, v in route.valid.items() if k != name}
        case(f"missing {name}", body, expect=(422,), slug="validation-error")
    if route.required:
        case("empty object", {}, expect=(422,), slug="validation-error")
        cases.append(
            Case(
                "empty body", route.method, route.path, b"", expect=(422,), slug="validation-error"
            )
        )
    for name, values in route.bad_values.items():
        for value in values:
            label = f"{name}={value!r}"[:60]
            # A well-formed id naming nobody is a 404; text no engine can store
            # alike is refused at the edge (400); anything else, an integer
            # beyond 64 bits included, does not validate (422).
            expect = (404,) if value == UNKNOWN_PRINCIPAL else (422,)
            unsafe = first_unsafe_value(value)
            if unsafe is not None and not unsafe.integer:
                expect = (400,)
            case(label, {**route.valid, name: value}, expect=expect)
    for unknown in route.unknown:
        case(f"unknown {next(iter(unknown))}", {**route.valid, **unknown}, expect=(422,))
    case("unknown random field", {**route.valid, "zzz": 1}, expect=(422,), slug="validation-error")
    case("unknown field, non-ASCII key", {**route.valid, "ключ": 1}, expect=(422,))
    case("unknown field, lone-surrogate key", {**route.valid, "\ud800": 1}, expect=(400, 422))
    for name in route.free_text:
        for what, value in UNSTORABLE.items():
            case(f"{name} with {what}", {**route.valid, name: value})
    for label, body in route.extra:
        case(label, body)
    return cases


# -- bodies ----------------------------------------------------------------------


@pytest.mark.parametrize("route_name", BODY_ROUTE_NAMES)
async def test_a_body_that_is_not_a_json_object_is_refused(
    app, client, world, audit_log, route_name
):
    route = route_named(world, route_name)
    cases = syntax_cases(route.method, route.path)
    await run_cases(app, client, audit_log, world.admin.headers, cases)


@pytest.mark.parametrize("route_name", BODY_ROUTE_NAMES)
async def test_bad_fields_are_refused(app, client, world, audit_log, route_name):
    route = route_named(world, route_name)
    await run_cases(app, client, audit_log, world.admin.headers, field_cases(route))


def bodiless_idempotent_routes(w: World) -> list[tuple[str, str]]:
    """Mutations without a body schema: the body is read only to fingerprint
    it for an ``Idempotency-Key``."""
    return [
        ("POST", f"/v1/tokens/{w.agent_token_id}/rotate"),
        ("POST", f"/v1/spaces/{w.space.id}/testplugin/increment"),
    ]


async def test_a_fingerprinted_body_that_is_not_json_is_refused(app, client, world, audit_log):
    cases = [
        case
        for method, path in bodiless_idempotent_routes(world)
        for case in syntax_cases(
            method, path, schema=False, headers={"Idempotency-Key": "malformed-1"}
        )
    ]
    await run_cases(app, client, audit_log, world.admin.headers, cases)


async def send_streamed(client: Any, method: str, path: str, headers: dict[str, str], size: int):
    """Send ``size`` bytes of JSON whitespace in 64 KiB chunks, with no ``Content-Length``."""
    chunk = b" " * 65536
    async with client.request(path, method=method, headers=headers) as connection:
        sent = 0
        while sent < size:
            await connection.send(chunk)
            sent += len(chunk)
        await connection.send_complete()
    return await connection.as_response()


async def test_a_streamed_body_over_the_limit_without_a_length_is_413(
    app, client, world, audit_log
):
    routes = [(r.method, r.path, {}) for r in body_routes(world)] + [
        (method, path, {"Idempotency-Key": "streamed-1"})
        for method, path in bodiless_idempotent_routes(world)
    ]
    failures = []
    for method, path, extra in routes:
        headers = {**world.admin.headers, "Content-Type": JSON, **extra}
        assert "Content-Length" not in headers
        before, audited = await snapshot(app), len(audit_log.events)
        response = await send_streamed(client, method, path, headers, 2 * MIB)
        errors = await problem_errors(response, (413,), "payload-too-large")
        if changed := changed_tables(before, await snapshot(app)):
            errors.append(f"changed {changed}")
        if len(audit_log.events) != audited:
            errors.append("audited")
        if errors:
            failures.append(f"{method} {path} -> {response.status_code}: {'; '.join(errors)}")
    assert not failures, "\n".join(failures)


async def test_a_streamed_body_under_the_limit_is_read(app, client, world):
    """The streaming helper itself works: a small chunked body gets through."""
    headers = {**world.admin.headers, "Content-Type": JSON}
    async with client.request("/v1/spaces", method="POST", headers=headers) as connection:
        await connection.send(b'{"slug": ')
        await connection.send(b'"streamed-ok"}')
        await connection.send_complete()
    response = await connection.as_response()
    assert response.status_code == 201, await response.get_data()


# -- cursors and limits ------------------------------------------------------------


def b64(raw: bytes | str) -> str:
    data = raw.encode() if isinstance(raw, str) else raw
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


#: Cursors that are not one the server issued, for any list route.
BAD_CURSORS: list[tuple[str, str]] = [
    ("garbage", "!!!not-base64!!!"),
    ("percent garbage", "%%%"),
    ("NUL", "%00"),
    ("non-ASCII", "%C3%A9t%C3%A9"),
    ("invalid UTF-8 escape", "%FF"),
    ("one base64 char", "A"),
    ("base64 of non-JSON", b64("hello, world")),
    ("base64 of invalid UTF-8", b64(b"\xff\xfe\xfd")),
    ("base64 of an object", b64('{"a": 1}')),
    ("base64 of a string", b64('"abc"')),
    ("base64 of a number", b64("5")),
    ("base64 of null", b64("null")),
    ("base64 of an empty list", b64("[]")),
    ("base64 of three keys", b64('["a", "b", "c"]')),
    ("base64 of [null]-ish", b64("[null, null]")),
    ("base64 of floats", b64("[1.5, 2.5]")),
    ("base64 of booleans", b64("[true, false]")),
    ("base64 of nested lists", b64("[[1], [2]]")),
    ("base64 of objects", b64("[{}, {}]")),
    ("huge cursor", "A" * 100_000),
    ("huge base64 of JSON", b64(json.dumps(["x" * 50_000, "y"]))[:100_001] + "!"),
    ("deeply nested", b64("[" * 10_000 + "]" * 10_000)),
    ("deeply nested, unclosed", b64("[" * 10_000)),
]
#: Cursors for one-key routes: wrong arity or type for a name/slug key.
BAD_CURSORS_ONE_KEY: list[tuple[str, str]] = [
    ("two keys", b64('["a", "b"]')),
    ("[null]", b64("[null]")),
    ("[1.5]", b64("[1.5]")),
    ("[true]", b64("[true]")),
    ("[[]]", b64("[[]]")),
    ("[{}]", b64("[{}]")),
]
#: Cursors for the token list: (created_at, public_id).
BAD_CURSORS_TOKENS: list[tuple[str, str]] = [
    ("one key", b64('["a"]')),
    ("[null, id]", b64('[null, "tk_x"]')),
    ("[time, null]", b64("[1, null]")),
    ("[time, 1.5]", b64("[1, 1.5]")),
    ("[true, id]", b64('[true, "tk_x"]')),
]
#: Cursors a server might take as a (strange) position: 200 or a 4xx, never a 5xx.
ODD_CURSORS_ONE_KEY: list[tuple[str, str]] = [
    ("[int]", b64("[5]")),
    ("[huge int]", b64(json.dumps([10**30]))),
    ("[empty string]", b64('[""]')),
    ("[NUL]", b64('["\\u0000"]')),
    ("[lone surrogate]", b64('["\\ud800"]')),
    ("[10k chars]", b64(json.dumps(["z" * 10_000]))),
]
ODD_CURSORS_TOKENS: list[tuple[str, str]] = [
    ("[string time, id]", b64('["abc", "tk_x"]')),
    ("[time, int id]", b64("[1, 2]")),
    ("[string, int] swapped", b64('["tk_x", 1]')),
    ("[2**63, id]", b64(json.dumps([2**63, "tk_x"]))),
    ("[10**30, id]", b64(json.dumps([10**30, "tk_x"]))),
    ("[-10**30, id]", b64(json.dumps([-(10**30), "tk_x"]))),
    ("[time, NUL]", b64('[1, "\\u0000"]')),
    ("[time, lone surrogate]", b64('[1, "\\ud800"]')),
]
BAD_LIMITS = ["0", "-1", "201", "abc", "1e3", "1.5", "", "%20", "%00", "0x10", "9" * 5000, "1,2"]


def list_routes(w: World) -> list[str]:
    return ["/v1/spaces", "/v1/principals", "/v1/tokens", f"/v1/spaces/{w.space.id}/members"]


def cursor_cases(w: World) -> list[Case]:
    cases: list[Case] = []
    for path in list_routes(w):
        tokens_route = path == "/v1/tokens"
        bad = BAD_CURSORS + (BAD_CURSORS_TOKENS if tokens_route else BAD_CURSORS_ONE_KEY)
        for label, cursor in bad:
            # NUL in a query value is refused at the edge, before any route.
            at_edge = "%00" in cursor
            cases.append(
                Case(
                    f"cursor {label}",
                    "GET",
                    f"{path}?cursor={cursor}",
                    content_type=None,
                    expect=(400,),
                    slug="bad-request" if at_edge else "bad-cursor",
                )
            )
        for raw in BAD_LIMITS:
            at_edge = "%00" in raw
            cases.append(
                Case(
                    f"limit={raw[:20]}",
                    "GET",
                    f"{path}?limit={raw}",
                    content_type=None,
                    expect=(400,) if at_edge else (422,),
                    slug="bad-request" if at_edge else "validation-error",
                )
            )
        cases.append(
            Case(
                "bad limit and bad cursor",
                "GET",
                f"{path}?limit=0&cursor=%%%",
                content_type=None,
            )
        )
    return cases


async def test_bad_cursors_and_limits_are_refused(app, client, world, audit_log):
    await run_cases(app, client, audit_log, world.admin.headers, cursor_cases(world))


async def test_odd_cursors_never_fail_the_server(app, client, world):
    """Well-formed but strange sort keys: a page or a 4xx, never a 5xx."""
    failures = []
    for path in list_routes(world):
        tokens_route = path == "/v1/tokens"
        for label, cursor in ODD_CURSORS_TOKENS if tokens_route else ODD_CURSORS_ONE_KEY:
            response = await client.get(f"{path}?cursor={cursor}", headers=world.admin.headers)
            if response.status_code == 200:
                body = await response.get_json()
                if not isinstance(body.get("items"), list):
                    failures.append(f"{path} [{label}] -> 200 without items")
                continue
            case = Case(f"cursor {label}", "GET", f"{path}?cursor={cursor}")
            if errors := await problem_errors(response):
                failures.append(describe(case, response.status_code, errors))
    assert not failures, "\n".join(failures)


async def test_bad_principal_filter_on_token_list(app, client, world, audit_log):
    cases = [
        Case(f"principal={label}", "GET", f"/v1/tokens?principal={ref}", content_type=None)
        for label, ref in [
            ("unknown", "pr_AAAAAAAAAAAAAAAAAAAAAA"),
            ("garbage", "!!!"),
            ("10k chars", "x" * 10_000),
            ("NUL", "a%00b"),
            ("unicode", "%C3%BCn%C3%AF"),
            ("empty", ""),
        ]
    ]
    # An admin asking for an unknown principal: 404; an empty filter names nobody.
    await run_cases(app, client, audit_log, world.admin.headers, cases[:-1])
    empty = await client.get("/v1/tokens?principal=", headers=world.admin.headers)
    assert empty.status_code < 500
    # A non-admin asking for anyone else's tokens: refused, whatever the ref.
    await run_cases(
        app,
        client,
        audit_log,
        world.agent.headers,
        [Case(c.label, c.method, c.path, content_type=None) for c in cases[:-1]],
    )


# -- ids in paths ------------------------------------------------------------------------

#: (label, raw path segment) of ids naming nothing. Well-formed ids of every kind,
#: then garbage the router still hands to the route.
BAD_IDS: list[tuple[str, str]] = [
    ("unknown space id", "sp_AAAAAAAAAAAAAAAAAAAAAA"),
    ("unknown principal id", "pr_AAAAAAAAAAAAAAAAAAAAAA"),
    ("unknown token id", "tk_AAAAAAAAAAAAAAAAAAAAAA"),
    ("unknown name", "no-such-thing"),
    ("garbage", "!$&'()*+,;=@"),
    ("10k chars", "x" * 10_000),
    ("201 chars", "s" * 201),
    ("NUL", "a%00b"),
    ("only NUL", "%00"),
    ("dot dot", ".."),
    ("encoded dot dot", "%2e%2e"),
    ("newline", "a%0Ab"),
    ("space", "%20"),
    ("unicode", "%C3%BCn%C3%AFc%C3%B6d%C3%A9"),
    ("raw unicode", "ünïcödé"),
    ("emoji", "%F0%9F%92%A5"),
    ("encoded surrogate", "%ED%A0%80"),
    ("invalid UTF-8", "%FF%FE"),
    ("SQL", "x'%20OR%20'1'='1"),
    ("percent", "%25"),
]
#: Segments that decode to a slash: the router may answer 404 or 405 itself.
TRAVERSAL_IDS: list[tuple[str, str]] = [
    ("encoded ../", "..%2F..%2Fprincipals"),
    ("encoded slash", "a%2Fb"),
]


def id_routes(w: World) -> list[tuple[str, str, dict[str, Any] | None]]:
    """(method, path with {x} for the bad id, body)."""
    s, a = w.space.id, w.agent.id
    return [
        ("GET", "/v1/spaces/{x}", None),
        ("PATCH", "/v1/spaces/{x}", {"name": "renamed"}),
        ("GET", "/v1/spaces/{x}/members", None),
        ("PUT", "/v1/spaces/{x}/members/" + a, {"role": "viewer"}),
        ("PUT", f"/v1/spaces/{s}/members/{{x}}", {"role": "viewer"}),
        ("DELETE", "/v1/spaces/{x}/members/" + a, None),
        ("DELETE", f"/v1/spaces/{s}/members/{{x}}", None),
        ("POST", "/v1/spaces/{x}/testplugin/increment", None),
        ("GET", "/v1/principals/{x}", None),
        ("PATCH", "/v1/principals/{x}", {"display_name": "renamed"}),
        ("GET", "/v1/tokens/{x}", None),
        ("DELETE", "/v1/tokens/{x}", None),
        ("POST", "/v1/tokens/{x}/rotate", None),
    ]


def id_cases(w: World, not_found: tuple[int, ...] = (404,)) -> list[Case]:
    cases = []
    for method, template, body in id_routes(w):
        raw = None if body is None else as_json(body)
        for label, segment in BAD_IDS:
            cases.append(
                Case(label, method, template.replace("{x}", segment), raw, expect=not_found)
            )
        for label, segment in TRAVERSAL_IDS:
            cases.append(
                Case(label, method, template.replace("{x}", segment), raw, expect=(*not_found, 405))
            )
    return cases


async def test_bad_ids_in_paths_are_404_for_an_admin(app, client, world, audit_log):
    await run_cases(app, client, audit_log, world.admin.headers, id_cases(world))


async def test_bad_ids_in_paths_for_a_plain_member(app, client, world, audit_log):
    """Without the admin's reach: a clean 404, or 403 where the route needs a
    higher role in the (real) space before it looks the principal up."""
    await run_cases(app, client, audit_log, world.agent.headers, id_cases(world, (403, 404)))


# -- the event stream: only invalid requests (a valid one streams forever) ----------------


@dataclass
class Opened:
    """What a briefly opened request got."""

    status: int | None
    headers: Any
    body: bytes | None  # None: still streaming when dropped
    error: BaseException | None = None


async def open_briefly(client: Any, path: str, headers: dict[str, str], wait: float = 2.0):
    """GET ``path``; the answer once complete, or what arrived if it is still
    streaming after ``wait`` seconds (then the connection is dropped), or the
    exception the app raised while answering."""
    connection = client.request(path, headers=headers)
    await connection.__aenter__()
    await connection.send_complete()
    task = connection._task
    try:
        await asyncio.wait_for(asyncio.shield(task), timeout=wait)
    except TimeoutError:
        await connection.disconnect()
        try:
            await asyncio.wait_for(task, timeout=5)
        except Exception:
            task.cancel()
        return Opened(connection.status_code, connection.headers, None)
    except Exception as exc:
        return Opened(connection.status_code, connection.headers, None, exc)
    response = await connection.as_response()
    return Opened(response.status_code, response.headers, await response.get_data())


async def stream_failures(app, client, audit_log, cases: list[tuple[str, str, dict[str, str]]]):
    failures = []
    for label, path, headers in cases:
        audited = len(audit_log.events)
        opened = await open_briefly(client, path, headers)
        where = f"GET {path[:90]} [{label}] -> {opened.status}"
        if opened.error is not None:
            failures.append(f"{where}, then the app raised {opened.error!r}"[:300])
            continue
        if opened.body is None:
            failures.append(f"{where} and it kept streaming")
            continue
        response = app.response_class(opened.body, opened.status, opened.headers)
        errors = await problem_errors(response)
        if len(audit_log.events) != audited:
            errors.append("audited")
        if errors:
            failures.append(f"{where}: {'; '.join(errors)}")
    return failures


BAD_RESUME_POINTS = [
    "abc",
    "-1",
    "-99",
    "1.5",
    "1e3",
    "0x10",
    "--1",
    "1 2",
    "9" * 5000,
]
#: Ids no event of this stream can have: sequence numbers are 64-bit.
OUT_OF_RANGE_RESUME_POINTS = [str(2**63), "9" * 30]


async def test_bad_last_event_id_is_refused_without_streaming(app, client, world, audit_log):
    path = f"/v1/spaces/{world.space.id}/events"
    member = world.agent.headers
    cases = [
        (f"Last-Event-ID={v[:20]}", path, {**member, "Last-Event-ID": v}) for v in BAD_RESUME_POINTS
    ]
    cases += [(f"after={v[:20]}", f"{path}?after={v}", member) for v in BAD_RESUME_POINTS]
    failures = await stream_failures(app, client, audit_log, cases)
    assert not failures, "\n".join(failures)


async def test_a_last_event_id_beyond_64_bits_is_refused_without_streaming(
    app, client, world, audit_log
):
    path = f"/v1/spaces/{world.space.id}/events"
    member = world.agent.headers
    cases = [
        (f"Last-Event-ID={v[:20]}", path, {**member, "Last-Event-ID": v})
        for v in OUT_OF_RANGE_RESUME_POINTS
    ]
    cases += [(f"after={v[:20]}", f"{path}?after={v}", member) for v in OUT_OF_RANGE_RESUME_POINTS]
    failures = await stream_failures(app, client, audit_log, cases)
    assert not failures, "\n".join(failures)


async def test_the_event_stream_refuses_bad_spaces_and_tokens(app, client, world, audit_log):
    cases = [
        (label, f"/v1/spaces/{segment}/events", world.agent.headers) for label, segment in BAD_IDS
    ]
    path = f"/v1/spaces/{world.space.id}/events"
    cases += [
        (f"Authorization {label}", path, headers)
        for label, headers in bad_authorizations(world.agent.token)
    ]
    failures = await stream_failures(app, client, audit_log, cases)
    assert not failures, "\n".join(failures)


# -- headers ---------------------------------------------------------------------------


def bad_authorizations(secret: str) -> list[tuple[str, dict[str, str]]]:
    return [
        ("absent", {}),
        ("empty", {"Authorization": ""}),
        ("scheme only", {"Authorization": "Bearer"}),
        ("empty bearer", {"Authorization": "Bearer "}),
        ("blank bearer", {"Authorization": "Bearer    "}),
        ("no scheme", {"Authorization": secret}),
        ("Basic", {"Authorization": "Basic YWRtaW46cGFzc3dvcmQ="}),
        ("Token scheme", {"Authorization": f"Token {secret}"}),
        ("Bearer: with colon", {"Authorization": f"Bearer: {secret}"}),
        ("tab separator", {"Authorization": f"Bearer\t{secret}"}),
        ("10k-char bearer", {"Authorization": "Bearer " + "x" * 10_000}),
        ("10k-char bmx_ bearer", {"Authorization": "Bearer bmx_" + "x" * 10_000}),
        ("prefix only", {"Authorization": "Bearer bmx_"}),
        ("non-ASCII", {"Authorization": "Bearer bmx_é"}),
        ("Latin-1 garbage", {"Authorization": "Bearer \xff\xfe"}),
        ("truncated secret", {"Authorization": f"Bearer {secret[:-1]}"}),
        ("extended secret", {"Authorization": f"Bearer {secret}x"}),
        ("two tokens", {"Authorization": f"Bearer {secret} {secret}"}),
        ("case-changed secret", {"Authorization": f"Bearer {secret.upper()}"}),
    ]


def authenticated_routes(w: World) -> list[tuple[str, str, dict[str, Any] | None]]:
    s, a = w.space.id, w.agent.id
    return [
        ("GET", "/v1/spaces", None),
        ("POST", "/v1/spaces", {"slug": "by-a-stranger"}),
        ("GET", f"/v1/spaces/{s}", None),
        ("PATCH", f"/v1/spaces/{s}", {"name": "taken over"}),
        ("GET", f"/v1/spaces/{s}/members", None),
        ("PUT", f"/v1/spaces/{s}/members/{a}", {"role": "owner"}),
        ("DELETE", f"/v1/spaces/{s}/members/{a}", None),
        ("POST", f"/v1/spaces/{s}/testplugin/increment", None),
        ("GET", f"/v1/spaces/{s}/attention", None),
        ("GET", "/v1/diagnostics", None),
        ("GET", "/metrics", None),
        ("GET", "/v1/principals", None),
        ("POST", "/v1/principals", {"kind": "agent", "name": "by-a-stranger"}),
        ("GET", "/v1/principals/me", None),
        ("GET", f"/v1/principals/{a}", None),
        ("PATCH", f"/v1/principals/{a}", {"disabled": True}),
        ("GET", "/v1/tokens", None),
        ("POST", "/v1/tokens", {}),
        ("GET", f"/v1/tokens/{w.agent_token_id}", None),
        ("DELETE", f"/v1/tokens/{w.agent_token_id}", None),
        ("POST", f"/v1/tokens/{w.agent_token_id}/rotate", None),
        ("DELETE", "/v1/sessions/current", None),
    ]


async def test_bad_authorization_headers_are_401(app, client, world, audit_log):
    cases = [
        Case(
            f"Authorization {label}",
            method,
            path,
            None if body is None else as_json(body),
            headers=headers,
            expect=(401,),
            slug="unauthenticated",
            auth=False,
        )
        for method, path, body in authenticated_routes(world)
        for label, headers in bad_authorizations(world.agent.token)
    ]
    await run_cases(app, client, audit_log, {}, cases)
    response = await client.get("/v1/spaces", headers={"Authorization": "Basic x"})
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


BAD_IDEMPOTENCY_KEYS = ["", " ", "a b", "tab\there", "x" * 201, "é", "key\x7f", "\xff"]


async def test_bad_idempotency_keys_are_refused(app, client, world, audit_log):
    s = world.space.id
    routes = [
        ("POST", "/v1/spaces", {"slug": "keyed-space"}),
        ("POST", "/v1/principals", {"kind": "agent", "name": "keyed-agent"}),
        ("POST", "/v1/tokens", {"name": "keyed"}),
        ("POST", f"/v1/tokens/{world.agent_token_id}/rotate", None),
        ("POST", f"/v1/spaces/{s}/testplugin/increment", None),
    ]
    cases = [
        Case(
            f"Idempotency-Key {key[:20]!r}",
            method,
            path,
            None if body is None else as_json(body),
            headers={"Idempotency-Key": key},
            expect=(400,),
            slug="bad-request",
        )
        for method, path, body in routes
        for key in BAD_IDEMPOTENCY_KEYS
    ]
    await run_cases(app, client, audit_log, world.admin.headers, cases)


async def test_a_bad_request_id_is_replaced_not_echoed(client, world):
    for bad in ["x" * 65, "a b", "é", "<script>", "", "a\tb"]:
        response = await client.get(
            "/v1/spaces", headers={**world.admin.headers, "X-Request-Id": bad}
        )
        assert response.status_code == 200
        assert response.headers["X-Request-Id"] not in (bad, ""), bad


# -- unknown routes and wrong methods ---------------------------------------------------


def wrong_routes(w: World) -> list[Case]:
    s, a, t = w.space.id, w.agent.id, w.agent_token_id
    not_found = [
        ("GET", "/v1/nope"),
        ("POST", "/v1/nope"),
        ("DELETE", "/v1/nope/deeper"),
        ("GET", "/v2/spaces"),
        ("GET", "/v1/spaces/"),
        ("GET", f"/v1/spaces/{s}/nope"),
        ("GET", f"/v1/spaces/{s}/members/{a}/extra"),
        ("GET", "/v1/principals/me/extra"),
        ("GET", "/"),
        ("GET", "/v1"),
        ("GET", "/" + "x" * 10_000),
        ("GET", "/v1/%00"),
        ("GET", "/%FF"),
        ("GET", "/V1/SPACES"),
    ]
    not_allowed = [
        ("DELETE", "/v1/spaces"),
        ("PUT", "/v1/spaces"),
        ("PATCH", "/v1/spaces"),
        ("POST", f"/v1/spaces/{s}"),
        ("DELETE", f"/v1/spaces/{s}"),
        ("PUT", f"/v1/spaces/{s}"),
        ("POST", f"/v1/spaces/{s}/members"),
        ("DELETE", f"/v1/spaces/{s}/members"),
        ("GET", f"/v1/spaces/{s}/members/{a}"),
        ("PATCH", f"/v1/spaces/{s}/members/{a}"),
        ("POST", f"/v1/spaces/{s}/events"),
        ("GET", f"/v1/spaces/{s}/testplugin/increment"),
        ("GET", "/v1/sessions"),
        ("PATCH", "/v1/sessions"),
        ("GET", "/v1/sessions/current"),
        ("PUT", "/v1/principals"),
        ("DELETE", "/v1/principals"),
        ("DELETE", f"/v1/principals/{a}"),
        ("PUT", f"/v1/principals/{a}"),
        ("POST", "/v1/principals/me"),
        ("PUT", "/v1/tokens"),
        ("PATCH", f"/v1/tokens/{t}"),
        ("GET", f"/v1/tokens/{t}/rotate"),
        ("POST", "/livez"),
        ("DELETE", "/readyz"),
        ("POST", "/v1/openapi.json"),
        ("BREW", "/v1/spaces"),
    ]
    return [
        Case("unknown route", m, p, as_json({}), expect=(404,), slug="not-found")
        for m, p in not_found
    ] + [
        Case("wrong method", m, p, as_json({}), expect=(405,), slug="method-not-allowed")
        for m, p in not_allowed
    ]


async def test_unknown_routes_are_404_and_wrong_methods_405(app, client, world, audit_log):
    await run_cases(app, client, audit_log, world.admin.headers, wrong_routes(world))


async def test_unknown_routes_need_no_token_to_be_404(app, client, world, audit_log):
    cases = [
        Case(c.label, c.method, c.path, c.body, expect=c.expect, auth=False)
        for c in wrong_routes(world)
    ]
    await run_cases(app, client, audit_log, {}, cases)


async def test_a_405_names_the_allowed_methods(client, world):
    """RFC 9110 section 15.5.6: a 405 response MUST carry an ``Allow`` header."""
    response = await client.delete("/v1/spaces", headers=world.admin.headers)
    assert response.status_code == 405
    allowed = {m.strip() for m in response.headers.get("Allow", "").split(",") if m.strip()}
    assert {"GET", "POST"} <= allowed, dict(response.headers)


# -- property tests -------------------------------------------------------------------

#: Strings worth trying in any field, beside random text.
SPECIAL_STRINGS = [
    "",
    " ",
    "a\u0000b",
    "a\ud800b",
    "ab\n",
    "Upper",
    "x" * 65,
    "x" * 201,
    "admin",
    "owner",
    "human",
    "me",
    "null",
    "true",
    "0",
]

#: Characters that trip storage or validation: NUL, lone surrogates, a newline...
awkward_characters = st.sampled_from(["\x00", "\ud800", "\udfff", "\n", "\u200b", "\u00e9", " "])
text = st.one_of(
    st.text(max_size=20),
    st.lists(st.characters(max_codepoint=0x7F) | awkward_characters, max_size=8).map("".join),
    st.sampled_from(SPECIAL_STRINGS),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**31), max_value=2**31),
    st.integers(),
    st.sampled_from([59, 60, 3600, MAX_TOKEN_LIFETIME, MAX_TOKEN_LIFETIME + 1, 2**63, 10**30]),
    st.floats(),
    text,
)


def json_values(keys: st.SearchStrategy[str]) -> st.SearchStrategy[Any]:
    return st.recursive(
        scalars,
        lambda children: (
            st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4)
        ),
        max_leaves=10,
    )


def bodies(
    plausible: dict[str, st.SearchStrategy[Any]], required: tuple[str, ...] = ()
) -> st.SearchStrategy[Any]:
    """Mostly objects with the schema's fields (``required`` ones always there),
    each value plausible two times in three, sometimes with stray keys; and
    sometimes any JSON value at all."""
    keys = st.one_of(st.sampled_from(sorted(plausible)), text)
    anything = json_values(keys)
    value = {name: st.one_of(strategy, strategy, anything) for name, strategy in plausible.items()}
    objects = st.builds(
        lambda known, stray: {**stray, **known},
        st.fixed_dictionaries(
            {name: value[name] for name in required},
            optional={name: v for name, v in value.items() if name not in required},
        ),
        st.one_of(
            st.just({}), st.just({}), st.dictionaries(keys, anything, min_size=1, max_size=2)
        ),
    )
    return st.one_of(objects, objects, objects, anything)


names = st.from_regex(NAME_PATTERN, fullmatch=True)
slugs = st.from_regex(SLUG_PATTERN, fullmatch=True)
PROPERTY_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
    # Shrink to a minimal failing body, but skip the costly "explain" phase.
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)


async def assert_success_or_problem(app, client, audit_log, method, path, body, headers):
    before, audited = await snapshot(app), len(audit_log.events)
    response = await client.open(
        path,
        method=method,
        data=json.dumps(body).encode(),
        headers={**headers, "Content-Type": JSON},
    )
    status = response.status_code
    note = f"{method} {path} {json.dumps(body)[:300]} -> {status}"
    assert status < 500, f"{note}: {(await response.get_data())[:300]!r}"
    if status >= 400:
        errors = await problem_errors(response)
        assert not errors, f"{note}: {errors}"
        assert not changed_tables(before, await snapshot(app)), note
        assert len(audit_log.events) == audited, note
    else:
        assert response.mimetype == JSON, note


SPACE_BODIES = bodies(
    {"slug": slugs, "name": text, "owner_id": st.sampled_from(["admin", ""]) | text},
    required=("slug",),
)
PRINCIPAL_BODIES = bodies(
    {
        "kind": st.sampled_from(PRINCIPAL_KINDS),
        "name": names,
        "display_name": text,
        "system_role": st.sampled_from([*SYSTEM_ROLES, None]),
        "password": st.sampled_from([None, "short", "a-long-enough-password"]) | text,
    },
    required=("kind", "name"),
)
TOKEN_BODIES = bodies(
    {
        "name": text,
        "principal_id": st.sampled_from(["admin", "pr_AAAAAAAAAAAAAAAAAAAAAA", None]) | text,
        "expires_in_seconds": st.integers(min_value=-10, max_value=MAX_TOKEN_LIFETIME + 10),
    }
)
PRINCIPAL_UPDATE_BODIES = bodies(
    {
        "display_name": text,
        "system_role": st.sampled_from([*SYSTEM_ROLES, None]),
        "disabled": st.booleans(),
        "password": st.sampled_from(["short", "a-long-enough-password"]) | text,
    }
)
MEMBER_BODIES = bodies({"role": st.sampled_from(SPACE_ROLES)}, required=("role",))


@PROPERTY_SETTINGS
@given(body=SPACE_BODIES)
async def test_property_create_space(app, client, world, audit_log, body):
    path = "/v1/spaces"
    await assert_success_or_problem(app, client, audit_log, "POST", path, body, world.admin.headers)


@PROPERTY_SETTINGS
@given(body=PRINCIPAL_BODIES)
async def test_property_create_principal(app, client, world, audit_log, body):
    path = "/v1/principals"
    await assert_success_or_problem(app, client, audit_log, "POST", path, body, world.admin.headers)


@PROPERTY_SETTINGS
@given(body=TOKEN_BODIES)
async def test_property_create_token(app, client, world, audit_log, body):
    path = "/v1/tokens"
    await assert_success_or_problem(app, client, audit_log, "POST", path, body, world.admin.headers)


@PROPERTY_SETTINGS
@given(body=PRINCIPAL_UPDATE_BODIES)
async def test_property_update_principal(app, client, world, audit_log, body):
    path = f"/v1/principals/{world.agent.id}"
    headers = world.admin.headers
    await assert_success_or_problem(app, client, audit_log, "PATCH", path, body, headers)


@PROPERTY_SETTINGS
@given(body=MEMBER_BODIES)
async def test_property_put_member(app, client, world, audit_log, body):
    path = f"/v1/spaces/{world.space.id}/members/{world.agent.id}"
    await assert_success_or_problem(app, client, audit_log, "PUT", path, body, world.admin.headers)


async def test_the_route_lists_cover_every_kernel_route(app, world):
    """A new kernel route must be added to the lists above (and so to these tests)."""
    kernel = {blueprint.name for blueprint in kernel_blueprints()}
    served = {
        (method, rule.rule)
        for rule in app.url_map.iter_rules()
        if rule.endpoint.partition(".")[0] in kernel
        for method in rule.methods - {"HEAD", "OPTIONS"}
    }
    placeholders = {
        world.space.id: "<space>",
        world.agent.id: "<principal>",
        world.agent_token_id: "<token_id>",
    }

    def rule_of(method: str, path: str) -> tuple[str, str]:
        for value, placeholder in placeholders.items():
            path = path.replace(value, placeholder)
        return method, path.replace("/v1/principals/<principal>", "/v1/principals/<ref>")

    covered = {rule_of(r.method, r.path) for r in body_routes(world)}
    covered |= {rule_of(m, p) for m, p, _ in authenticated_routes(world)}
    covered |= {("GET", "/v1/spaces/<space>/events"), ("POST", "/v1/sessions")}
    # Routes with nothing to malform (no body, query or path parameter).
    covered |= {("GET", p) for p in ("/livez", "/readyz", "/v1/openapi.json", "/docs")}
    assert served - covered == set()
