"""The tools, resources and prompt an agent sees: each plugin's
``buildmax_agent_tools``, with the JSON Schemas of the route each calls; a
third party adds its own; a tool that cannot be served stops start-up."""

from __future__ import annotations

import re
from typing import Any

import pytest
from buildmax_hookspecs import AgentTool, hookimpl
from jsonschema import Draft202012Validator
from quart import Blueprint, Response

from buildmax.apidoc import api
from buildmax.app import create_app
from buildmax.testing import without_plugins

from .conftest import Team, http_session

#: What an agent's whole loop needs (issue scope), by tool name.
LOOP_TOOLS = {
    "list_ready",
    "claim_next",
    "claim_task",
    "show_task",
    "task_dependencies",
    "show_attempt",
    "renew",
    "checkpoint",
    "submit",
    "release",
    "upload_artifact",
    "list_reviews",
    "claim_review",
    "record_review",
    "list_findings",
    "claim_integration",
    "ask_decision",
    "list_decisions",
}


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_the_loop_s_tools_with_schemas_from_their_routes(team: Team, mode: str) -> None:
    """Every loop tool is listed with a description and valid JSON Schemas
    (an object at the root, as the handshake-era versions require); the
    arguments are the route's (a fenced call requires its generation, an
    idempotent one takes idempotency_key, a read takes its filters)."""
    async with http_session(team.base_url, team.author.token, mode) as tools:
        listed = {tool.name: tool for tool in (await tools.client.list_tools()).tools}
    assert set(listed) >= LOOP_TOOLS
    for tool in listed.values():
        assert tool.description and len(tool.description) > 40, tool.name
        Draft202012Validator.check_schema(tool.input_schema)
        assert tool.input_schema["type"] == "object"
        if tool.output_schema is not None:
            Draft202012Validator.check_schema(tool.output_schema)
            assert tool.output_schema["type"] == "object", tool.name
    claim_out = listed["claim_next"].output_schema
    assert claim_out is not None and {"task", "attempt"} <= set(claim_out["properties"])
    submit_out = listed["submit"].output_schema
    assert submit_out is not None
    assert {"submission", "task", "stage", "work_ids"} <= set(submit_out["properties"])
    renew = listed["renew"].input_schema
    assert {"space", "attempt", "generation"} <= set(renew["required"])
    assert "idempotency_key" in renew["properties"]
    assert listed["renew"].annotations.read_only_hint is False
    ready = listed["list_ready"]
    assert {"kind", "project", "label", "cursor", "limit"} <= set(ready.input_schema["properties"])
    assert ready.input_schema["properties"]["kind"]["enum"] == [
        "code",
        "review",
        "integration",
        "general",
    ]
    assert "idempotency_key" not in ready.input_schema["properties"]
    assert (ready.annotations.read_only_hint, ready.annotations.idempotent_hint) == (True, True)
    # A change repeats harmlessly only with its key: no tool that changes is
    # announced as idempotent (a client may retry those on its own).
    assert not [
        t.name
        for t in listed.values()
        if t.annotations.idempotent_hint and not t.annotations.read_only_hint
    ]
    # "claim the next review" is claim-next with the kind set: no kind to pass.
    assert "kind" not in listed["claim_review"].input_schema["properties"]
    upload = listed["upload_artifact"].input_schema["properties"]
    assert {"content", "content_base64", "media_type", "name", "attempt"} <= set(upload)


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_a_tool_s_answer_fits_its_output_schema(team: Team, mode: str) -> None:
    """The SDK's client checks structured content against the output
    schema: a claim's answer (nullable task, attempt with a generation)
    passes it both when something was claimed and when nothing was."""
    await team.task("one")
    async with http_session(team.base_url, team.author.token, mode) as tools:
        claimed = await tools.ok("claim_next", space=team.space.slug)
        nothing = await tools.ok("claim_next", space=team.space.slug)
    assert claimed["attempt"]["generation"] == 1
    assert nothing["task"] is None


async def test_the_task_resource_and_the_loop_prompt(team: Team) -> None:
    """A task reads as a resource (JSON, what show_task answers); the
    work_loop prompt names the space and the tools in their order."""
    task = await team.task("read me")
    uri = f"buildmax://spaces/{team.space.slug}/tasks/{task['id']}"
    async with http_session(team.base_url, team.author.token) as tools:
        templates = await tools.client.list_resource_templates()
        assert "buildmax://spaces/{space}/tasks/{task}" in [
            t.uri_template for t in templates.resource_templates
        ]
        read = await tools.client.read_resource(uri)
        prompt = await tools.client.get_prompt("work_loop", {"space": team.space.slug})
    assert '"title": "read me"' in read.contents[0].text  # type: ignore[union-attr]
    text = prompt.messages[0].content.text  # type: ignore[union-attr]
    assert team.space.slug in text
    assert text.index("claim_next") < text.index("renew") < text.index("submit")


async def test_a_resource_uri_names_one_task(team: Team) -> None:
    """A resource URI's parameters are one segment each, as a tool's are:
    a dot segment or an encoded '/' is refused with the problem's slug."""
    task = await team.task("t")
    base = f"buildmax://spaces/{team.space.slug}/tasks"
    async with http_session(team.base_url, team.author.token) as tools:
        for uri in (f"{base}/..", f"{base}/%2e%2e", f"{base}/{task['id']}%2Fattempts"):
            with pytest.raises(Exception, match="invalid-tool-arguments"):
                await tools.client.read_resource(uri)


async def test_a_resource_of_another_space_is_not_read(
    team: Team, make_principal: Any, make_space: Any
) -> None:
    """A member of the team's space reads nothing of another space through
    the resource (the route's 404, as an MCP error)."""
    stranger = await make_principal("human")
    other_space = await make_space(stranger)
    other = await team.api(
        "POST", f"/v1/spaces/{other_space.slug}/projects", stranger, json={"name": "p"}, expect=201
    )
    task = await team.api(
        "POST",
        f"/v1/spaces/{other_space.slug}/tasks",
        stranger,
        json={"project": other["id"], "title": "secret"},
        expect=201,
    )
    uri = f"buildmax://spaces/{other_space.slug}/tasks/{task['id']}"
    async with http_session(team.base_url, team.author.token) as tools:
        with pytest.raises(Exception, match="not-found") as raised:
            await tools.client.read_resource(uri)
    assert "secret" not in str(raised.value)


# -- a third party's tools ---------------------------------------------------------

notes = Blueprint("notes_probe", __name__)


@notes.get("/v1/spaces/<space>/notes-probe")
@api("List notes (viewers)", role="viewer", action="notes.read")
async def list_notes_probe(space: str) -> Response:
    return Response('{"items": []}', content_type="application/json")


class NotesTools:
    """A third-party plugin offering a tool on its own route."""

    def __init__(self, *tools: AgentTool) -> None:
        self.tools = tools

    @hookimpl
    def buildmax_blueprints(self, app: Any) -> list[Any]:
        return [notes]

    @hookimpl
    def buildmax_agent_tools(self) -> tuple[AgentTool, ...]:
        return self.tools


NOTES = AgentTool(
    name="list_notes",
    description="The space's notes, newest first; a probe of a third party's tool.",
    method="GET",
    path="/v1/spaces/{space}/notes-probe",
)


async def _tool_names(settings: Any, *tools: AgentTool) -> list[str]:
    """The tools of an app with ``tools`` offered by a third party, as the
    first /mcp request finds them."""
    from buildmax_mcp.lifecycle import started

    app = create_app(settings, auto_migrate=True, extra_plugins=[("notes", NotesTools(*tools))])
    async with app.test_app(), app.app_context():
        return list((await started(app)).catalog.bindings)


@pytest.mark.engine_independent
async def test_a_third_party_plugin_adds_its_tool_through_buildmax_agent_tools(
    buildmax_settings: Any,
) -> None:
    names = await _tool_names(buildmax_settings, NOTES)
    assert "list_notes" in names and "claim_next" in names


@pytest.mark.engine_independent
@pytest.mark.parametrize(
    ("tool", "message"),
    [
        (
            AgentTool(name="claim_next", description="again", method="GET", path=NOTES.path),
            "plugin 'tasks' offers it too",
        ),
        (
            AgentTool(name="nowhere", description="x", method="GET", path="/v1/nowhere"),
            "GET /v1/nowhere is not a declared route",
        ),
    ],
)
async def test_a_tool_that_cannot_be_served_stops_start_up(
    buildmax_settings: Any, tool: AgentTool, message: str
) -> None:
    # The app's start fails with the check's error (wrapped by the lifespan).
    with pytest.raises(Exception, match=re.escape(message)):
        await _tool_names(buildmax_settings, tool)


@pytest.mark.engine_independent
async def test_a_tool_whose_arguments_cannot_be_served_fails_the_first_mcp_request(
    buildmax_settings: Any,
) -> None:
    """What needs the routes' schemas (a fixed argument the route does not
    take) is checked when the SDK and the catalog load, with the first
    /mcp request: it fails naming the plugin and the tool."""
    odd = AgentTool(name="odd", description="x", method="GET", path=NOTES.path, fixed={"zzz": 1})
    with pytest.raises(Exception, match=re.escape("the fixed argument 'zzz' is not one")):
        await _tool_names(buildmax_settings, odd)


@pytest.mark.engine_independent
async def test_without_the_plugin_that_owns_them_its_tools_are_gone(
    buildmax_settings: Any,
) -> None:
    """The reviews plugin's tools come with it: a server without it offers
    the queue's tools only."""
    names = await _tool_names(without_plugins(buildmax_settings, "reviews"))
    assert "claim_next" in names
    assert not {"record_review", "list_findings"} & set(names)


async def test_claim_review_and_claim_integration_claim_only_their_kind(team: Team) -> None:
    """With implementation work ready at a higher priority, claim_review
    takes the review and claim_integration the integration: the kind each
    tool fixes reaches the route."""
    space = team.space.slug
    subject = await team.task("the subject")
    claim = await team.api(
        "POST", f"/tasks/{subject['id']}/claim", team.author, json={}, expect=201
    )
    handed = await team.api(
        "POST",
        f"/attempts/{claim['attempt']['id']}/submit",
        team.author,
        json={"generation": 1, "summary": "done"},
        expect=201,
    )
    await team.task("urgent code", priority=900)
    async with http_session(team.base_url, team.reviewer.token) as reviewer:
        nothing = await reviewer.ok("claim_integration", space=space)
        assert nothing["task"] is None
        review = await reviewer.ok("claim_review", space=space)
        assert (review["task"]["id"], review["task"]["kind"]) == (handed["work_ids"][0], "review")
        await reviewer.ok(
            "record_review", space=space, ident=review["task"]["id"], decision="approve"
        )
    async with http_session(team.base_url, team.integrator.token) as integrator:
        integration = await integrator.ok("claim_integration", space=space)
        assert integration["task"]["kind"] == "integration"
        assert integration["task"]["subject_task_id"] == subject["id"]


async def test_a_tool_call_does_not_list_the_tools(team: Team, monkeypatch: Any) -> None:
    """The SDK checks a call's arguments against its tool's input schema;
    the catalog answers that one schema by name. Were the server to list
    every tool (their schemas validated and serialized) for each call, a
    call would cost several times its route's work."""
    from buildmax_mcp.catalog import Catalog

    listed = []
    original = Catalog.tools

    def counting(self: Catalog) -> Any:
        listed.append(1)
        return original.fget(self)  # type: ignore[attr-defined]

    monkeypatch.setattr(Catalog, "tools", property(counting))
    await team.task("t")
    async with http_session(team.base_url, team.author.token) as tools:
        await tools.client.list_tools()  # the client's own list, for output schemas
        before = len(listed)
        claimed = await tools.ok("claim_next", space=team.space.slug)
        await tools.ok(
            "renew", space=team.space.slug, attempt=claimed["attempt"]["id"], generation=1
        )
        assert len(listed) == before
