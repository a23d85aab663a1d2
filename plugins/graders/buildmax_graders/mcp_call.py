"""The ``mcp`` step: one tool call through the official MCP SDK's client,
as one of the journey's actors, to the server's ``/mcp`` endpoint.

A journey reaches the Model Context Protocol surface the way an agent's
MCP client does: a fresh client session (initialize, then ``tools/call``)
over streamable HTTP, with the actor's bearer token. What the step saves
reads like a ``request`` step's answer, so the same graders apply: a
refusal's ``status`` and ``body`` (the problem document, whose ``type``
names its slug) satisfy the ``status`` grader; a success's ``body`` is the
route's JSON answer for ``json_schema``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from .run import JourneyRun, StepFailed

#: Keys an ``mcp`` step's table may hold, beside ``step``, ``save``,
#: ``name`` and ``engines``, which every step may.
KEYS = ("as", "tool", "arguments", "expect", "server", "timeout")

#: ``expect`` for a call that must succeed; anything else names a problem slug.
SUCCESS = "ok"

#: Seconds each request of a call's session may take, unless the step says.
DEFAULT_TIMEOUT = 60.0

#: Characters of a result's text kept in the saved value.
TEXT_KEPT = 64 * 1024

_EVERY_STEP = {"step", "save", "name", "engines"}
#: Where the exceptions of the SDK and of the models it reads messages with come from.
_SDK_PACKAGES = {"mcp", "mcp_types", "pydantic", "pydantic_core"}
_SLUG = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


def check(spec: Mapping[str, Any]) -> None:
    """Refuse a table the step cannot run: ``ValueError`` naming the key."""
    unknown = sorted(set(spec) - set(KEYS) - _EVERY_STEP)
    if unknown:
        raise ValueError(f"mcp: unknown key(s) {', '.join(unknown)}")
    for key in ("as", "tool"):
        if key not in spec:
            raise ValueError(f"mcp: missing required key {key!r}")
        if not isinstance(spec[key], str) or not spec[key].strip():
            raise ValueError(f"mcp: {key!r} must be a non-empty string")
    if not isinstance(spec.get("arguments", {}), Mapping):
        raise ValueError("mcp: 'arguments' must be a table")
    expect = spec.get("expect")
    if expect is not None and not (isinstance(expect, str) and _SLUG.fullmatch(expect)):
        raise ValueError(f"mcp: 'expect' must be {SUCCESS!r} or a problem slug ('claim-vetoed')")
    server = spec.get("server", 0)
    if isinstance(server, bool) or not isinstance(server, int) or server < 0:
        raise ValueError("mcp: 'server' must be a server process index (0, 1, ...)")
    timeout = spec.get("timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 600:
        raise ValueError("mcp: 'timeout' must be seconds, more than 0 and at most 600")


async def tool_call(run: JourneyRun, spec: Mapping[str, Any]) -> Any:
    """Call ``tool`` with the rendered ``arguments`` ``as`` an actor
    (``admin`` or a saved principal), through the SDK's client on server
    ``server``'s ``/mcp``; ``timeout`` seconds for each request of the
    session. ``expect``
    (``"ok"``, or a problem slug) makes another outcome fail the step.
    Saves ``{tool, error, status, problem, body, text}``: ``error`` is the
    result's ``isError``; for a refusal ``status`` and ``problem`` are the
    problem's, ``body`` its document; for a success ``body`` is the answer."""
    actor = str(run.render(spec["as"]))
    tool = str(run.render(spec["tool"]))
    arguments = run.render(spec.get("arguments", {}))
    label = f"{tool} as {actor}"
    token = run.token(actor)
    url = run.url(int(spec.get("server", 0))) + "/mcp"
    seconds = float(spec.get("timeout", DEFAULT_TIMEOUT))
    result = await _call(label, url, token, tool, arguments, seconds)
    record = _record(tool, result)
    body = record["body"]
    if isinstance(body, Mapping) and isinstance(body.get("token"), str):
        run.secret(body["token"])  # a token minted through a tool: redacted, looked for in logs
    _check_expected(label, record, spec.get("expect"))
    return record


async def _call(
    label: str,
    url: str,
    token: str | None,
    tool: str,
    arguments: Mapping[str, Any],
    seconds: float,
) -> Any:
    """The ``CallToolResult`` of one call in a session of its own;
    ``StepFailed`` when the endpoint answers no MCP at all."""
    # Imported by the step that needs them: the SDK takes two seconds to
    # import, and ``buildmax qualify`` imports this module whether or not a
    # journey calls a tool.
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    refused: list[str] = []

    async def note_refusal(response: httpx2.Response) -> None:
        # The SDK reports an HTTP refusal of its POST as an internal error
        # without the status; keep what the endpoint said, for the reason.
        if response.request.method == "POST" and response.status_code >= 400:
            await response.aread()
            refused.append(f"POST /mcp answered {response.status_code}: {_said(response.text)}")

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx2.AsyncClient(
        headers=headers, timeout=seconds, event_hooks={"response": [note_refusal]}
    )
    try:
        async with http, Client(streamable_http_client(url, http_client=http)) as client:
            return await client.call_tool(tool, dict(arguments), read_timeout_seconds=seconds)
    except Exception as exc:
        # The SDK's task groups wrap what went wrong; the first cause says it.
        cause = _first_cause(exc)
        if refused:
            raise StepFailed(f"{label}: {refused[0]}") from None
        if isinstance(cause, httpx2.TransportError):
            raise StepFailed(f"{label}: the server did not answer: {cause!r}") from None
        if _refused_by_sdk(cause):
            raise StepFailed(f"{label}: no MCP answer: {type(cause).__name__}: {cause}") from None
        raise cause from exc


def _first_cause(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _refused_by_sdk(exc: BaseException) -> bool:
    """Whether the SDK refused what the server answered: an error it
    raises (``MCPError``), a message its models cannot read, or a result
    that does not match the tool's declared output schema (``RuntimeError``)."""
    package = type(exc).__module__.partition(".")[0]
    return package in _SDK_PACKAGES or isinstance(exc, RuntimeError)


def _said(text: str) -> str:
    try:
        body = json.loads(text)
    except ValueError:
        return text[:200]
    if isinstance(body, Mapping):
        return str(body.get("detail") or body.get("title") or "")[:200]
    return text[:200]


def _record(tool: str, result: Any) -> dict[str, Any]:
    """What the step saves of a ``CallToolResult``."""
    text = "\n".join(str(getattr(part, "text", "")) for part in result.content)
    body = result.structured_content
    if body is None and text:
        try:
            body = json.loads(text)  # an answer that is not an object (a list) comes as text only
        except ValueError:
            body = None
    error = bool(result.is_error)
    problem = body if error and isinstance(body, Mapping) else {}
    return {
        "tool": tool,
        "error": error,
        "status": problem.get("status"),
        "problem": problem.get("slug"),
        "body": body,
        "text": text[:TEXT_KEPT],
    }


def _check_expected(label: str, record: Mapping[str, Any], expect: str | None) -> None:
    if expect is None:
        return
    if not record["error"]:
        if expect != SUCCESS:
            raise StepFailed(f"{label}: succeeded, expected the problem {expect!r}")
        return
    said = record["text"].splitlines()[0][:200] if record["text"] else "no text"
    if expect == SUCCESS:
        raise StepFailed(f"{label}: refused ({said}), expected success")
    if record["problem"] != expect:
        raise StepFailed(f"{label}: refused ({said}), expected the problem {expect!r}")
