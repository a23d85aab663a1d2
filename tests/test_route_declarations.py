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

from buildmax.apidoc import build_openapi
from buildmax.declaration import route_doc


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
