"""One declaration per route drives its behaviour: the kernel authenticates,
checks roles, validates the body and keeps idempotency receipts as
``@api`` says, and hands the handler what that produced. No handler
repeats any of it by hand, where it could drift from what the declaration
(and so the OpenAPI document) promises."""

from __future__ import annotations

import ast
import inspect
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from buildmax.apidoc import api, build_openapi
from buildmax.declaration import route_doc
from buildmax.testing import call


def _route_modules(app: Any) -> set[ModuleType]:
    """The modules the app's declared views come from, with the routes
    package around each (where their shared helpers live)."""
    found = set()
    for view in app.view_functions.values():
        if route_doc(view) is None:
            continue
        module = inspect.getmodule(inspect.unwrap(view))
        assert module is not None
        found.add(module)
        if module.__package__ and module.__package__.endswith(".routes"):
            found.add(sys.modules[module.__package__])
    return found


def _calls_by_hand(module: ModuleType) -> list[str]:
    """Calls in ``module`` of what a declaration applies: ``authenticate``,
    ``load_body``, ``idempotency.run`` anywhere, and ``require_space`` on
    the path's ``space`` (a space found some other way, such as an
    attempt's, is not the declaration's to check)."""
    source = Path(inspect.getfile(module))
    found = []
    for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        by_hand = name in ("authenticate", "load_body") or (
            name == "run"
            and isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Attribute)
            and func.value.attr == "idempotency"
        )
        if name == "require_space":
            first = node.args[0] if node.args else None
            by_hand = isinstance(first, ast.Name) and first.id == "space"
        if by_hand:
            found.append(f"{source.name}:{node.lineno} {name}")
    return found


@pytest.mark.engine_independent
def test_no_handler_does_by_hand_what_its_declaration_does(app) -> None:
    """Catches a route that authenticates, checks the space role, loads its
    body or runs its own idempotency (seen failing with ``await
    authenticate()`` put back into one tasks route)."""
    modules = _route_modules(app)
    names = {m.__name__ for m in modules}
    # The walk reaches the kernel's and every first-party plugin's routes.
    for expected in (
        "buildmax.routes.spaces",
        "buildmax_tasks.routes.attempts",
        "buildmax_tasks.routes",
        "buildmax_reviews.routes",
        "buildmax_artifacts.routes",
        "buildmax_marketplace.routes",
        "buildmax_audit.routes",
    ):
        assert expected in names, expected
    by_hand = [call for module in sorted(modules, key=str) for call in _calls_by_hand(module)]
    assert by_hand == []


@pytest.mark.engine_independent
async def test_the_declared_space_role_is_in_the_document(app) -> None:
    """Who may call a route is read from the declaration the kernel applies,
    so the document cannot claim a role the route does not check."""
    async with app.app_context():
        document = build_openapi(app, "BuildMax", "test")
    operation = document["paths"]["/v1/spaces/{space}"]["patch"]
    assert operation["x-space-role"] == "admin"
    assert operation["x-permission-action"] == "space.update"
    assert "Needs at least the admin role in the space" in operation["description"]
    created = document["paths"]["/v1/spaces"]["post"]
    assert created["x-system-roles"] == ["admin", "operator"]


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"idempotent": True, "not_idempotent": "no"}, "idempotent or says why not"),
        ({"role": "member"}, "needs the action"),
        ({"action": "x.y"}, "needs the action"),
        ({"role": "boss", "action": "x.y"}, "not a space role"),
        ({"system_roles": ["root"]}, "system roles are"),
        ({"auth": False, "role": "viewer", "action": "x.y"}, "need a caller"),
        ({"auth": False, "idempotent": True}, "need a caller"),
        ({"secret_fields": ["password"]}, "idempotent route's fingerprint"),
    ],
)
@pytest.mark.engine_independent
def test_a_declaration_the_kernel_cannot_apply_is_refused_at_import(options, why) -> None:
    with pytest.raises(ValueError, match=why):
        api("A route declared wrong", **options)


@pytest.mark.engine_independent
async def test_who_may_call_is_decided_before_the_body_is_read(
    client, make_principal, make_space
) -> None:
    """A caller refused by the declaration learns nothing from its body:
    no token is 401, a stranger 404, a member below the role 403, and only
    an allowed caller gets the body's 422. Catches the body validated
    before the role check."""
    owner = await make_principal("human")
    viewer = await make_principal("agent")
    stranger = await make_principal("agent")
    space = await make_space(owner)
    await call(
        client,
        "PUT",
        f"/v1/spaces/{space.id}/members/{viewer.id}",
        owner,
        json={"role": "viewer"},
        expect=200,
    )
    path = f"/v1/spaces/{space.id}"
    bad = {"name": 7}
    await call(client, "PATCH", path, None, json=bad, expect=401)
    await call(client, "PATCH", path, stranger, json=bad, expect=404, problem="not-found")
    await call(client, "PATCH", path, viewer, json=bad, expect=403, problem="forbidden")
    await call(client, "PATCH", path, owner, json=bad, expect=422, problem="validation-error")
    await call(client, "POST", "/v1/principals", viewer, json={"kind": 7}, expect=403)
