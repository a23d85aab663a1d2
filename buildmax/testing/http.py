"""Calling the API in a test: one request as a principal, its status and
problem checked, its body returned."""

from __future__ import annotations

from typing import Any

from ..problems import PROBLEM_TYPE_PREFIX
from .support import PrincipalHandle


async def call(
    client: Any,
    method: str,
    path: str,
    who: PrincipalHandle | str | None,
    *,
    expect: int | None = None,
    problem: str | None = None,
    json: Any = None,
    data: bytes | None = None,
    content_type: str = "application/octet-stream",
    key: str | None = None,
    headers: dict[str, str] | None = None,
) -> Any:
    """Send ``method path`` with the Quart test ``client`` as ``who`` (a
    principal, a raw token, or ``None`` for no token) and return the body:
    the decoded JSON, the bytes of any other answer, ``None`` for 204.

    ``expect`` is the status it must answer and ``problem`` the slug of the
    problem it must answer (``"not-found"``), each asserted with the body in
    the message. ``json`` is sent as a JSON body, ``data`` as raw bytes of
    ``content_type``; ``key`` is sent as ``Idempotency-Key``; ``headers``
    are added last.
    """
    sent: dict[str, str] = {}
    if who is not None:
        token = who if isinstance(who, str) else who.token
        sent["Authorization"] = f"Bearer {token}"
    if key is not None:
        sent["Idempotency-Key"] = key
    options: dict[str, Any] = {}
    if json is not None:
        options["json"] = json
    if data is not None:
        options["data"] = data
        sent["Content-Type"] = content_type
    sent.update(headers or {})
    response = await getattr(client, method.lower())(path, headers=sent, **options)
    body: Any = None
    if response.status_code != 204:
        mimetype = response.mimetype or ""
        if mimetype == "application/json" or mimetype.endswith("+json"):
            body = await response.get_json()
        else:
            body = await response.get_data()
    if expect is not None:
        assert response.status_code == expect, (response.status_code, body)
    if problem is not None:
        assert isinstance(body, dict) and body.get("type") == PROBLEM_TYPE_PREFIX + problem, body
    return body
