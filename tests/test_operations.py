"""What operators watch: /metrics, diagnostics, the attention lists, the
disk reserve in the facts, trusted proxies and the request log."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families
from werkzeug.datastructures import Headers

from buildmax.app import create_app
from buildmax.backups.runs import finish_run, start_run
from buildmax.logs import JsonFormatter
from buildmax.spaces import put_member
from buildmax.tables import sign_in_failures
from buildmax.testing import call

HOUR_MS = 3_600_000


async def _metrics_token(client: Any, who: Any) -> str:
    body = await call(
        client, "POST", "/v1/tokens", who, json={"name": "scraper", "scope": "metrics"}, expect=201
    )
    return str(body["token"])


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    wanted = tuple(sorted(labels.items()))
    return samples[(name, wanted)]


@pytest.fixture
async def queue(app, client, make_principal, make_space):
    """A space with a project, its owner, a member agent and a viewer."""
    owner = await make_principal("human", system_role="admin", name="owner")
    agent = await make_principal("agent", name="agent-1")
    viewer = await make_principal("human", name="viewer-1")
    space = await make_space(owner, slug="ops")
    async with app.db.write() as tx:
        now = app.clock.now_ms()
        await put_member(tx, space.pk, agent.pk, "member", now)
        await put_member(tx, space.pk, viewer.pk, "viewer", now)
    await call(client, "POST", "/v1/spaces/ops/projects", owner, json={"name": "main"}, expect=201)
    return owner, agent, viewer, space


async def _claim_cycle(client: Any, owner: Any, agent: Any, title: str) -> dict[str, Any]:
    task = await call(
        client,
        "POST",
        "/v1/spaces/ops/tasks",
        owner,
        json={"project": "main", "title": title},
        expect=201,
    )
    claim = await call(
        client, "POST", "/v1/spaces/ops/claims", agent, json={"lease_seconds": 60}, expect=201
    )
    await call(
        client,
        "POST",
        f"/v1/spaces/ops/attempts/{claim['attempt']['id']}/renew",
        agent,
        json={"lease_seconds": 60, "generation": claim["attempt"]["generation"]},
        expect=200,
    )
    return {"task": task, "claim": claim}


async def test_a_scrape_after_a_claim_cycle_shows_requests_leases_and_the_queue(
    app, client, queue, caplog
):
    caplog.set_level(logging.DEBUG)
    owner, agent, _, _ = queue
    cycle = await _claim_cycle(client, owner, agent, "Refactor the secret parser")
    await call(
        client,
        "POST",
        "/v1/spaces/ops/tasks",
        owner,
        json={"project": "main", "title": "waiting"},
        expect=201,
    )
    await call(client, "GET", "/v1/principals/me", "bmx_not-a-real-token-at-all", expect=401)
    # A space's route reads the token and the space in one statement: counted the same.
    await call(client, "GET", "/v1/spaces/ops", "bmx_not-a-real-token-at-all", expect=401)
    token = await _metrics_token(client, owner)

    response = await client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200
    assert response.content_type.startswith("text/plain; version=0.0.4")
    text = (await response.get_data()).decode()
    samples = _samples(text)

    claim_route = "/v1/spaces/<space>/claims"
    assert (
        _value(
            samples,
            "buildmax_http_requests_total",
            method="POST",
            route=claim_route,
            status_class="2xx",
        )
        == 1
    )
    assert (
        _value(
            samples,
            "buildmax_http_request_duration_seconds_count",
            method="POST",
            route=claim_route,
        )
        == 1
    )
    assert _value(samples, "buildmax_authentication_failures_total", kind="token") == 2
    assert _value(samples, "buildmax_leases", state="active") == 1
    assert _value(samples, "buildmax_ready_tasks", space="ops") == 1
    assert _value(samples, "buildmax_claims_total") == 1
    assert _value(samples, "buildmax_db_write_seconds_count", engine=app.db.dialect) > 0
    assert _value(samples, "buildmax_disk_reserve_bytes") == app.settings.min_free_bytes
    assert _value(samples, "buildmax_disk_free_bytes", volume="data") > 0
    assert _value(samples, "buildmax_plugin_load_errors") == 0
    assert _value(samples, "buildmax_event_stream_subscribers") == 0

    # No label holds a concrete id, a title or a secret: every value is a
    # route template, a space slug or one of the fixed sets.
    templates = {rule.rule for rule in app.url_map.iter_rules()}
    fixed = {
        "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "other",
        "1xx", "2xx", "3xx", "4xx", "5xx", "(unmatched)", "(other)",
        "sqlite", "postgresql", "token", "sign_in", "data", "database", "blobs",
        "active", "lapsed",
    }  # fmt: skip
    slugs = {"ops"}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for name, value in sample.labels.items():
                if name == "le":  # a histogram bucket's bound
                    continue
                assert value in templates | fixed | slugs, (sample.name, name, value)
    for concrete in (cycle["task"]["id"], cycle["claim"]["attempt"]["id"], agent.id):
        assert concrete not in text
    assert "Refactor the secret parser" not in text and token not in text
    # Nor does any line the server logged, at any level, hold the task's text.
    assert "Refactor the secret parser" not in caplog.text
    assert caplog.text.count("buildmax.requests") >= 6


async def test_the_scrape_is_refused_without_the_metrics_scope(app, client, queue, make_principal):
    owner, agent, _, _ = queue
    assert (await client.get("/metrics")).status_code == 401
    # An admin's ordinary token, an agent's token: 403.
    await call(client, "GET", "/metrics", owner, expect=403, problem="forbidden")
    await call(client, "GET", "/metrics", agent, expect=403, problem="forbidden")
    # A metrics token reads /metrics and nothing else.
    token = await _metrics_token(client, owner)
    await call(client, "GET", "/v1/principals/me", token, expect=403, problem="token-scope-refused")
    # Only system admins and operators get one.
    await call(
        client,
        "POST",
        "/v1/tokens",
        agent,
        json={"scope": "metrics"},
        expect=403,
        problem="forbidden",
    )
    # It stops working when its principal loses the role.
    async with app.db.write() as tx:
        await tx.execute(
            sa.text("UPDATE principals SET system_role = NULL WHERE id = :pk"), {"pk": owner.pk}
        )
    await call(client, "GET", "/metrics", token, expect=403, problem="forbidden")


async def test_metrics_off_serves_no_metrics(buildmax_settings, clock, make_principal):
    app = create_app(buildmax_settings.replace(metrics=False), clock=clock, auto_migrate=True)
    async with app.test_app():
        client = app.test_client()
        async with app.db.write() as tx:
            from buildmax.principals import create_principal

            await create_principal(
                tx, kind="human", name="root", system_role="admin", now=clock.now_ms()
            )
        assert (await client.get("/livez")).status_code == 200
        assert app.metrics.requests.collect()[0].samples == []


async def test_status_lists_a_lapsed_lease_a_pending_decision_and_a_stale_backup(
    app, client, clock, queue
):
    owner, agent, viewer, _ = queue
    cycle = await _claim_cycle(client, owner, agent, "first")
    second = await call(
        client,
        "POST",
        "/v1/spaces/ops/tasks",
        owner,
        json={"project": "main", "title": "second"},
        expect=201,
    )
    decision = await call(
        client,
        "POST",
        f"/v1/spaces/ops/tasks/{second['id']}/decisions",
        agent,
        json={"question": "Which database?", "options": ["sqlite", "postgresql"]},
        expect=201,
    )
    run = await start_run(app, "/backups/b1")
    await finish_run(app, run, ok=True, manifest_sha256="0" * 64, size=1)
    clock.advance(ms=app.settings.backup_stale_seconds * 1000 + HOUR_MS)

    body = await call(client, "GET", "/v1/diagnostics", owner, expect=200)
    kinds = {item["kind"]: item for item in body["attention"]}
    assert kinds["lease.lapsed"]["target"] == {
        "type": "attempt",
        "id": cycle["claim"]["attempt"]["id"],
    }
    assert kinds["lease.lapsed"]["space"] == "ops"
    assert kinds["decision.pending"]["target"]["id"] == decision["id"]
    assert kinds["backup.stale"]["space"] is None
    assert "Which database?" not in json.dumps(body)

    # Only system admins and operators read the whole server's diagnostics.
    await call(client, "GET", "/v1/diagnostics", agent, expect=403)

    # Each space's list: a viewer sees less than an admin, never the
    # server-wide items.
    as_viewer = await call(client, "GET", "/v1/spaces/ops/attention", viewer, expect=200)
    as_member = await call(client, "GET", "/v1/spaces/ops/attention", agent, expect=200)
    as_admin = await call(client, "GET", "/v1/spaces/ops/attention", owner, expect=200)
    viewer_kinds = [item["kind"] for item in as_viewer["items"]]
    member_kinds = [item["kind"] for item in as_member["items"]]
    admin_kinds = [item["kind"] for item in as_admin["items"]]
    assert "lease.lapsed" not in viewer_kinds and "lease.lapsed" in member_kinds
    assert len(viewer_kinds) < len(admin_kinds)
    assert set(viewer_kinds) <= set(member_kinds) <= set(admin_kinds)
    assert all(item["space"] == "ops" for item in as_admin["items"])


async def test_the_facts_show_the_disk_under_its_reserve(app, client, admin):
    app.disk.free_space = lambda path: 1000
    body = await call(client, "GET", "/v1/diagnostics", admin, expect=200)
    critical = [item for item in body["attention"] if item["kind"] == "disk.reserve"]
    assert critical and critical[0]["severity"] == "critical"
    assert body["attention"][0]["kind"] == "disk.reserve"  # critical first
    free = [f for f in body["facts"] if f["name"] == "buildmax_disk_free_bytes"]
    assert free and all(f["value"] == 1000 for f in free)
    assert free[0]["help"] == "Free bytes where the server writes"  # as /metrics says


async def _fail_sign_in(client: Any, name: str, headers: Any) -> int:
    response = await client.post(
        "/v1/sessions",
        json={"name": name, "password": "wrong password here"},
        headers=headers,
        scope_base={"client": ("127.0.0.1", 50000)},
    )
    return int(response.status_code)


@pytest.mark.parametrize(
    ("proxies", "trusted"),
    [("127.0.0.0/8, 10.0.0.0/8", True), ("", False), ("10.0.0.0/8, ::1", False)],
)
async def test_a_trusted_proxy_names_the_client_and_anyone_else_is_ignored(
    buildmax_settings, clock, proxies, trusted
):
    """Behind a trusted proxy the sign-in limit counts each client's
    address, so one client's failures lock out that client only; a sender
    that is not a trusted proxy cannot choose its address with a header."""
    settings = buildmax_settings.replace(
        sign_in_max_failures_per_address=3,
        sign_in_max_failures_per_name=100,
        trusted_proxies=proxies,
    )
    app = create_app(settings, clock=clock, auto_migrate=True)
    async with app.test_app():
        client = app.test_client()  # its requests come from 127.0.0.1
        attacker = {"X-Forwarded-For": "198.51.100.7"}
        for _ in range(3):
            assert await _fail_sign_in(client, "someone", attacker) == 401
        other = {"X-Forwarded-For": "203.0.113.9, 10.1.2.3"}
        async with app.db.read() as conn:
            addresses = {r["address"] for r in await conn.fetch_all(sa.select(sign_in_failures))}
        if trusted:
            # Only the attacker is limited; the client behind two proxies is not.
            assert addresses == {"198.51.100.7"}
            assert await _fail_sign_in(client, "someone", attacker) == 429
            assert await _fail_sign_in(client, "someone", other) == 401
            # A spoofed left-most entry changes nothing: the walk starts on the right.
            spoof = {"X-Forwarded-For": "203.0.113.9, 198.51.100.7"}
            assert await _fail_sign_in(client, "someone", spoof) == 429
            # A client's own Forwarded header, passed through by the proxy, is
            # never believed; nor is a line of X-Forwarded-For of its own
            # when the proxy adds another line instead of appending.
            forged = {"X-Forwarded-For": "198.51.100.7", "Forwarded": "for=203.0.113.50"}
            assert await _fail_sign_in(client, "someone", forged) == 429
            lines = Headers(
                [("X-Forwarded-For", "203.0.113.77"), ("X-Forwarded-For", "198.51.100.7")]
            )
            assert await _fail_sign_in(client, "someone", lines) == 429
        else:
            # The header is ignored: every request is the test client's own.
            assert addresses == {"127.0.0.1"}
            assert await _fail_sign_in(client, "someone", other) == 429


async def test_each_request_is_logged_once_with_its_route_template(
    app, client, admin, make_space, caplog
):
    space = await make_space(admin, slug="logged")
    caplog.set_level(logging.INFO, logger="buildmax.requests")
    response = await client.get(
        f"/v1/spaces/{space.id}",
        headers={"Authorization": f"Bearer {admin.token}", "X-Request-Id": "rq-test-1"},
    )
    assert response.status_code == 200
    lines = [r for r in caplog.records if r.name == "buildmax.requests"]
    assert len(lines) == 1
    record = lines[0]
    fields = record.fields  # type: ignore[attr-defined]
    assert fields["request_id"] == "rq-test-1"
    assert fields["route"] == "/v1/spaces/<space>"
    assert fields["status"] == 200
    assert fields["duration_ms"] >= 0
    message = record.getMessage()
    assert space.id not in message and admin.token not in message
    entry = json.loads(JsonFormatter().format(record))
    assert entry["route"] == "/v1/spaces/<space>" and entry["request_id"] == "rq-test-1"
    assert entry["level"] == "info" and entry["logger"] == "buildmax.requests"


async def test_buildmax_status_prints_the_attention_list(app, client, clock, queue, tmp_path):
    """``buildmax status`` shows a lapsed lease, a pending decision and a
    stale backup; ``--space`` shows a viewer less than a member."""
    import asyncio

    from click.testing import CliRunner

    from buildmax.cli import _register_commands, cli
    from buildmax.testing import serving

    owner, agent, viewer, _ = queue
    await _claim_cycle(client, owner, agent, "first")
    second = await call(
        client,
        "POST",
        "/v1/spaces/ops/tasks",
        owner,
        json={"project": "main", "title": "second"},
        expect=201,
    )
    await call(
        client,
        "POST",
        f"/v1/spaces/ops/tasks/{second['id']}/decisions",
        agent,
        json={"question": "Which one?", "options": ["a", "b"]},
        expect=201,
    )
    run = await start_run(app, "/backups/b1")
    await finish_run(app, run, ok=True, manifest_sha256="0" * 64, size=1)
    clock.advance(ms=app.settings.backup_stale_seconds * 1000 + HOUR_MS)
    _register_commands()
    env = {"XDG_CONFIG_HOME": str(tmp_path), "BUILDMAX_URL": "", "BUILDMAX_TOKEN": ""}

    async with serving(app) as url:

        def status(who: Any, *args: str) -> Any:
            return CliRunner().invoke(
                cli, ["status", "--url", url, "--token", who.token, *args], env=env
            )

        whole = await asyncio.to_thread(status, owner)
        as_viewer = await asyncio.to_thread(status, viewer, "--space", "ops")
        as_member = await asyncio.to_thread(status, agent, "--space", "ops")
        refused = await asyncio.to_thread(status, agent)
    assert whole.exit_code == 0, whole.output
    for kind in ("lease.lapsed", "decision.pending", "backup.stale"):
        assert kind in whole.output
    assert "disk_free_bytes" in whole.output
    assert "lease.lapsed" in as_member.output and "lease.lapsed" not in as_viewer.output
    assert refused.exit_code == 1 and "error:" in refused.output


@pytest.mark.engine_independent
@pytest.mark.parametrize(
    ("peer", "xff", "expected"),
    [
        ("10.0.0.2", ["198.51.100.7"], "198.51.100.7"),
        ("10.0.0.2", ["198.51.100.7, 10.0.0.9"], "198.51.100.7"),
        # Lines of the header are one chain, the last line the newest.
        ("10.0.0.2", ["203.0.113.77", "198.51.100.7"], "198.51.100.7"),
        # Every hop trusted: the left-most is the client as far as we know.
        ("10.0.0.2", ["10.0.0.8, 10.0.0.9"], "10.0.0.8"),
        # Garbage ends the walk at the last trusted hop.
        ("10.0.0.2", ["evil, 10.0.0.9"], "10.0.0.9"),
        ("10.0.0.2", ["[2001:db8::1]:4711"], "2001:db8::1"),
        ("10.0.0.2", ["198.51.100.7:8080"], "198.51.100.7"),
        # Not from a trusted proxy: the header is ignored.
        ("192.0.2.1", ["198.51.100.7"], "192.0.2.1"),
        (None, ["198.51.100.7"], "unknown"),
    ],
)
def test_the_client_address_walks_the_chain_from_the_right(peer, xff, expected):
    from buildmax.addresses import client_address, parse_networks

    trusted = parse_networks("10.0.0.0/8")
    assert client_address(peer, xff, trusted) == expected


@pytest.mark.engine_independent
@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("trusted_proxies", "10.0.0.0/8, proxy.local", "'proxy.local' is not an IP address"),
        ("log_format", "xml", "log_format must be text or json"),
        ("min_free_bytes", "-1", "min_free_bytes must be at least 0"),
        ("backup_stale_seconds", "5", "backup_stale_seconds must be at least 60"),
    ],
)
def test_bad_operations_settings_are_refused_by_name(setting, value, message):
    from buildmax.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=message):
        load_config(environ={f"BUILDMAX_{setting.upper()}": value})


class _FailingStore:
    """A plugin with one route whose blob store does not answer."""

    from buildmax_hookspecs import hookimpl

    @hookimpl
    def buildmax_blueprints(self, app: Any) -> list[Any]:
        from buildmax_hookspecs import BlobStoreUnavailable
        from quart import Blueprint

        blueprint = Blueprint("failing_store", __name__)

        @blueprint.get("/test/blob")
        async def blob() -> Any:
            raise BlobStoreUnavailable("the bucket stopped answering")

        return [blueprint]


async def test_a_failing_blob_store_is_counted_and_listed(buildmax_settings, clock):
    app = create_app(
        buildmax_settings,
        clock=clock,
        auto_migrate=True,
        extra_plugins=[("failing", _FailingStore())],
    )
    async with app.test_app():
        client = app.test_client()
        from buildmax.principals import create_principal
        from buildmax.tokens import issue_token

        async with app.db.write() as tx:
            row = await create_principal(
                tx, kind="human", name="root", system_role="admin", now=clock.now_ms()
            )
            issued = await issue_token(tx, principal_pk=row["id"], now=clock.now_ms(), name="t")
        response = await client.get("/test/blob")
        assert response.status_code == 503
        assert (await response.get_json())["type"].endswith("blob-store-unavailable")
        body = await call(client, "GET", "/v1/diagnostics", issued.secret, expect=200)
        assert [i["kind"] for i in body["attention"]].count("blob_store.errors") == 1
        assert app.metrics.blob_store_errors._value.get() == 1
        clock.advance(seconds=16 * 60)
        body = await call(client, "GET", "/v1/diagnostics", issued.secret, expect=200)
        assert "blob_store.errors" not in [i["kind"] for i in body["attention"]]
