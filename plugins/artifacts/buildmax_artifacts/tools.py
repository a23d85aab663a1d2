"""The artifact store's operations offered to agents as tools
(``buildmax_agent_tools``)."""

from __future__ import annotations

from buildmax_hookspecs import AgentTool

_SPACES = "/v1/spaces/{space}"

TOOLS = (
    AgentTool(
        name="upload_artifact",
        title="Upload an artifact",
        description="Store a small file (a patch, a log, a report) as an artifact: name, and "
        "content (text) or content_base64. Link it to your attempt with attempt and generation. "
        "The result's id goes into submit's artifacts. Larger files are refused with "
        "instructions for the HTTP upload.",
        method="POST",
        path=f"{_SPACES}/artifacts",
        body="bytes",
    ),
    AgentTool(
        name="show_artifact",
        title="Show an artifact",
        description="An artifact's metadata: name, size, sha256, media type, its attempt.",
        method="GET",
        path=f"{_SPACES}/artifacts/{{artifact}}",
        arguments={"artifact": "The artifact's id."},
    ),
)
