"""The notes plugin, tested as its users see it: installed, discovered through
its entry point, on a fresh database per test (SQLite, or PostgreSQL when
``BUILDMAX_TEST_DATABASE_URL`` is set). Every fixture comes from
``buildmax.testing``, which pytest loads by itself once ``buildmax`` is installed."""

from __future__ import annotations

import asyncio
import json

import httpx
import sqlalchemy as sa
from buildmax.client import Client
from buildmax.migrations import migration_status
from buildmax.testing import call

from buildmax_notes import notes
from buildmax_notes.client import NotesClient

NOT_FOUND = "urn:buildmax:problem:not-found"


def notes_url(space) -> str:
    return f"/v1/spaces/{space.slug}/notes"


async def stored_notes(app) -> list[dict]:
    async with app.db.read() as conn:
        rows = await conn.fetch_all(sa.select(notes.c.public_id, notes.c.text))
    return [dict(row) for row in rows]


# -- installation and schema ---------------------------------------------------


async def test_the_plugin_is_discovered_through_its_entry_point(app):
    info = {i.name: i for i in app.plugins.infos()}["notes"]
    assert info.loaded, info.error
    assert info.source.startswith("entry point buildmax_notes")
    assert {"buildmax_audit_actions", "buildmax_blueprints", "buildmax_migrations"} <= set(
        info.hooks
    )


async def test_its_migration_has_run_and_created_the_table(app):
    statuses = {s.plugin: s for s in await migration_status(app.db, app.migrations())}
    assert (statuses["notes"].db_version, statuses["notes"].state) == (1, "current")
    assert await stored_notes(app) == []


# -- the routes -----------------------------------------------------------------


async def test_a_member_adds_and_lists_notes(client, clock, make_principal, make_space):
    owner = await make_principal("human")
    stranger = await make_principal("agent")
    space = await make_space(owner)

    first = await call(client, "POST", notes_url(space), owner, json={"text": "hello"}, expect=201)
    assert first["id"].startswith("nt_")
    assert first["text"] == "hello"
    assert first["created_at"].endswith("Z")

    clock.advance(seconds=1)
    await call(client, "POST", notes_url(space), owner, json={"text": "world"}, expect=201)

    listed = await call(client, "GET", notes_url(space), owner, expect=200)
    assert [note["text"] for note in listed["items"]] == ["world", "hello"]
    await call(client, "GET", notes_url(space), stranger, expect=404, problem="not-found")


async def test_the_list_is_paged_newest_first(client, clock, make_principal, make_space):
    owner = await make_principal("human")
    space = await make_space(owner)
    for n in range(5):
        response = await client.post(
            notes_url(space), json={"text": f"note {n}"}, headers=owner.headers
        )
        assert response.status_code == 201
        clock.advance(ms=10)

    seen: list[str] = []
    cursor = None
    while True:
        query = {"limit": "2"} | ({"cursor": cursor} if cursor else {})
        page = await (
            await client.get(notes_url(space), query_string=query, headers=owner.headers)
        ).get_json()
        assert len(page["items"]) <= 2
        seen += [note["text"] for note in page["items"]]
        cursor = page.get("next_cursor")
        if not cursor:
            break
    assert seen == ["note 4", "note 3", "note 2", "note 1", "note 0"]


async def test_an_invalid_note_is_refused_and_nothing_is_stored(
    app, client, make_principal, make_space
):
    owner = await make_principal("human")
    space = await make_space(owner)
    for body in ({"text": ""}, {}, {"text": "x" * 2001}, {"text": "ok", "colour": "red"}):
        response = await client.post(notes_url(space), json=body, headers=owner.headers)
        assert response.status_code == 422, body
    assert await stored_notes(app) == []


async def test_a_retry_with_the_same_idempotency_key_adds_one_note(
    app, client, make_principal, make_space
):
    owner = await make_principal("human")
    space = await make_space(owner)
    headers = {**owner.headers, "Idempotency-Key": "note-once"}

    first = await client.post(notes_url(space), json={"text": "once"}, headers=headers)
    again = await client.post(notes_url(space), json={"text": "once"}, headers=headers)

    assert (first.status_code, again.status_code) == (201, 201)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert await again.get_json() == await first.get_json()
    assert len(await stored_notes(app)) == 1


# -- audit and events -----------------------------------------------------------


async def test_adding_a_note_is_audited(client, make_principal, make_space, audit_log):
    owner = await make_principal("human")
    space = await make_space(owner)

    created = await client.post(notes_url(space), json={"text": "hello"}, headers=owner.headers)
    note = await created.get_json()

    [event] = audit_log.events
    assert event.action == "notes.added"
    assert event.actor_id == owner.id
    assert event.space_id == space.id
    assert (event.target_type, event.target_id) == ("note", note["id"])
    assert dict(event.details) == {"length": 5}
    assert event.admin_override is False


async def test_a_system_admin_outside_the_space_is_audited_as_an_override(
    client, admin, make_principal, make_space, audit_log
):
    owner = await make_principal("human")
    space = await make_space(owner)

    created = await client.post(notes_url(space), json={"text": "hi"}, headers=admin.headers)

    assert created.status_code == 201
    [event] = audit_log.events
    assert (event.action, event.actor_id, event.admin_override) == ("notes.added", admin.id, True)


async def test_adding_a_note_publishes_an_event_on_the_space_stream(
    live_server, client, make_principal, make_space
):
    owner = await make_principal("human")
    space = await make_space(owner)
    async with (
        httpx.AsyncClient(base_url=live_server, timeout=10) as http,
        http.stream("GET", f"/v1/spaces/{space.id}/events", headers=owner.headers) as stream,
    ):
        assert stream.status_code == 200
        created = await client.post(notes_url(space), json={"text": "hi"}, headers=owner.headers)
        note = await created.get_json()
        event = await asyncio.wait_for(next_event(stream.aiter_lines()), 10)

    assert event["id"] == "1"
    assert event["event"] == "note.added"
    assert event["data"]["data"] == {"id": note["id"]}


async def next_event(lines) -> dict:
    """The next Server-Sent Event (``id``, ``event``, decoded ``data``); skips keep-alives."""
    event: dict = {}
    async for line in lines:
        if line == "" and "event" in event:
            return event
        if line and not line.startswith(":"):
            field, _, value = line.partition(": ")
            event[field] = json.loads(value) if field == "data" else value
    raise AssertionError("the stream ended")


# -- isolation ------------------------------------------------------------------


async def test_a_non_member_gets_404_and_changes_nothing(
    app, client, make_principal, make_space, audit_log
):
    owner, stranger = await make_principal("human"), await make_principal("agent")
    space = await make_space(owner)
    await client.post(notes_url(space), json={"text": "private"}, headers=owner.headers)
    audit_log.events.clear()

    for response in (
        await client.get(notes_url(space), headers=stranger.headers),
        await client.post(notes_url(space), json={"text": "intrusion"}, headers=stranger.headers),
    ):
        assert response.status_code == 404
        assert (await response.get_json())["type"] == NOT_FOUND

    # Exactly the answer for a space that does not exist.
    missing = await client.get("/v1/spaces/no-such-space/notes", headers=stranger.headers)
    assert missing.status_code == 404
    assert [n["text"] for n in await stored_notes(app)] == ["private"]
    assert audit_log.events == []


async def test_without_a_token_the_routes_answer_401(client, make_principal, make_space):
    owner = await make_principal("human")
    space = await make_space(owner)
    assert (await client.get(notes_url(space))).status_code == 401
    assert (await client.post(notes_url(space), json={"text": "x"})).status_code == 401


# -- the typed client -----------------------------------------------------------


async def test_the_typed_client_adds_and_lists_notes(live_server, make_principal, make_space):
    owner = await make_principal("human")
    space = await make_space(owner)

    def use_client() -> tuple[dict, list[dict]]:
        # A synchronous client: run it off the event loop that serves live_server.
        with Client(live_server, owner.token) as client:
            api = NotesClient(client)
            added = api.add_note(space.slug, "from the client")
            return added, list(api.notes(space.slug))

    added, listed = await asyncio.to_thread(use_client)
    assert added["text"] == "from the client"
    assert [note["id"] for note in listed] == [added["id"]]
