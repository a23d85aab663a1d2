"""Write admission: on SQLite a mutating request's handler runs alone, a
read never waits for it, and nothing that waits on something other than
the database holds the others up."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
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
    return await _wait_at(name)


async def _wait_at(name: str) -> Response:
    seen.append(f"{name} in")
    entered[name].set()
    await gates[name].wait()
    seen.append(f"{name} out")
    return json_response({})


@held.post("/v1/held/raw/<name>")
@api(
    "Wait at a named gate, with a raw body",
    not_idempotent="a test route",
    body_type="application/octet-stream",
    tags=["held"],
)
async def wait_at_gate_raw(name: str, caller: Caller) -> Response:
    """A raw-body route (an upload streams its body in the handler)."""
    return await _wait_at(name)


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


async def _gates_and_caller(app: Any, *names: str) -> dict[str, str]:
    """Fresh gates named ``names``, nothing seen yet, and the headers of a
    new agent's token."""
    seen.clear()
    gates.clear()
    entered.clear()
    for name in names:
        gates[name], entered[name] = asyncio.Event(), asyncio.Event()
    async with app.db.write() as tx:
        row = await create_principal(
            tx, kind="agent", name=f"agent-{'-'.join(names)}", system_role=None, now=0
        )
        issued = await issue_token(tx, principal_pk=row["id"], now=0, name="test")
    return {"Authorization": f"Bearer {issued.secret}"}


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
    headers = await _gates_and_caller(held_app, "a", "b")
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


async def test_stepping_out_inside_a_write_transaction_keeps_the_slot(held_app: Any) -> None:
    """On SQLite a write transaction holds the single writer: a request that
    let the next one in from there would wait for its slot back while the
    next one waits for the writer.

    Catches: stepped_out giving the slot away inside a transaction (a deadlock)."""
    admission = held_app.admission
    order: list[str] = []

    async def remote_call_in_transaction() -> None:
        async with admission.admitted(), held_app.db.write():
            async with stepped_out():
                await asyncio.sleep(0.05)  # a remote call, say
            order.append("first")

    async def plain_write() -> None:
        await asyncio.sleep(0.01)
        async with admission.admitted(), held_app.db.write():
            order.append("second")

    await asyncio.wait_for(asyncio.gather(remote_call_in_transaction(), plain_write()), 5)
    assert order == ["first", "second"]


async def test_a_task_that_outlives_its_request_neither_keeps_nor_rides_the_slot() -> None:
    """A task the handler started shares its admission while the handler
    runs, and only then: afterwards its writes queue like anyone's, and a
    slot it stepped out of is not taken back for a request that is over.

    Catches: admission following a task after its handler ended (two
    handlers admitted at once; or the slot lost for good)."""
    admission = WriteAdmission(1)
    handler_done = asyncio.Event()
    stepped = asyncio.Event()
    results: dict[str, Any] = {}

    async def left_behind() -> None:
        async with stepped_out():
            stepped.set()
            await handler_done.wait()
            await asyncio.sleep(0.01)
        # The handler is over: a write from here is a new request.
        inside = asyncio.Event()
        other_may_finish = asyncio.Event()

        async def other() -> None:
            async with admission.admitted():
                inside.set()
                await other_may_finish.wait()

        other_task = asyncio.create_task(other())
        await inside.wait()
        entered = asyncio.create_task(_enter(admission))
        await asyncio.sleep(0.02)
        results["rode the slot"] = entered.done()
        other_may_finish.set()
        await asyncio.wait_for(asyncio.gather(other_task, entered), 5)

    async def handler() -> asyncio.Task[None]:
        async with admission.admitted():
            task = asyncio.create_task(left_behind())
            await stepped.wait()
        handler_done.set()
        return task

    task = await handler()
    await asyncio.wait_for(task, 5)
    assert results["rode the slot"] is False
    # Exactly one slot is left: two more requests still take turns.
    assert admission._slots is not None and admission._slots._value == 1


async def _enter(admission: WriteAdmission) -> None:
    async with admission.admitted():
        pass


async def test_a_client_trickling_its_body_holds_up_no_other_write(
    live_server: str, make_principal: Any, make_space: Any
) -> None:
    """The body is read before the slot is taken, declared or not (an
    idempotency key's fingerprint reads it on routes that declare none).

    Catches: the slot taken before the body has arrived."""
    owner = await make_principal("human")
    space = await make_space(owner)
    host, port = live_server.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    path = f"/v1/spaces/{space.id}/testplugin/increment"
    writer.write(
        (
            f"POST {path} HTTP/1.1\r\nHost: buildmax\r\nAuthorization: Bearer {owner.token}\r\n"
            "Idempotency-Key: slow\r\nContent-Type: application/json\r\n"
            "Content-Length: 2\r\n\r\n{"
        ).encode()
    )
    await writer.drain()
    await asyncio.sleep(0.3)
    try:
        async with httpx.AsyncClient(base_url=live_server, timeout=3) as http:
            other = await http.post(path, headers={"Authorization": f"Bearer {owner.token}"})
        assert other.status_code == 200
    finally:
        writer.write(b"}")
        await writer.drain()
        status = (await asyncio.wait_for(reader.readline(), 5)).split()[1]
        writer.close()
    assert status == b"200"


async def test_an_upload_is_not_admitted(held_app: Any) -> None:
    """A raw-body route streams its body inside its handler, at the
    client's pace: it must not hold the slot.

    Catches: raw-body routes admitted like JSON ones."""
    headers = await _gates_and_caller(held_app, "up", "b")
    client = held_app.test_client()
    upload = asyncio.create_task(
        client.post(
            "/v1/held/raw/up",
            data=b"bytes",
            headers={**headers, "Content-Type": "application/octet-stream"},
        )
    )
    await asyncio.wait_for(entered["up"].wait(), 5)
    write = asyncio.create_task(client.post("/v1/held/b", json={}, headers=headers))
    await asyncio.wait_for(entered["b"].wait(), 5)
    gates["up"].set()
    gates["b"].set()
    assert (await upload).status_code == 200
    assert (await write).status_code == 200
