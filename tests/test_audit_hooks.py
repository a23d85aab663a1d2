"""The plugin hooks of the audit trail, routes and services, exercised by
plugins written in the test the way a third party would write them.

- ``buildmax_audit_record``: a probe plugin persists every event in a table
  of its own (made by its own ``buildmax_migrations``), inside the change's
  transaction, so the event is committed if and only if the change is.
- ``buildmax_audit_actions``: undeclared actions and detail keys are refused;
  a name declared twice stops the app from being built.
- ``buildmax_blueprints`` and ``buildmax_services``: a plugin's route is
  served and its service found; two providers of one service are refused.
"""

from __future__ import annotations

import gc
import json
import logging
import re
import warnings
from typing import Any, Protocol

import pytest
import sqlalchemy as sa
from buildmax_hookspecs import SYSTEM_ACTOR, AuditAction, BlobStore, Migration, hookimpl
from quart import Blueprint, Response

from buildmax.apidoc import api
from buildmax.app import create_app
from buildmax.audit import AuditError
from buildmax.bodies import json_response
from buildmax.config import Config
from buildmax.current import current_buildmax
from buildmax.migrations import create_tables
from buildmax.plugins import ESSENTIAL
from buildmax.principals import create_principal
from buildmax.services import ServiceConflict
from buildmax.spaces import create_space
from buildmax.tables import (
    Id,
    Millis,
    events,
    idempotency_receipts,
    principals,
    schema_migrations,
    space_members,
    spaces,
)
from buildmax.tokens import issue_token

# -- the audit probe ------------------------------------------------------------------

probe_metadata = sa.MetaData()
probe_events = sa.Table(
    "auditprobe_events",
    probe_metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("time", Millis, nullable=False),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("actor_id", sa.Text, nullable=True),
    sa.Column("space_id", sa.Text, nullable=True),
    sa.Column("target_id", sa.Text, nullable=True),
    sa.Column("request_id", sa.Text, nullable=True),
    sa.Column("details", sa.Text, nullable=False),
)


class ProbeFailure(Exception):
    """Raised by the probe on purpose."""


class AuditProbe:
    """An audit plugin that writes every event to its own table.

    ``fail_before`` names actions it refuses before writing; ``fail_after``
    names actions it writes and then refuses (so a row exists in the
    transaction when it rolls back).
    """

    def __init__(self) -> None:
        self.fail_before: set[str] = set()
        self.fail_after: set[str] = set()
        self.seen: list[str] = []

    @hookimpl
    def buildmax_migrations(self) -> list[Migration]:
        return [Migration("auditprobe", 1, "the probe's table", create_tables(probe_events))]

    @hookimpl
    def buildmax_audit_actions(self) -> list[AuditAction]:
        return [AuditAction("auditprobe.poked", "The probe was poked", frozenset({"count"}))]

    @hookimpl
    async def buildmax_audit_record(self, tx: Any, event: Any) -> None:
        self.seen.append(event.action)
        if event.action in self.fail_before:
            raise ProbeFailure(f"refusing {event.action}")
        await tx.execute(
            probe_events.insert().values(
                time=event.time,
                action=event.action,
                actor_id=event.actor_id,
                space_id=event.space_id,
                target_id=event.target_id,
                request_id=event.request_id,
                details=json.dumps(dict(event.details), sort_keys=True),
            )
        )
        if event.action in self.fail_after:
            raise ProbeFailure(f"wrote {event.action}, now failing")


@pytest.fixture
async def probe():
    return AuditProbe()


@pytest.fixture
async def probe_app(buildmax_settings, clock, probe):
    """A started app with the probe loaded (its migration applied at start-up)."""
    app = create_app(
        buildmax_settings, clock=clock, extra_plugins=[("auditprobe", probe)], auto_migrate=True
    )
    async with app.test_app():
        yield app


@pytest.fixture
async def probe_admin(probe_app):
    """(principal row, bearer headers) of a system admin of ``probe_app``."""
    async with probe_app.db.write() as tx:
        now = probe_app.clock.now_ms()
        row = await create_principal(tx, kind="human", name="admin", system_role="admin", now=now)
        issued = await issue_token(tx, principal_pk=row["id"], now=now, name="test")
    return row, {"Authorization": f"Bearer {issued.secret}"}


async def _rows(app, table, *where) -> list[dict[str, Any]]:
    query = sa.select(table)
    if where:
        query = query.where(*where)
    async with app.db.read() as conn:
        return [dict(r) for r in await conn.fetch_all(query)]


# == buildmax_audit_record =============================================================


async def test_buildmax_audit_record_persists_exactly_one_event_with_the_change(
    probe_app, probe_admin, probe
):
    admin, headers = probe_admin
    client = probe_app.test_client()
    made = await client.post("/v1/spaces", json={"slug": "probed"}, headers=headers)
    assert made.status_code == 201
    space = await made.get_json()

    # The plugin's own migration ran, recorded under its namespace.
    versions = await _rows(probe_app, schema_migrations, schema_migrations.c.plugin == "auditprobe")
    assert [r["version"] for r in versions] == [1]

    rows = await _rows(probe_app, probe_events)
    assert len(rows) == 1
    row = rows[0]
    assert (row["action"], row["actor_id"], row["space_id"], row["target_id"]) == (
        "space.created",
        admin["public_id"],
        space["id"],
        space["id"],
    )
    assert json.loads(row["details"]) == {
        "slug": "probed",
        "name": "probed",
        "owner_id": admin["public_id"],
    }
    assert row["request_id"] == made.headers["X-Request-Id"]
    assert row["time"] == probe_app.clock.now_ms()

    # A refused request (409 before anything is recorded) adds no row.
    duplicate = await client.post("/v1/spaces", json={"slug": "probed"}, headers=headers)
    assert duplicate.status_code == 409
    assert len(await _rows(probe_app, probe_events)) == 1
    assert probe.seen == ["space.created"]


async def test_buildmax_audit_record_raising_rolls_the_whole_change_back(
    probe_app, probe_admin, probe, caplog
):
    _admin, headers = probe_admin
    client = probe_app.test_client()
    probe.fail_before.add("space.created")
    with caplog.at_level(logging.ERROR, logger="buildmax"):
        failed = await client.post(
            "/v1/spaces", json={"slug": "doomed"}, headers={**headers, "Idempotency-Key": "k1"}
        )
    assert failed.status_code == 500
    assert failed.content_type == "application/problem+json"
    assert (await failed.get_json())["type"] == "urn:buildmax:problem:internal-error"
    assert "ProbeFailure" in caplog.text
    assert probe.seen == ["space.created"]  # the hook ran, inside the transaction

    # Nothing of the change survived: no space, no owner row, no receipt, no event.
    assert await _rows(probe_app, spaces) == []
    assert await _rows(probe_app, space_members) == []
    assert await _rows(probe_app, idempotency_receipts) == []
    assert await _rows(probe_app, probe_events) == []

    # Nothing was left half-done: the same slug (and key) works once the hook allows it.
    probe.fail_before.clear()
    retried = await client.post(
        "/v1/spaces", json={"slug": "doomed"}, headers={**headers, "Idempotency-Key": "k1"}
    )
    assert retried.status_code == 201
    assert "Idempotent-Replayed" not in retried.headers
    assert [r["action"] for r in await _rows(probe_app, probe_events)] == ["space.created"]


async def test_buildmax_audit_record_a_row_written_before_the_failure_is_rolled_back(
    probe_app, probe_admin, probe
):
    """The probe writes its row and then raises: the row goes with the change."""
    _admin, headers = probe_admin
    client = probe_app.test_client()
    probe.fail_after.add("principal.created")
    failed = await client.post(
        "/v1/principals", json={"kind": "agent", "name": "ghost"}, headers=headers
    )
    assert failed.status_code == 500
    assert await _rows(probe_app, principals, principals.c.name == "ghost") == []
    assert await _rows(probe_app, probe_events) == []
    assert probe.seen == ["principal.created"]


async def test_buildmax_audit_record_a_rolled_back_member_change_publishes_no_event(
    probe_app, probe_admin, probe
):
    admin, headers = probe_admin
    client = probe_app.test_client()
    async with probe_app.db.write() as tx:
        now = probe_app.clock.now_ms()
        space = await create_space(
            tx, slug="team", name="team", owner_pk=admin["id"], created_by=admin["id"], now=now
        )
        agent = await create_principal(tx, kind="agent", name="worker", now=now)
    probe.fail_after.add("space.member.added")
    failed = await client.put(
        f"/v1/spaces/{space['public_id']}/members/{agent['public_id']}",
        json={"role": "member"},
        headers=headers,
    )
    assert failed.status_code == 500
    members = await _rows(probe_app, space_members, space_members.c.space_id == space["id"])
    assert [(m["principal_id"], m["role"]) for m in members] == [(admin["id"], "owner")]
    assert await _rows(probe_app, events, events.c.space_id == space["id"]) == []
    stored = await _rows(probe_app, spaces, spaces.c.id == space["id"])
    assert stored[0]["event_seq"] == 0
    assert await _rows(probe_app, probe_events) == []


async def test_buildmax_audit_record_a_failing_plugin_leaves_no_unawaited_coroutine(
    probe_app, probe
):
    class Refuser:
        @hookimpl
        async def buildmax_audit_record(self, tx, event):
            raise ProbeFailure("refused")

    # Registered last, so called (and awaited) before the probe.
    probe_app.plugins.pm.register(Refuser(), name="refuser")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with pytest.raises(ProbeFailure):
                async with probe_app.db.write() as tx:
                    await probe_app.audit.record(
                        tx, SYSTEM_ACTOR, "auditprobe.poked", details={"count": 1}
                    )
            gc.collect()
    finally:
        probe_app.plugins.pm.unregister(name="refuser")
    never_awaited = [w for w in caught if "never awaited" in str(w.message)]
    assert never_awaited == []


# == buildmax_audit_actions ==============================================================


async def test_buildmax_audit_actions_an_undeclared_action_is_refused_and_rolls_back(
    probe_app, probe_admin, probe
):
    admin, _headers = probe_admin
    with pytest.raises(AuditError, match=re.escape("'auditprobe.undeclared' was never declared")):
        async with probe_app.db.write() as tx:
            await create_space(
                tx,
                slug="half-done",
                name="x",
                owner_pk=admin["id"],
                created_by=admin["id"],
                now=probe_app.clock.now_ms(),
            )
            await probe_app.audit.record(tx, SYSTEM_ACTOR, "auditprobe.undeclared")
    assert await _rows(probe_app, spaces, spaces.c.slug == "half-done") == []
    assert probe.seen == []  # refused before any plugin saw it
    assert await _rows(probe_app, probe_events) == []


async def test_buildmax_audit_actions_an_undeclared_detail_key_is_refused(probe_app, probe):
    declared = probe_app.audit.actions["auditprobe.poked"]
    assert declared.detail_keys == frozenset({"count"})
    with pytest.raises(AuditError, match=r"does not declare \['token'\]"):
        async with probe_app.db.write() as tx:
            await probe_app.audit.record(
                tx, SYSTEM_ACTOR, "auditprobe.poked", details={"count": 1, "token": "bmx_x"}
            )
    assert probe.seen == []
    assert await _rows(probe_app, probe_events) == []

    # The declared keys go through, and reach the plugin.
    async with probe_app.db.write() as tx:
        event = await probe_app.audit.record(
            tx, SYSTEM_ACTOR, "auditprobe.poked", details={"count": 2}
        )
    assert dict(event.details) == {"count": 2}
    assert event.actor_kind == "system" and event.actor_id is None
    rows = await _rows(probe_app, probe_events)
    assert [(r["action"], json.loads(r["details"])) for r in rows] == [
        ("auditprobe.poked", {"count": 2})
    ]


def _duplicate_declarer(name: str) -> Any:
    class Declarer:
        @hookimpl
        def buildmax_audit_actions(self):
            return [AuditAction(name, "declared by a plugin", frozenset())]

    return Declarer()


@pytest.mark.engine_independent
def test_buildmax_audit_actions_redeclaring_a_kernel_action_fails_app_creation(tmp_path):
    settings = Config(data_dir=str(tmp_path), load_plugins="")
    with pytest.raises(AuditError, match=re.escape("'space.created' is declared twice")):
        create_app(settings, extra_plugins=[("copycat", _duplicate_declarer("space.created"))])


@pytest.mark.engine_independent
def test_buildmax_audit_actions_two_plugins_declaring_one_action_fail_app_creation(tmp_path):
    settings = Config(data_dir=str(tmp_path), load_plugins="")
    with pytest.raises(AuditError, match=re.escape("'notes.added' is declared twice")):
        create_app(
            settings,
            extra_plugins=[
                ("notes-a", _duplicate_declarer("notes.added")),
                ("notes-b", _duplicate_declarer("notes.added")),
            ],
        )


class _Targets:
    def __init__(self, mapping: dict[str, str]) -> None:
        self.mapping = mapping

    @hookimpl
    def buildmax_audit_targets(self) -> dict[str, str]:
        return self.mapping


@pytest.mark.engine_independent
def test_buildmax_audit_targets_link_an_event_target_to_where_it_is_read(tmp_path):
    settings = Config(data_dir=str(tmp_path), load_plugins="")
    app = create_app(
        settings, extra_plugins=[("notes", _Targets({"note": "/v1/spaces/{space}/notes/{id}"}))]
    )
    assert app.audit.link("note", "nt_1", "sp_1") == "/v1/spaces/sp_1/notes/nt_1"
    # The kernel's own targets; a space-relative target without a space, or
    # a type nobody claimed, stays unlinked.
    assert app.audit.link("principal", "pr_1", None) == "/v1/principals/pr_1"
    assert app.audit.link("note", "nt_1", None) is None
    assert app.audit.link("comet", "c_1", "sp_1") is None


@pytest.mark.engine_independent
def test_buildmax_audit_targets_a_type_claimed_twice_fails_app_creation(tmp_path):
    settings = Config(data_dir=str(tmp_path), load_plugins="")
    with pytest.raises(AuditError, match=re.escape("'space' is claimed twice")):
        create_app(settings, extra_plugins=[("copycat", _Targets({"space": "/x/{id}"}))])


async def test_buildmax_audit_actions_a_target_of_another_type_is_refused(probe_app, probe):
    with pytest.raises(AuditError, match="names 'space' targets, not 'task'"):
        async with probe_app.db.write() as tx:
            await probe_app.audit.record(
                tx, SYSTEM_ACTOR, "space.updated", target_type="task", target_id="tk_1"
            )
    assert probe.seen == []


async def test_buildmax_audit_actions_details_must_be_plain_json(probe_app, probe):
    with pytest.raises(AuditError, match="not plain JSON"):
        async with probe_app.db.write() as tx:
            await probe_app.audit.record(
                tx, SYSTEM_ACTOR, "auditprobe.poked", details={"count": object()}
            )
    assert probe.seen == []


# == buildmax_blueprints and buildmax_services ========================================


class Tally(Protocol):
    """A service contract defined by the test."""

    def bump(self) -> int:
        """Add one; the new total."""


class CountingTally:
    def __init__(self) -> None:
        self.total = 0

    def bump(self) -> int:
        self.total += 1
        return self.total


class TallyPlugin:
    """Serves ``GET /v1/tallyprobe``, which uses the ``Tally`` service it provides."""

    def __init__(self) -> None:
        self.tally = CountingTally()
        self.built_for: list[Any] = []
        blueprint = Blueprint("tallyprobe", __name__)

        @blueprint.get("/v1/tallyprobe")
        @api("Tally probe: bump the tally", auth=False)
        async def bump() -> Response:
            total = current_buildmax().services.get(Tally).bump()
            return json_response({"total": total})

        self.blueprint = blueprint

    @hookimpl
    def buildmax_blueprints(self, app):
        self.built_for.append(("blueprints", app))
        return [self.blueprint]

    @hookimpl
    def buildmax_services(self, app):
        self.built_for.append(("services", app))
        return {Tally: self.tally}


async def test_buildmax_blueprints_and_buildmax_services_serve_a_plugin_route(buildmax_settings):
    plugin = TallyPlugin()
    app = create_app(buildmax_settings, extra_plugins=[("tallies", plugin)], auto_migrate=True)
    # Both hooks were called once, with the app being built.
    assert sorted(kind for kind, _ in plugin.built_for) == ["blueprints", "services"]
    assert all(built is app for _, built in plugin.built_for)
    assert app.services.get(Tally) is plugin.tally
    assert app.services.provider(Tally) == "tallies"
    async with app.test_app():
        client = app.test_client()
        first = await client.get("/v1/tallyprobe")
        second = await client.get("/v1/tallyprobe")
        assert [await first.get_json(), await second.get_json()] == [{"total": 1}, {"total": 2}]
        document = await (await client.get("/v1/openapi.json")).get_json()
    assert document["paths"]["/v1/tallyprobe"]["get"]["summary"] == "Tally probe: bump the tally"
    assert plugin.tally.total == 2


@pytest.mark.engine_independent
def test_buildmax_services_two_providers_of_one_service_fail_app_creation(tmp_path):
    settings = Config(data_dir=str(tmp_path), load_plugins="")
    with pytest.raises(ServiceConflict) as caught:
        create_app(settings, extra_plugins=[("tally-a", TallyPlugin()), ("tally-b", TallyPlugin())])
    message = str(caught.value)
    assert "'tally-a'" in message and "'tally-b'" in message
    assert "Tally" in message


@pytest.mark.engine_independent
def test_buildmax_services_cannot_replace_the_blob_store(tmp_path):
    """The BlobStore comes only through buildmax_blob_stores."""

    class Sneaky:
        @hookimpl
        def buildmax_services(self, app):
            return {BlobStore: object()}

    settings = Config(data_dir=str(tmp_path), load_plugins="")
    with pytest.raises(ServiceConflict) as caught:
        create_app(settings, extra_plugins=[("sneaky", Sneaky())])
    assert f"'{ESSENTIAL}'" in str(caught.value) and "'sneaky'" in str(caught.value)
