"""Write admission: on SQLite a mutating request's handler runs alone, a
read never waits for it, and nothing that waits on something other than
the database holds the others up."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from buildmax_hookspecs import hookimpl
from quart import Blueprint, Response

from buildmax import passwords
from buildmax.admission import WriteAdmission, for_engine, stepped_out
from buildmax.apidoc import api
from buildmax.app import create_app
from buildmax.auth import Caller
from buildmax.bodies import json_response
from buildmax.principals import create_principal
from buildmax.tokens import issue_token

pytestmark = pytest.mark.engine_independent


async def test_admitted_blocks_run_one_at_a_time_first_come_first_served() -> None:
    """Catches: a semaphore of more than one slot, or none."""
    admission = WriteAdmission(1)
    inside: list[int] = []
    order: list[int] = []

    async def write(n: int) -> None:
        async with admission.admitted():
            inside.append(n)
            assert len(inside) == 1, f"{inside} admitted at once"
            order.append(n)
            await asyncio.sleep(0.001)
            inside.remove(n)

    await asyncio.gather(*(write(n) for n in range(8)))
    assert order == list(range(8))


async def test_postgresql_admits_every_request_at_once() -> None:
    assert for_engine("sqlite").slots == 1
    assert for_engine("postgresql").slots is None
    admission = for_engine("postgresql")
    both = asyncio.Barrier(2)

    async def write() -> None:
        async with admission.admitted():
            await asyncio.wait_for(both.wait(), 5)

    await asyncio.gather(write(), write())


async def test_a_request_made_from_an_admitted_one_is_served_within_its_admission() -> None:
    """Catches: a nested (in-process) request queueing for the slot its
    caller holds: a deadlock."""
    admission = WriteAdmission(1)

    async def nested() -> str:
        async with admission.admitted():
            return "served"

    async def outer() -> str:
        async with admission.admitted():
            # A task started meanwhile (as the ASGI transport may) too.
            return await asyncio.create_task(nested())

    assert await asyncio.wait_for(outer(), 5) == "served"


async def test_stepping_out_lets_the_next_request_in_and_queues_again() -> None:
    """Catches: a slow wait (Argon2 in a thread) holding every write up."""
    admission = WriteAdmission(1)
    hashing = asyncio.Event()
    release = asyncio.Event()
    events: list[str] = []

    async def slow() -> None:
        async with admission.admitted():
            async with stepped_out():
                hashing.set()
                await release.wait()
            events.append("slow back")

    async def quick() -> None:
        await hashing.wait()
        async with admission.admitted():
            events.append("quick served")
            release.set()
            await asyncio.sleep(0.01)
            events.append("quick done")

    await asyncio.wait_for(asyncio.gather(slow(), quick()), 5)
    # The slow request got its slot back only once the quick one left it.
    assert events == ["quick served", "quick done", "slow back"]


async def test_a_cancelled_request_that_stepped_out_gives_back_no_slot_twice() -> None:
    """Catches: a slot released twice (two handlers admitted at once ever after)."""
    admission = WriteAdmission(1)
    stepped = asyncio.Event()

    async def cancelled() -> None:
        async with admission.admitted(), stepped_out():
            stepped.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(cancelled())
    await stepped.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    inside = 0
    most = 0

    async def write() -> None:
        nonlocal inside, most
        async with admission.admitted():
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.001)
            inside -= 1

    await asyncio.wait_for(asyncio.gather(*(write() for _ in range(5))), 5)
    assert most == 1


async def test_password_hashing_steps_out_of_the_admission(monkeypatch: Any) -> None:
    """Catches: hash_password or verify_password awaited inside the slot."""
    admission = WriteAdmission(1)
    started = asyncio.Event()
    go = asyncio.Event()
    loop = asyncio.get_running_loop()

    class SlowHasher:
        def hash(self, password: str) -> str:
            loop.call_soon_threadsafe(started.set)
            asyncio.run_coroutine_threadsafe(go.wait(), loop).result(5)
            return "hashed"

        def verify(self, stored: str, password: str) -> bool:
            return self.hash(password) == stored

    monkeypatch.setattr(passwords, "_hasher", SlowHasher())
    for check in (
        lambda: passwords.hash_password("correct horse battery"),
        lambda: passwords.verify_password("hashed", "correct horse battery"),
    ):
        started.clear()
        go.clear()

        async def slow(check: Any = check) -> Any:
            async with admission.admitted():
                return await check()

        async def other() -> None:
            await started.wait()
            async with admission.admitted():
                go.set()

        result, _ = await asyncio.wait_for(asyncio.gather(slow(), other()), 5)
        assert result in ("hashed", True)


held = Blueprint("held", __name__)
#: What the held route's handlers do, in order, and the gate they wait at.
seen: list[str] = []
gates: dict[str, asyncio.Event] = {}
entered: dict[str, asyncio.Event] = {}


@held.post("/v1/held/<name>")
@api("Wait at a named gate", not_idempotent="a test route", tags=["held"])
async def wait_at_gate(name: str, caller: Caller) -> Response:
    """Enter, wait until the test opens the gate, leave."""
    seen.append(f"{name} in")
    entered[name].set()
    await gates[name].wait()
    seen.append(f"{name} out")
    return json_response({})


@held.get("/v1/held")
@api("Read while others wait", tags=["held"])
async def read_meanwhile(caller: Caller) -> Response:
    """A read."""
    seen.append("read")
    return json_response({})


class Held:
    @hookimpl
    def buildmax_blueprints(self) -> list[Blueprint]:
        return [held]


@pytest.fixture
async def held_app(buildmax_settings: Any, clock: Any) -> Any:
    application = create_app(
        buildmax_settings, clock=clock, extra_plugins=[("held", Held())], auto_migrate=True
    )
    async with application.test_app():
        yield application


async def test_on_sqlite_a_mutating_handler_waits_for_the_one_running_and_a_read_does_not(
    held_app: Any, tmp_path: Any
) -> None:
    """End to end through the route declaration, on SQLite: the second
    write's handler starts only once the first has answered; a read is
    served meanwhile.

    Catches: the route declaration not admitting mutating handlers."""
    assert held_app.db.dialect == "sqlite"
    seen.clear()
    gates.clear()
    gates.update(a=asyncio.Event(), b=asyncio.Event())
    entered.update(a=asyncio.Event(), b=asyncio.Event())
    async with held_app.db.write() as tx:
        row = await create_principal(tx, kind="agent", name="w", system_role=None, now=0)
        issued = await issue_token(tx, principal_pk=row["id"], now=0, name="test")
    headers = {"Authorization": f"Bearer {issued.secret}"}
    client = held_app.test_client()
    first = asyncio.create_task(client.post("/v1/held/a", json={}, headers=headers))
    await asyncio.wait_for(entered["a"].wait(), 5)
    second = asyncio.create_task(client.post("/v1/held/b", json={}, headers=headers))
    read = await asyncio.wait_for(client.get("/v1/held", headers=headers), 5)
    assert read.status_code == 200
    await asyncio.sleep(0.05)
    assert seen == ["a in", "read"]
    gates["a"].set()
    gates["b"].set()
    assert (await asyncio.wait_for(first, 5)).status_code == 200
    assert (await asyncio.wait_for(second, 5)).status_code == 200
    assert seen == ["a in", "read", "a out", "b in", "b out"]
