"""The MCP plugin's settings, from the ``[plugins.mcp]`` table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from buildmax_hookspecs import App

from buildmax.config import integer_settings, plugin_settings


@dataclass(frozen=True)
class McpSettings:
    """How much one token may ask of ``/mcp`` at once.

    The endpoint is stateless (no session lives on the server between
    requests), so what is bounded is work in flight, not sessions."""

    #: Tool calls and resource reads one token may have in flight in one
    #: server process; one more is refused (``too-many-requests``, with
    #: ``retry_after``).
    max_calls_per_token: int = 8
    #: How long one tool call may take before it is answered as timed out.
    #: A change it was making still commits or rolls back whole; retry it
    #: with the same ``idempotency_key`` to learn which.
    call_timeout_seconds: int = 30
    #: The largest artifact a tool call uploads (decoded bytes); a larger
    #: one is answered with how to upload it over HTTP. Its base64 form must
    #: fit in the server's ``max_body_bytes``.
    max_upload_bytes: int = 512 * 1024

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> McpSettings:
        """Settings from a ``[plugins.mcp]`` table; unknown keys are refused."""
        return integer_settings(cls, "mcp", raw, minimum=1)


def mcp_settings(app: App) -> McpSettings:
    """The app's MCP settings (parsed once, kept on the app)."""
    return plugin_settings(app, "mcp", McpSettings.from_mapping)
