"""Plugins: discovered through entry points, isolated when broken, validated."""

from __future__ import annotations

import logging

import pytest
from buildmax_hookspecs import hookimpl
from buildmax_testplugin import Greeter
from click.testing import CliRunner

from buildmax import essentials
from buildmax.app import create_app
from buildmax.plugins import PluginLoadError, create_plugins


async def test_an_installed_plugin_adds_a_route_a_migration_and_a_service(app, client):
    """The test plugin (tests/plugin, installed like a third party's) needs no
    kernel change: its route answers using its own service, and its
    migration created its table."""
    response = await client.get("/v1/testplugin/ping")
    assert response.status_code == 200
    assert await response.get_json() == {"pong": True, "greeting": "hello, world"}
    assert app.services.provider(Greeter) == "testplugin"
    import sqlalchemy as sa

    async with app.db.read() as conn:
        versions = await conn.fetch_all(
            sa.text("SELECT plugin, version FROM schema_migrations ORDER BY plugin")
        )
    assert {(r["plugin"], r["version"]) for r in versions} >= {("kernel", 1), ("testplugin", 1)}
    async with app.db.read() as conn:
        assert await conn.fetch_val(sa.text("SELECT count(*) FROM testplugin_counters")) == 0


async def test_the_plugin_route_is_in_the_openapi_document(client):
    document = await (await client.get("/v1/openapi.json")).get_json()
    assert "/v1/testplugin/ping" in document["paths"]
    assert document["paths"]["/v1/spaces/{space}/testplugin/increment"]["post"]["summary"]


@pytest.mark.engine_independent
def test_the_plugin_adds_a_cli_command():
    from buildmax import cli as cli_module

    cli_module._register_commands()
    result = CliRunner().invoke(cli_module.cli, ["testplugin-hello", "ada"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "hello, ada"
    listing = CliRunner().invoke(cli_module.cli, ["plugins"])
    assert "testplugin 0.1.0" in listing.output
    assert "buildmax_register_commands" in listing.output
    pins = CliRunner().invoke(cli_module.cli, ["plugins", "--requirements"])
    assert "buildmax-testplugin==0.1.0" in pins.output.splitlines()


@pytest.mark.engine_independent
def test_a_plugin_whose_import_raises_is_reported_by_name_and_skipped(monkeypatch, caplog):
    monkeypatch.setenv("BUILDMAX_TESTPLUGIN_BREAK", "1")
    with caplog.at_level(logging.ERROR, logger="buildmax.plugins"):
        plugins = create_plugins()
    infos = {info.name: info for info in plugins.infos()}
    assert not infos["brokenplugin"].loaded
    assert "refuses to load" in infos["brokenplugin"].error
    assert infos["testplugin"].loaded
    assert "'brokenplugin' failed to load" in caplog.text


@pytest.mark.engine_independent
def test_strict_mode_aborts_on_a_broken_plugin(monkeypatch):
    monkeypatch.setenv("BUILDMAX_TESTPLUGIN_BREAK", "1")
    with pytest.raises(PluginLoadError, match="brokenplugin"):
        create_plugins(strict=True)


@pytest.mark.engine_independent
def test_a_misspelt_hook_name_is_refused():
    from buildmax_testplugin import misspelt

    with pytest.raises(PluginLoadError, match="buildmax_blueprint"):
        create_plugins(allow=set(), extra=[("misspelt", misspelt)])


@pytest.mark.engine_independent
def test_the_allow_list_loads_only_named_plugins_and_empty_loads_none():
    named = create_plugins(essential=essentials, allow={"testplugin"})
    assert {i.name for i in named.infos()} == {"buildmax.essentials", "testplugin"}
    # The kernel's own plugin is loaded whatever the allow-list says.
    none = create_plugins(essential=essentials, allow=set())
    assert {i.name for i in none.infos()} == {"buildmax.essentials"}


@pytest.mark.engine_independent
def test_tracing_logs_every_hook_call(caplog):
    plugins = create_plugins(allow=set(), trace=True)
    with caplog.at_level(logging.INFO, logger="buildmax.plugins"):
        plugins.hooks.migrations()
    assert "hook buildmax_migrations" in caplog.text


async def test_tracing_logs_the_hooks_called_plugin_by_plugin_too(buildmax_settings, caplog):
    """Blob stores, services, start-up and shutdown included: every hook an
    app calls from its creation to its end is in the log, with the plugins
    that answered."""
    settings = buildmax_settings.replace(trace_plugins=True)
    with caplog.at_level(logging.INFO, logger="buildmax.plugins"):
        app = create_app(settings, auto_migrate=True)
        async with app.test_app():
            pass
    traced = caplog.text
    for hook in (
        "buildmax_blob_stores",
        "buildmax_services",
        "buildmax_blueprints",
        "buildmax_migrations",
        "buildmax_audit_actions",
        "buildmax_startup",
        "buildmax_shutdown",
    ):
        assert f"hook {hook} -> [" in traced, hook
        assert f"hook {hook} done" in traced, hook
    assert "hook buildmax_blob_stores -> ['buildmax.essentials'" in traced
    assert "'testplugin'" in traced.split("hook buildmax_services -> ", 1)[1].splitlines()[0]


async def test_disabling_a_plugin_after_its_migration_ran_still_starts(buildmax_settings, app):
    """``app`` ran the test plugin's migration; an app without the plugin starts,
    and its records are reported as not loaded, not refused."""
    from buildmax.migrations import migration_status

    without = create_app(buildmax_settings.replace(load_plugins=""))
    async with without.test_app():
        response = await without.test_client().get("/readyz")
        assert response.status_code == 200, await response.get_data()
        statuses = {
            s.plugin: s.state for s in await migration_status(without.db, without.migrations())
        }
    assert statuses["kernel"] == "current"
    assert statuses["testplugin"] == "not loaded"
    assert set(statuses.values()) == {"current", "not loaded"}


async def test_a_service_nobody_provides_is_a_clear_error(app):
    from buildmax.services import ServiceMissing

    class TaskQueue:  # a Protocol no loaded plugin provides
        pass

    with pytest.raises(ServiceMissing, match="TaskQueue"):
        app.services.get(TaskQueue)


async def test_startup_and_shutdown_hooks_run_once(buildmax_settings):
    from buildmax_hookspecs import hookimpl

    calls = []

    class Lifecycle:
        @hookimpl
        async def buildmax_startup(self, app):
            calls.append(("startup", app.db.dialect))

        @hookimpl
        def buildmax_shutdown(self, app):
            calls.append(("shutdown", app.db.dialect))

    app = create_app(
        buildmax_settings, extra_plugins=[("lifecycle", Lifecycle())], auto_migrate=True
    )
    async with app.test_app():
        assert [c[0] for c in calls] == ["startup"]
    assert [c[0] for c in calls] == ["startup", "shutdown"]


async def test_a_permission_hook_can_deny_a_member(app, client, make_principal, make_space):
    from buildmax_hookspecs import hookimpl

    owner = await make_principal("human")
    space = await make_space(owner)

    class DenyRenames:
        @hookimpl
        def buildmax_permission(self, actor, action, resource):
            return False if action == "space.update" else None

    app.plugins.pm.register(DenyRenames(), name="deny-renames")
    renamed = await client.patch(
        f"/v1/spaces/{space.id}", json={"name": "x"}, headers=owner.headers
    )
    shown = await client.get(f"/v1/spaces/{space.id}", headers=owner.headers)
    assert renamed.status_code == 403
    assert shown.status_code == 200
    assert (await shown.get_json())["name"] == space.slug


async def test_a_plugin_failing_to_shut_down_is_logged_and_the_others_still_shut_down(
    buildmax_settings, caplog
):
    stopped = []

    class Failing:
        @hookimpl
        async def buildmax_shutdown(self, app):
            raise RuntimeError("cannot stop")

    class Stopping:
        @hookimpl
        def buildmax_shutdown(self, app):
            stopped.append(app)

    app = create_app(
        buildmax_settings,
        auto_migrate=True,
        extra_plugins=[("stopping", Stopping()), ("failing", Failing())],
    )
    with caplog.at_level(logging.ERROR, logger="buildmax.plugins"):
        async with app.test_app():
            pass
    assert stopped == [app]
    assert "plugin 'failing' failed to shut down" in caplog.text


async def test_a_hook_that_changes_data_needs_the_app_the_facade_was_attached_to(app) -> None:
    """Plugins loaded for a command (no app) cannot call a transaction's
    hooks with a missing ``app``: they say why instead."""
    detached = create_plugins(allow=set())
    with pytest.raises(RuntimeError, match="create_app"):
        await detached.hooks.claim_check(None, None, None)  # type: ignore[arg-type]
    assert app.hooks.app is app
