"""A plugin written exactly as a third party would: a route, a command,
a migration, a service, an audit action and an event, with no kernel change."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import click
import sqlalchemy as sa
from buildmax_hookspecs import AuditAction, Migration, Transaction, hookimpl
from quart import Blueprint, Response, request

from buildmax.access import SpaceAccess
from buildmax.apidoc import api
from buildmax.auth import Caller
from buildmax.bodies import json_response
from buildmax.current import current_buildmax
from buildmax.idempotency import Reply, Work
from buildmax.migrations import create_tables

metadata = sa.MetaData()
counters = sa.Table(
    "testplugin_counters",
    metadata,
    sa.Column("space_id", sa.Integer, primary_key=True),
    sa.Column("value", sa.Integer, nullable=False),
)


class Greeter(Protocol):
    """A service this plugin provides."""

    def greet(self, name: str) -> str:
        """A greeting."""


class PoliteGreeter:
    def greet(self, name: str) -> str:
        return f"hello, {name}"


blueprint = Blueprint("testplugin", __name__)


@blueprint.get("/v1/testplugin/ping")
@api("Test plugin: ping", auth=False)
async def ping() -> Response:
    """Answers with a greeting from the plugin's own service."""
    greeter = current_buildmax().services.get(Greeter)
    return json_response({"pong": True, "greeting": greeter.greet("world")})


@blueprint.get("/v1/testplugin/scoped")
@api("Test plugin: a route that accepts tokens scoped to 'testscope'", scopes=["testscope"])
async def scoped(caller: Caller) -> Response:
    """Shows the caller and its scope."""
    return json_response(
        {"principal_id": caller.actor.principal_id, "scope": caller.actor.scope_id}
    )


@blueprint.post("/v1/spaces/<space>/testplugin/increment")
@api(
    "Test plugin: increment the space's counter",
    idempotent=True,
    role="member",
    action="testplugin.increment",
)
async def increment(caller: Caller, access: SpaceAccess) -> Work:
    """Read-modify-write in one write transaction, audited, with an event."""
    app = current_buildmax()

    async def work(tx: Transaction) -> Reply:
        value = await bump(tx, access.pk)
        await app.audit.record(
            tx,
            caller.actor,
            "testplugin.incremented",
            space_id=access.public_id,
            target_type="space",
            target_id=access.public_id,
            details={"value": value},
        )
        await app.events.publish(tx, access.pk, "testplugin.incremented", {"value": value})
        return Reply(200, {"value": value})

    return work


@blueprint.post("/v1/spaces/<space>/testplugin/slow-increment")
@api(
    "Test plugin: increment, then hold the transaction open for a while",
    not_idempotent="a test of a client leaving while the transaction is open",
    role="member",
    action="testplugin.increment",
)
async def slow_increment(access: SpaceAccess) -> Response:
    """Lets a test disconnect a client while its transaction is open."""
    app = current_buildmax()
    async with app.db.write() as tx:
        value = await bump(tx, access.pk)
        await asyncio.sleep(float(request.args.get("hold", "5")))
    return json_response({"value": value})


async def bump(tx: Transaction, space_pk: int) -> int:
    """Increment the counter row under a row lock; the new value."""
    current = await tx.fetch_val(
        sa.select(counters.c.value).where(counters.c.space_id == space_pk).with_for_update()
    )
    if current is None:
        await tx.execute(counters.insert().values(space_id=space_pk, value=1))
        return 1
    await tx.execute(
        sa.update(counters).where(counters.c.space_id == space_pk).values(value=current + 1)
    )
    return int(current) + 1


@click.command("testplugin-hello")
@click.argument("name", default="world")
def hello(name: str) -> None:
    """Say hello (a command added by the test plugin)."""
    click.echo(PoliteGreeter().greet(name))


@hookimpl
def buildmax_blueprints(app: Any) -> list[Blueprint]:
    return [blueprint]


@hookimpl
def buildmax_register_commands(cli: click.Group) -> None:
    cli.add_command(hello)


@hookimpl
def buildmax_migrations() -> list[Migration]:
    return [Migration("testplugin", 1, "counters", create_tables(counters))]


@hookimpl
def buildmax_services(app: Any) -> dict[type, Any]:
    return {Greeter: PoliteGreeter()}


@hookimpl
def buildmax_audit_actions() -> list[AuditAction]:
    return [AuditAction("testplugin.incremented", "A counter moved", frozenset({"value"}), "space")]
