"""HTTP conventions of the kernel: request ids, readiness, the API description,
scoped tokens a plugin issues, housekeeping."""

from __future__ import annotations

import logging

import pytest
import sqlalchemy as sa
from buildmax_hookspecs import hookimpl
from click.testing import CliRunner
from quart import Blueprint, Response

from buildmax import tokens as token_store
from buildmax.apidoc import api
from buildmax.app import create_app
from buildmax.current import current_buildmax
from buildmax.problems import (
    BlobStoreDown,
    Problem,
    ServiceUnavailable,
    TooManyRequests,
    problem_for_status,
)
from buildmax.tables import idempotency_receipts, schema_migrations, sign_in_failures


async def test_a_request_id_is_echoed_or_minted(client):
    given = await client.get("/livez", headers={"X-Request-Id": "trace-42"})
    assert given.headers["X-Request-Id"] == "trace-42"
    minted = await client.get("/livez", headers={"X-Request-Id": "bad id with spaces"})
    assert minted.headers["X-Request-Id"].startswith("rq_")
    problem = await (await client.get("/nowhere", headers={"X-Request-Id": "t-1"})).get_json()
    assert problem["request_id"] == "t-1"


async def test_readiness_fails_when_a_loaded_plugins_migrations_are_not_current(app, client):
    assert (await client.get("/readyz")).status_code == 200
    async with app.db.write() as tx:
        await tx.execute(
            sa.delete(schema_migrations).where(schema_migrations.c.plugin == "testplugin")
        )
    response = await client.get("/readyz")
    assert response.status_code == 503
    assert "testplugin" in (await response.get_json())["detail"]
    # An operator must migrate: the probe is told to come back in a while.
    assert response.headers["Retry-After"] == "30"


def _problem_classes(cls: type[Problem]) -> list[type[Problem]]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_problem_classes(sub)]
    return found


@pytest.mark.engine_independent
def test_every_429_and_503_says_when_to_retry(app):
    """Every problem class answering 429 or 503 (the kernel's and the loaded
    plugins') cannot be raised without ``Retry-After``, and the framework's
    own 429 and 503 get one too. Catches a "retry later" answer that leaves
    the client guessing (the sign-in 429 had none)."""
    retry_later = [c for c in _problem_classes(Problem) if c.status in (429, 503)]
    assert {TooManyRequests, ServiceUnavailable, BlobStoreDown} <= set(retry_later)
    for cls in retry_later:
        with pytest.raises(TypeError):
            cls("no retry_after given")
        assert cls("later", retry_after=12).headers["Retry-After"] == "12", cls
    for status in (429, 503):
        assert int(problem_for_status(status).headers["Retry-After"]) >= 1


async def test_every_v1_route_is_in_the_openapi_document_with_a_summary(app, client):
    document = await (await client.get("/v1/openapi.json")).get_json()
    assert document["openapi"].startswith("3.")
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith("/v1/"):
            continue
        path = rule.rule.replace("<", "{").replace(">", "}")
        for method in rule.methods - {"HEAD", "OPTIONS"}:
            operation = document["paths"][path][method.lower()]
            assert operation["summary"], (method, path)
            assert "default" in operation["responses"]
    tokens_post = document["paths"]["/v1/tokens"]["post"]
    assert any(p["name"] == "Idempotency-Key" for p in tokens_post["parameters"])
    assert "TokenCreate" in document["components"]["schemas"]
    page = await client.get("/docs")
    assert "/v1/spaces/{space}/members" in (await page.get_data(as_text=True))


async def test_a_plugin_can_shorten_and_end_the_tokens_of_a_scope(
    app, client, clock, make_principal
):
    agent = await make_principal("agent")
    now = clock.now_ms()
    async with app.db.write() as tx:
        first = await token_store.issue_token(
            tx,
            principal_pk=agent.pk,
            now=now,
            scope_type="testscope",
            scope_id="run-1",
            expires_at=now + 3_600_000,
        )
        second = await token_store.issue_token(
            tx, principal_pk=agent.pk, now=now, scope_type="testscope", scope_id="run-1"
        )
        other = await token_store.issue_token(
            tx, principal_pk=agent.pk, now=now, scope_type="testscope", scope_id="run-2"
        )

    def headers(token):
        return {"Authorization": f"Bearer {token.secret}"}

    async with app.db.write() as tx:
        assert (
            await token_store.shorten_scope(tx, "testscope", "run-1", expires_at=now + 60_000) == 2
        )
        # Never lengthens: a later expiry changes nothing.
        assert (
            await token_store.shorten_scope(tx, "testscope", "run-1", expires_at=now + 7_200_000)
            == 0
        )
    clock.advance(seconds=61)
    for token in (first, second):
        assert (
            await client.get("/v1/testplugin/scoped", headers=headers(token))
        ).status_code == 401
    assert (await client.get("/v1/testplugin/scoped", headers=headers(other))).status_code == 200
    async with app.db.write() as tx:
        assert await token_store.end_scope(tx, "testscope", "run-2", now=clock.now_ms()) == 1
    assert (await client.get("/v1/testplugin/scoped", headers=headers(other))).status_code == 401


async def test_the_sweep_deletes_only_expired_receipts(app, client, clock, admin):
    from buildmax.essentials import sweep

    headers = {**admin.headers, "Idempotency-Key": "old"}
    await client.post("/v1/spaces", json={"slug": "old-one"}, headers=headers)
    clock.advance(seconds=app.settings.idempotency_ttl_seconds + 1)
    headers = {**admin.headers, "Idempotency-Key": "new"}
    await client.post("/v1/spaces", json={"slug": "new-one"}, headers=headers)
    await sweep(app)
    async with app.db.read() as conn:
        keys = [r["key"] for r in await conn.fetch_all(sa.select(idempotency_receipts.c.key))]
    assert keys == ["new"]


def test_admin_bootstrap_prints_a_token_once_and_refuses_a_second_admin(
    tmp_path, buildmax_database_url
):
    from buildmax import cli as cli_module

    cli_module._register_commands()
    runner = CliRunner()
    args = ["--data-dir", str(tmp_path / "d")]
    if buildmax_database_url.startswith("postgresql"):
        args = ["--database-url", buildmax_database_url]
    weak = runner.invoke(cli_module.cli, ["admin", "bootstrap", *args, "--password", "short"])
    assert weak.exit_code != 0 and "12 characters" in weak.output
    first = runner.invoke(cli_module.cli, ["admin", "bootstrap", *args, "--name", "root"])
    assert first.exit_code == 0, first.output
    assert first.output.strip().startswith("bmx_")
    second = runner.invoke(cli_module.cli, ["admin", "bootstrap", *args])
    assert second.exit_code == 1
    assert "an admin exists already" in second.output


faulty = Blueprint("faulty_statement", __name__)


@faulty.post("/v1/faulty-statement")
@api("Writes a value its column cannot hold: a server bug, not the client's input", auth=False)
async def faulty_statement() -> Response:
    """Binds 2**63 to a 64-bit column, whatever the request says."""
    app = current_buildmax()
    async with app.db.write() as tx:
        await tx.execute(sign_in_failures.insert().values(name="bug", address="bug", at=2**63))
    return Response(status=204)


class FaultyStatement:
    @hookimpl
    def buildmax_blueprints(self, app):
        return [faulty]


async def test_a_driver_data_error_the_client_did_not_cause_is_a_logged_500(
    app, buildmax_settings, caplog
):
    """Out-of-range values from clients are refused at the edge (422); a
    driver data error that is the server's own stays a 500 with the
    traceback in the log, on both engines, so a server bug is never
    dressed up as the client's mistake. Catches a blanket handler that
    turns the driver's DataError (or SQLite's OverflowError) into a 4xx."""
    server = create_app(buildmax_settings, extra_plugins=[("faulty", FaultyStatement())])
    caplog.set_level(logging.ERROR)
    async with server.test_app():
        answer = await server.test_client().post("/v1/faulty-statement")
    assert answer.status_code == 500
    assert (await answer.get_json())["type"] == "urn:buildmax:problem:internal-error"
    assert "unhandled error in POST /v1/faulty-statement" in caplog.text
    assert "Traceback" in caplog.text or caplog.records[-1].exc_info is not None
    async with app.db.read() as conn:
        rows = await conn.fetch_all(sa.select(sign_in_failures.c.id))
    assert rows == []
