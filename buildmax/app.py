"""The app factory: a Quart app wired to plugins, database and services."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit

from buildmax_hookspecs import App, BlobStore, BlobStoreUnavailable, Migration
from quart import Quart, Response, g, request
from werkzeug.exceptions import HTTPException

from . import essentials
from .addresses import client_address, parse_networks
from .admission import WriteAdmission, for_engine
from .audit import AuditLog
from .auth import TokenToucher
from .bodies import json_response
from .clock import Clock, SystemClock
from .config import Config, load_config
from .database import Database, DatabaseLogFull, open_database
from .disk import DiskReserve
from .drain import Drain
from .events import EventHub
from .hooks import Hooks
from .idempotency import Idempotency
from .ids import new_id
from .inputs import unsafe_text
from .internal import REQUEST_ID_SCOPE
from .logs import FIELDS
from .metrics import UNMATCHED_ROUTE, Metrics
from .migrations import MigrationError, migrate, migration_status, refuse_if_ahead
from .plugins import Plugins, create_plugins
from .problems import (
    PROBLEM_CONTENT_TYPE,
    BadRequest,
    BlobStoreDown,
    DatabaseLogAtLimit,
    NotFound,
    Problem,
    problem_for_status,
)
from .restore_marker import restore_unfinished
from .services import Services
from .streaming import PulledRequest, PullingHTTPConnection
from .url_rules import SharedBuilderRule

log = logging.getLogger("buildmax")
request_log = logging.getLogger("buildmax.requests")

_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,64}$")


class BuildMax(Quart):
    """The Quart app with the kernel's parts attached. Request bodies are
    pulled from the connection as the handler reads them
    (:mod:`buildmax.streaming`); URL rules share their compiled builders
    (:mod:`buildmax.url_rules`)."""

    asgi_http_class = PullingHTTPConnection
    request_class = PulledRequest
    url_rule_class = SharedBuilderRule

    settings: Config
    clock: Clock
    plugins: Plugins
    hooks: Hooks
    db: Database
    services: Services
    audit: AuditLog
    events: EventHub
    admission: WriteAdmission
    idempotency: Idempotency
    token_toucher: TokenToucher
    auto_migrate: bool
    metrics: Metrics
    disk: DiskReserve
    drain: Drain

    def migrations(self) -> list[Migration]:
        """Every migration the loaded plugins contribute."""
        return self.hooks.migrations()


def problem_response(problem: Problem) -> Response:
    """Render a problem as ``application/problem+json``."""
    body = problem.to_dict(instance=request.path, request_id=g.get("request_id"))
    response = json_response(body, problem.status)
    response.content_type = PROBLEM_CONTENT_TYPE
    response.headers.update(problem.headers)
    if problem.status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="buildmax"'
    return response


def create_app(
    settings: Config | None = None,
    *,
    clock: Clock | None = None,
    extra_plugins: Iterable[tuple[str, object]] = (),
    auto_migrate: bool = False,
) -> BuildMax:
    """Build a BuildMax app.

    ``auto_migrate`` applies pending migrations at start-up (the embedded
    default); otherwise pending migrations refuse start-up with a message
    pointing at ``buildmax db migrate``.
    """
    settings = settings or load_config()
    app = BuildMax("buildmax")
    app.settings = settings
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes
    app.config["BODY_TIMEOUT"] = 60
    app.clock = clock or SystemClock()
    app.auto_migrate = auto_migrate
    app.metrics = Metrics(enabled=settings.metrics)
    app.disk = DiskReserve(settings)
    app.drain = Drain()
    app.plugins = create_plugins(
        essential=essentials,
        allow=settings.plugin_allow_list,
        strict=settings.strict_plugins,
        trace=settings.trace_plugins,
        extra=extra_plugins,
    )
    app.hooks = app.plugins.hooks
    app.hooks.attach(app)
    app.db = open_database(
        settings.effective_database_url,
        sqlite_readers=settings.sqlite_readers,
        sqlite_wal_limits=(
            settings.sqlite_wal_soft_limit_bytes,
            settings.sqlite_wal_hard_limit_bytes,
        ),
        pg_pool=(settings.pg_pool_min, settings.pg_pool_max),
        pg_read_pool=settings.pg_read_pool,
    )
    app.db.observe_write = app.metrics.observe_write
    app.admission = for_engine(app.db.dialect)
    app.services = Services()
    app.events = EventHub(app)
    app.idempotency = Idempotency(app)
    app.token_toucher = TokenToucher(app, settings.token_touch_interval_seconds * 1000)
    app.audit = AuditLog(
        app,
        app.hooks.audit_actions(),
        app.hooks.audit_targets(),
    )
    _provide_blob_store(app)
    _provide_services(app)
    for blueprint in app.hooks.blueprints(app):
        app.register_blueprint(blueprint)
    _install_conventions(app)

    @app.before_serving
    async def startup() -> None:
        await _startup(app)

    @app.after_serving
    async def shutdown() -> None:
        await _shutdown(app)

    return app


def _provide_blob_store(app: BuildMax) -> None:
    factories: dict[str, Any] = {}
    for plugin, offered in app.hooks.blob_stores():
        for scheme, factory in offered.items():
            factories.setdefault(scheme, (plugin, factory))
    url = app.settings.effective_blob_store_url
    scheme = urlsplit(url).scheme
    if scheme not in factories:
        raise ValueError(
            f"no loaded plugin provides a blob store for {scheme!r} URLs "
            f"(known: {', '.join(sorted(factories))})"
        )
    provider, factory = factories[scheme]
    app.services.provide(BlobStore, factory(url, app.settings), provider)


def _provide_services(app: BuildMax) -> None:
    for plugin, provided in app.hooks.services(app):
        if provided:
            app.services.provide_all(provided, plugin)


def _install_conventions(app: BuildMax) -> None:
    trusted = parse_networks(app.settings.trusted_proxies)

    @app.before_request
    async def assign_request_id() -> None:
        g.started = time.perf_counter()
        marked = request.scope.get(REQUEST_ID_SCOPE)
        incoming = request.headers.get("X-Request-Id", "")
        if isinstance(marked, str):  # an in-process request, marked by its caller
            # (with a "/", which an X-Request-Id from the network cannot hold)
            g.request_id = marked
        elif _REQUEST_ID.match(incoming):
            g.request_id = incoming
        else:
            g.request_id = new_id("rq")
        g.client_address = client_address(
            request.remote_addr,
            request.headers.getlist("X-Forwarded-For"),
            trusted,
        )[:64]
        # No id or name contains NUL or a lone surrogate: such a path names nothing.
        if any(isinstance(v, str) and unsafe_text(v) for v in (request.view_args or {}).values()):
            raise NotFound("no such resource")
        if any(unsafe_text(v) for v in request.args.values()):
            raise BadRequest("the query contains NUL or an unpaired surrogate")

    @app.after_request
    async def echo_request_id(response: Response) -> Response:
        if "request_id" in g:
            response.headers["X-Request-Id"] = g.request_id
        if app.drain.draining:
            # Draining: this connection carries no further request.
            response.headers["Connection"] = "close"
        if "started" in g:
            _log_request(app, response.status_code, time.perf_counter() - g.started)
        return response

    @app.errorhandler(Problem)
    async def on_problem(problem: Problem) -> Response:
        return problem_response(problem)

    @app.errorhandler(HTTPException)
    async def on_http_exception(exc: HTTPException) -> Response:
        response = problem_response(problem_for_status(exc.code or 500, exc.description))
        for name, value in exc.get_headers():
            if name.lower() == "allow":  # a 405 must say what is allowed
                response.headers[name] = value
        return response

    @app.errorhandler(BlobStoreUnavailable)
    async def on_blob_store_unavailable(exc: BlobStoreUnavailable) -> Response:
        app.metrics.blob_store_errors.inc()
        app.metrics.blob_store_failed_at = app.clock.now_ms()
        log.warning("blob store unavailable in %s %s: %s", request.method, request.path, exc)
        # The cause (hosts, codes) goes to the log, not to the client.
        return problem_response(
            BlobStoreDown("the blob store did not answer; retry later", retry_after=5)
        )

    @app.errorhandler(DatabaseLogFull)
    async def on_database_log_full(exc: DatabaseLogFull) -> Response:
        # Already logged, once per relief attempt, by the engine.
        return problem_response(DatabaseLogAtLimit(str(exc), retry_after=exc.retry_after))

    @app.errorhandler(Exception)
    async def on_exception(exc: Exception) -> Response:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return problem_response(Problem("an internal error occurred; see the server log"))


def _log_request(app: BuildMax, status: int, seconds: float) -> None:
    """Count the request and log its one line: request id, method, route
    template, status, duration and client, never the path's ids, the query,
    a header or the body."""
    rule = request.url_rule
    route = rule.rule if rule is not None else UNMATCHED_ROUTE
    app.metrics.observe_request(request.method, route, status, seconds)
    if not request_log.isEnabledFor(logging.INFO):
        return
    millis = round(seconds * 1000, 1)
    request_log.info(
        "%s %s %s %d %.1fms %s",
        g.request_id,
        request.method,
        route,
        status,
        millis,
        g.client_address,
        extra={
            FIELDS: {
                "request_id": g.request_id,
                "method": request.method,
                "route": route,
                "status": status,
                "duration_ms": millis,
                "client": g.client_address,
            }
        },
    )


async def _startup(app: BuildMax) -> None:
    await app.db.connect()
    try:
        async with app.db.read() as conn:
            if await restore_unfinished(conn):
                raise MigrationError(
                    "a restore into this database did not finish (it was stopped before its "
                    "new authority epoch): run `buildmax backup restore --replace` again"
                )
        migrations = app.migrations()
        statuses = await migration_status(app.db, migrations)
        refuse_if_ahead(statuses)
        if any(s.pending for s in statuses):
            if not app.auto_migrate:
                pending = ", ".join(f"{s.plugin} ({len(s.pending)})" for s in statuses if s.pending)
                raise MigrationError(
                    f"the database has pending migrations: {pending}; run `buildmax db migrate`"
                )
            await migrate(app.db, migrations, app.clock)
        await app.events.start()
        await app.hooks.startup(app)
    except BaseException:
        # Whatever did start (a plugin's background task) is stopped again.
        await _shutdown(app)
        raise


async def _shutdown(app: BuildMax) -> None:
    await app.hooks.shutdown(app)
    await app.token_toucher.drain()
    await app.events.stop()
    await close_blob_store(app)
    await app.db.close()


def blob_store(app: App) -> BlobStore:
    """The app's blob store service."""
    return app.services.get(BlobStore)


async def close_blob_store(app: BuildMax) -> None:
    """Close the app's blob store (its connections), logging a failure."""
    try:
        await blob_store(app).aclose()
    except Exception:
        log.exception("the blob store failed to close")
