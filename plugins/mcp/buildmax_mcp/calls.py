"""A tool call: its arguments made into a request to the tool's route, made
in-process as the caller, and the answer (or the problem) made into a
tool result.

Nothing here decides anything about tasks, reviews or artifacts: the route
checks the caller's role and scope, validates, fences, keeps the
idempotency receipt and writes the audit event, exactly as for a request
from the network. What is refused here is only what cannot become a
request at all (an argument the tool does not take, a path parameter that
is not text, content that is not base64).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import quote, urlencode

import mcp_types as types

from buildmax.internal import InternalApi
from buildmax.problems import Problem

from .catalog import CONTENT, CONTENT_BASE64, IDEMPOTENCY_ARGUMENT, MEDIA_TYPE, Binding
from .context import CallContext

if TYPE_CHECKING:
    from buildmax.app import BuildMax

log = logging.getLogger("buildmax.mcp")


class ToolArgumentError(Problem):
    """The arguments cannot make a request to the tool's route."""

    status, slug, title = 422, "invalid-tool-arguments", "The tool's arguments are not valid"


class UploadTooLarge(Problem):
    """Content past the tool's upload limit: upload it over HTTP instead."""

    status, slug, title = 413, "tool-upload-too-large", "Too large to upload through a tool"


class ToolTimedOut(Problem):
    """The call did not finish within the call timeout."""

    status, slug, title = 504, "tool-call-timeout", "The tool call took too long"


class UnknownTool(Problem):
    """No tool of that name is offered here."""

    status, slug, title = 404, "unknown-tool", "No such tool"


@dataclass(frozen=True)
class RouteRequest:
    """The request a tool call makes."""

    method: str
    path: str
    params: dict[str, str]
    json: Any
    content: bytes | None
    content_type: str
    idempotency_key: str | None


def route_request(
    binding: Binding, arguments: dict[str, Any], max_upload_bytes: int
) -> RouteRequest:
    """The request ``arguments`` make (:class:`ToolArgumentError` when they
    cannot make one; :class:`UploadTooLarge` past ``max_upload_bytes``)."""
    unknown = sorted(set(arguments) - binding.arguments)
    if unknown:
        raise ToolArgumentError(
            f"{binding.spec.name} takes no argument {', '.join(map(repr, unknown))}; "
            f"it takes {', '.join(sorted(binding.arguments))}"
        )
    path = binding.spec.path
    for name in binding.path_params:
        value = arguments.get(name)
        if isinstance(value, bool) or not isinstance(value, str | int) or str(value) == "":
            raise ToolArgumentError(f"{name} is required: a non-empty string", argument=name)
        text = str(value)
        # One path segment: the router decodes %2F, and a dot segment climbs.
        if "/" in text or "\\" in text or text in (".", ".."):
            raise ToolArgumentError(
                f"{name} is an id or a name: it holds no '/' and is not '.' or '..'",
                argument=name,
            )
        path = path.replace("{" + name + "}", quote(text, safe=""))
    asked = {name: arguments[name] for name in binding.query if name in arguments}
    params = {
        name: _query_value(name, value)
        for name, value in {**asked, **binding.fixed_query}.items()
        if value is not None
    }
    key = arguments.get(IDEMPOTENCY_ARGUMENT)
    if key is not None and not isinstance(key, str):  # its value: the route's to check
        raise ToolArgumentError(f"{IDEMPOTENCY_ARGUMENT} must be a string")
    content, content_type, body = None, "application/octet-stream", None
    if binding.spec.body == "bytes":
        content, content_type = _content(binding, arguments, path, params, max_upload_bytes)
    elif binding.spec.method != "GET":
        body = {name: arguments[name] for name in binding.body if name in arguments}
        body.update(binding.fixed_body)
    return RouteRequest(binding.spec.method, path, params, body, content, content_type, key)


def _query_value(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise ToolArgumentError(f"{name} must be a string, a number or a boolean", argument=name)


def _content(
    binding: Binding,
    arguments: dict[str, Any],
    where: str,
    params: dict[str, str],
    max_upload_bytes: int,
) -> tuple[bytes, str]:
    """The bytes and media type of an upload's arguments; ``where`` is the
    path a larger upload goes to over HTTP."""
    text, encoded = arguments.get(CONTENT), arguments.get(CONTENT_BASE64)
    if (text is None) == (encoded is None):
        raise ToolArgumentError(f"give exactly one of {CONTENT} and {CONTENT_BASE64}")
    media_type = arguments.get(MEDIA_TYPE)
    if media_type is not None and not isinstance(media_type, str):  # its value: the route's
        raise ToolArgumentError(f"{MEDIA_TYPE} must be a string", argument=MEDIA_TYPE)
    given, name = (text, CONTENT) if text is not None else (encoded, CONTENT_BASE64)
    if not isinstance(given, str):
        raise ToolArgumentError(f"{name} must be a string", argument=name)
    if text is not None:
        try:
            data = given.encode("utf-8")
        except UnicodeEncodeError:
            raise ToolArgumentError(
                f"{CONTENT} is not text (an unpaired surrogate): send {CONTENT_BASE64}",
                argument=CONTENT,
            ) from None
        default = "text/plain; charset=utf-8"
    else:
        try:  # wrapped lines (the base64 command's 76 columns) are fine
            data = base64.b64decode("".join(given.split()), validate=True)
        except (binascii.Error, ValueError):
            raise ToolArgumentError(
                f"{CONTENT_BASE64} is not base64", argument=CONTENT_BASE64
            ) from None
        default = "application/octet-stream"
    if len(data) > max_upload_bytes:
        _too_large(binding, where, params, max_upload_bytes)
    return data, media_type or default


def _too_large(binding: Binding, where: str, params: dict[str, str], limit: int) -> NoReturn:
    """Refuse content past the limit, saying how to upload it over HTTP."""
    raise UploadTooLarge(
        f"a tool uploads up to {limit} bytes; send larger content over HTTP to this "
        f"server: {binding.spec.method} {where}?{urlencode(params)} with the bytes as the "
        "body, its Content-Type, 'Authorization: Bearer $BUILDMAX_TOKEN' and an "
        "Idempotency-Key header",
        limit=limit,
        method=binding.spec.method,
        path=where,
        query=params,
    )


async def fetch(
    app: BuildMax, made: RouteRequest, context: CallContext, *, limit_seconds: float
) -> Any:
    """Make ``made`` in-process as the caller, within ``limit_seconds``: the
    route's answer, or its :class:`Problem` (:class:`ToolTimedOut` past the
    limit, the route's work cancelled with it)."""
    api = InternalApi(app, context.caller, request_id=context.request_id)
    try:
        async with asyncio.timeout(limit_seconds):
            return await api.request(
                made.method,
                made.path,
                json=made.json,
                params=made.params,
                idempotency_key=made.idempotency_key,
                content=made.content,
                content_type=made.content_type,
            )
    except TimeoutError:
        raise ToolTimedOut(
            f"{made.method} {made.path} did not finish within {limit_seconds:g} s; a change "
            "it made commits or rolls back whole: retry with the same idempotency_key to "
            "learn which"
        ) from None


async def call(
    app: BuildMax,
    binding: Binding,
    arguments: dict[str, Any],
    context: CallContext,
    *,
    max_upload_bytes: int,
    limit_seconds: float,
) -> types.CallToolResult:
    """The result of calling ``binding``'s tool with ``arguments``: the
    route's answer, or the problem it answered with, as a tool error."""
    try:
        made = route_request(binding, arguments, max_upload_bytes)
        answer = await fetch(app, made, context, limit_seconds=limit_seconds)
    except Problem as problem:
        return problem_result(problem, context)
    except Exception:
        log.exception("tool %s failed (request %s)", binding.spec.name, context.request_id)
        return problem_result(Problem("an internal error occurred; see the server log"), context)
    return answer_result(answer)


def answer_result(answer: Any) -> types.CallToolResult:
    """A route's answer as a tool result: the JSON as text, and as
    structured content when it is an object."""
    text = json.dumps(answer, ensure_ascii=False, separators=(",", ":"))
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=answer if isinstance(answer, dict) else None,
    )


def problem_result(problem: Problem, context: CallContext) -> types.CallToolResult:
    """A problem as a tool error: its slug and detail first, for a model to
    read; the whole problem document as structured content."""
    document = {"slug": problem.slug, **problem.to_dict(request_id=context.request_id)}
    if "Retry-After" in problem.headers:  # the HTTP header, as a member a model reads
        document["retry_after"] = int(problem.headers["Retry-After"])
    text = f"{problem.slug} ({problem.status}): {problem.detail}"
    if problem.extra:
        text += "\n" + json.dumps(problem.extra, ensure_ascii=False, separators=(",", ":"))
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content=document,
        is_error=True,
    )
