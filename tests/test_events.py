"""The per-space event stream over real HTTP (Server-Sent Events)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest


class SSEReader:
    """Reads one text/event-stream response as ``{"id", "event", "data"}`` dicts."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._lines = response.aiter_lines()

    async def next_event(self) -> dict | None:
        event: dict = {}
        async for line in self._lines:
            if line == "":
                if "event" in event:
                    return event
                event = {}
            elif not line.startswith(":"):
                field, _, value = line.partition(": ")
                event[field] = json.loads(value) if field == "data" else value
        return None

    async def take(self, count: int, within: float = 10) -> list[dict]:
        got: list[dict] = []

        async def read() -> None:
            while len(got) < count:
                event = await self.next_event()
                assert event is not None, f"stream ended after {got}"
                got.append(event)

        await asyncio.wait_for(read(), within)
        return got


async def increment(client, space, principal, times: int = 1) -> None:
    for _ in range(times):
        response = await client.post(
            f"/v1/spaces/{space.id}/testplugin/increment", headers=principal.headers
        )
        assert response.status_code == 200


@pytest.fixture
async def http(live_server) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=live_server, timeout=10) as session:
        yield session


async def test_a_subscriber_gets_a_spaces_events_in_order(http, client, make_principal, make_space):
    owner = await make_principal("human")
    space = await make_space(owner)
    async with http.stream("GET", f"/v1/spaces/{space.id}/events", headers=owner.headers) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        await increment(client, space, owner, 5)
        events = await SSEReader(resp).take(5)
    assert [e["id"] for e in events] == ["1", "2", "3", "4", "5"]
    assert [e["data"]["data"]["value"] for e in events] == [1, 2, 3, 4, 5]
    assert {e["event"] for e in events} == {"testplugin.incremented"}


async def test_resuming_with_last_event_id_loses_and_repeats_nothing(
    http, client, make_principal, make_space
):
    owner = await make_principal("human")
    space = await make_space(owner)
    await increment(client, space, owner, 3)
    url = f"/v1/spaces/{space.id}/events"
    async with http.stream("GET", url, headers=owner.headers) as resp:
        first = await SSEReader(resp).take(2)
    assert [e["id"] for e in first] == ["1", "2"]
    await increment(client, space, owner, 2)  # published while disconnected
    headers = {**owner.headers, "Last-Event-ID": first[-1]["id"]}
    async with http.stream("GET", url, headers=headers) as resp:
        reader = SSEReader(resp)
        rest = await reader.take(3)
        await increment(client, space, owner)
        live = await reader.take(1)
    assert [e["id"] for e in rest + live] == ["3", "4", "5", "6"]


async def test_a_subscriber_never_gets_another_spaces_events(
    http, client, make_principal, make_space
):
    owner = await make_principal("human")
    space_a, space_b = await make_space(owner), await make_space(owner)
    async with http.stream("GET", f"/v1/spaces/{space_a.id}/events", headers=owner.headers) as resp:
        await increment(client, space_b, owner, 3)
        await increment(client, space_a, owner)
        [event] = await SSEReader(resp).take(1)
    assert event["data"]["data"] == {"value": 1}
    assert event["id"] == "1"


async def test_a_revoked_token_ends_the_stream_at_the_next_keep_alive(
    app, http, client, make_principal, make_space
):
    """Catches: access checked only when the stream opens."""
    app.settings = app.settings.replace(events_keepalive_seconds=1)
    owner = await make_principal("human")
    space = await make_space(owner)
    created = await (await client.post("/v1/tokens", json={}, headers=owner.headers)).get_json()
    headers = {"Authorization": f"Bearer {created['token']}"}
    async with http.stream("GET", f"/v1/spaces/{space.id}/events", headers=headers) as resp:
        await client.delete(f"/v1/tokens/{created['id']}", headers=owner.headers)
        reader = SSEReader(resp)
        [ended] = await reader.take(1, within=5)
        assert ended["event"] == "access-ended"
        assert await asyncio.wait_for(reader.next_event(), 5) is None  # the server closed it


async def test_a_client_disconnected_mid_transaction_leaves_the_next_request_working(
    app, http, client, make_principal, make_space
):
    """Hypercorn cancels the handler when its client goes away; the open write
    transaction must roll back completely. Catches: rollback skipped on
    cancellation (the connection stays inside BEGIN)."""
    owner = await make_principal("human")
    space = await make_space(owner)
    url = f"/v1/spaces/{space.id}/testplugin/slow-increment?hold=5"
    with pytest.raises(httpx.ReadTimeout):
        await http.post(url, headers=owner.headers, timeout=0.5)
    await asyncio.sleep(0.3)  # let the server notice the disconnect
    response = await client.post(
        f"/v1/spaces/{space.id}/testplugin/increment", headers=owner.headers
    )
    assert response.status_code == 200
    assert await response.get_json() == {"value": 1}  # the cancelled bump never landed


async def test_a_removed_member_gets_nothing_published_after_the_removal(
    app, http, client, make_principal, make_space
):
    """Access is checked before every batch, not only when the stream is idle.
    Catches: the membership re-check removed, or run only at keep-alives."""
    owner = await make_principal("human")
    viewer = await make_principal("agent")
    space = await make_space(owner)
    added = await client.put(
        f"/v1/spaces/{space.id}/members/{viewer.id}", json={"role": "viewer"}, headers=owner.headers
    )
    assert added.status_code == 200
    async with http.stream("GET", f"/v1/spaces/{space.id}/events", headers=viewer.headers) as resp:
        reader = SSEReader(resp)
        await increment(client, space, owner)
        seen = await reader.take(2)  # the member.changed event, then the increment
        removed = await client.delete(
            f"/v1/spaces/{space.id}/members/{viewer.id}", headers=owner.headers
        )
        assert removed.status_code == 204
        await increment(client, space, owner, 3)
        [ended] = await reader.take(1)
    assert [e["event"] for e in seen] == ["space.member.changed", "testplugin.incremented"]
    assert ended["event"] == "access-ended"


async def test_a_demoted_admin_stream_ends(app, http, client, admin, make_principal, make_space):
    owner = await make_principal("human")
    other_admin = await make_principal("human", system_role="admin")
    space = await make_space(owner)
    url = f"/v1/spaces/{space.id}/events"
    async with http.stream("GET", url, headers=other_admin.headers) as resp:
        reader = SSEReader(resp)
        demoted = await client.patch(
            f"/v1/principals/{other_admin.id}", json={"system_role": None}, headers=admin.headers
        )
        assert demoted.status_code == 200
        await increment(client, space, owner)
        [ended] = await reader.take(1)
    assert ended["event"] == "access-ended"


async def test_concurrent_publishers_in_one_space_get_gap_free_sequences(
    app, make_principal, make_space
):
    """Catches: the sequence read and incremented without the space row lock
    (duplicate sequence numbers, or unique-key failures on PostgreSQL)."""
    owner = await make_principal("human")
    space = await make_space(owner)

    async def publish(i: int) -> None:
        async with app.db.write() as tx:
            await app.events.publish(tx, space.pk, "test.concurrent", {"i": i})
            await asyncio.sleep(0)

    results = await asyncio.gather(*(publish(i) for i in range(30)), return_exceptions=True)
    assert [r for r in results if isinstance(r, BaseException)] == []
    rows = await app.events.read_after(space.pk, 0, limit=100)
    assert [r["seq"] for r in rows] == list(range(1, 31))


async def test_a_reader_of_seq_after_last_never_misses_an_event_under_concurrent_writers(
    app, make_principal, make_space
):
    """The guarantee the stream's resuming rests on: a reader that reads
    ``seq > last`` while transactions commit in any order (and, on
    PostgreSQL, several sequencer statements run at once, as with several
    server processes) sees every event once, numbered 1..n without gaps.

    Catches: numbers taken from a snapshot instead of the locked space row
    (duplicates, or a later number visible before an earlier one)."""
    owner = await make_principal("human")
    space = await make_space(owner)
    writers, per_writer = 12, 5
    published = writers * per_writer * 2
    done = asyncio.Event()

    async def write(w: int) -> None:
        for i in range(per_writer):
            async with app.db.write() as tx:
                await app.events.publish_many(
                    tx,
                    space.pk,
                    [("test.race", {"w": w, "i": i, "part": part}) for part in range(2)],
                )
                # Commits interleave: some transactions outlive later ones.
                await asyncio.sleep(0.001 * ((w * 7 + i * 3) % 5))

    async def sequence() -> None:
        while not done.is_set():
            await app.events.sequence_once()
            await asyncio.sleep(0)

    seen: list[int] = []
    payloads: list[tuple[int, int, int]] = []

    async def read() -> None:
        last = 0
        while len(seen) < published:
            for row in await app.events.read_after(space.pk, last, limit=7):
                assert row["seq"] == last + 1, f"after {last} the reader got {row['seq']}"
                last = row["seq"]
                seen.append(last)
                data = json.loads(row["data"])
                payloads.append((data["w"], data["i"], data["part"]))
            await asyncio.sleep(0)

    sequencers = (
        [asyncio.create_task(sequence()) for _ in range(3)]
        if app.db.dialect == "postgresql"
        else []
    )
    try:
        await asyncio.wait_for(
            asyncio.gather(read(), *(write(w) for w in range(writers))), timeout=60
        )
    finally:
        done.set()
        await asyncio.gather(*sequencers)
    assert seen == list(range(1, published + 1))
    expected = [(i, part) for i in range(per_writer) for part in range(2)]
    assert sorted(payloads) == [(w, *each) for w in range(writers) for each in expected]
    # Each writer's events keep its order, within a transaction too.
    for w in range(writers):
        assert [(i, part) for ww, i, part in payloads if ww == w] == expected


@pytest.mark.postgres_only
async def test_events_a_process_left_unnumbered_are_numbered_by_the_next_sequencer(
    app, make_principal, make_space
):
    """A process that committed its events and died before numbering them
    leaves them in the outbox; the next sequencer statement of any process
    numbers them, after what was numbered before, and notifies."""
    import sqlalchemy as sa

    from buildmax.events import SEQUENCE_EVERY
    from buildmax.tables import event_outbox

    owner = await make_principal("human")
    space = await make_space(owner)
    async with app.db.write() as tx:
        await app.events.publish(tx, space.pk, "test.first", {})
    deadline = asyncio.get_running_loop().time() + SEQUENCE_EVERY + 5
    with app.events.subscription(space.pk) as woken:
        async with app.db.write() as tx:
            await tx.execute(
                event_outbox.insert().values(
                    space_id=space.pk, type="test.left", data="{}", created_at=0
                )
            )
        # Nobody publishes again: the process's periodic statement finds it
        # and notifies. (The first event's own notification may arrive here
        # too, late: a wake that finds the row unnumbered waits for the next.)
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            await asyncio.wait_for(woken.wait(), timeout=max(remaining, 0.01))
            woken.clear()
            rows = await app.events.read_after(space.pk, 0)
            if len(rows) == 2:
                break
    assert [(r["seq"], r["type"]) for r in rows] == [(1, "test.first"), (2, "test.left")]
    async with app.db.read() as conn:
        assert await conn.fetch_val(sa.select(sa.func.count()).select_from(event_outbox)) == 0
    assert await app.events.sequence_once() == 0


async def _open_transaction_locking(app: Any, sql: str, *args: Any) -> Any:
    """Another session (another process, say) with ``sql`` run in a
    transaction it keeps open; ``.rollback()`` or ``.commit()`` it."""
    import asyncpg

    conn = await asyncpg.connect(app.settings.database_url)
    transaction = conn.transaction()
    await transaction.start()
    await conn.fetch(sql, *args)

    class Open:
        async def end(self, commit: bool) -> None:
            await (transaction.commit() if commit else transaction.rollback())
            await conn.close()

    return Open()


@pytest.mark.postgres_only
async def test_a_locked_space_row_holds_up_no_other_spaces_answers(
    app, client, make_principal, make_space
):
    """A change to space A holds A's row, while A has committed events
    waiting; a write in space B answers at once, its event numbered.

    Catches: one sequencer statement for every space waiting on A's row, or
    a statement that takes its batch before it knows which spaces it holds."""
    from buildmax.events import SEQUENCE_BATCH
    from buildmax.tables import event_outbox

    owner = await make_principal("human")
    a, b = await make_space(owner), await make_space(owner)
    holding = await _open_transaction_locking(
        app, "UPDATE spaces SET name = name WHERE id = $1", a.pk
    )
    try:
        # More than one statement's batch: none of it may stand in B's way.
        async with app.db.write() as tx:
            await tx.execute(
                event_outbox.insert().values(
                    [
                        {"space_id": a.pk, "type": "a.waits", "data": "{}", "created_at": 0}
                        for _ in range(SEQUENCE_BATCH + 1)
                    ]
                )
            )
        answer = await asyncio.wait_for(
            client.post(f"/v1/spaces/{b.id}/testplugin/increment", headers=owner.headers), 2
        )
        assert answer.status_code == 200
        assert [r["type"] for r in await app.events.read_after(b.pk, 0)] == [
            "testplugin.incremented"
        ]
        assert await app.events.read_after(a.pk, 0) == []
    finally:
        await holding.end(commit=False)
    await app.events.sequence_once()
    numbered = await app.events.read_after(a.pk, SEQUENCE_BATCH - 1)
    assert [(r["seq"], r["type"]) for r in numbered] == [
        (SEQUENCE_BATCH, "a.waits"),
        (SEQUENCE_BATCH + 1, "a.waits"),
    ]


@pytest.mark.postgres_only
async def test_a_caller_waits_for_its_rows_while_another_statement_moves_them(
    app, make_principal, make_space
):
    """Another process's sequencer statement has moved a caller's outbox
    row and not yet committed: the caller's own statement skips that space
    and moves nothing, and the caller must wait until the row's number is
    committed, not answer before its event is in the stream.

    Catches: a statement that moved nothing taken for "all done"."""
    from buildmax.events import _SEQUENCE_PG, CHANNEL, SEQUENCE_BATCH
    from buildmax.tables import event_outbox

    owner = await make_principal("human")
    space = await make_space(owner)
    # No periodic statement of this process numbering the row before the
    # other session takes it.
    await app.events.stop()
    async with app.db.write() as tx:
        mine = await tx.fetch_val(
            event_outbox.insert()
            .values(space_id=space.pk, type="mine", data="{}", created_at=0)
            .returning(event_outbox.c.id)
        )
    sql = _SEQUENCE_PG.text
    for n, name in enumerate(("batch", "channel", "spaces", "uptos"), start=1):
        sql = sql.replace(f":{name}", f"${n}")
    other = await _open_transaction_locking(app, sql, SEQUENCE_BATCH, CHANNEL, [], [])
    try:
        waiting = asyncio.create_task(app.events.sequence_once({space.pk: int(mine)}))
        done, _ = await asyncio.wait({waiting}, timeout=0.5)
        assert not done, "the caller returned while its row's number was not committed"
    finally:
        await other.end(commit=True)
    await asyncio.wait_for(waiting, 10)
    assert [r["type"] for r in await app.events.read_after(space.pk, 0)] == ["mine"]


@pytest.mark.postgres_only
async def test_a_backlog_larger_than_a_batch_is_numbered_by_one_call(
    app, make_principal, make_space
):
    """What a dead process left can exceed one statement's batch: the
    periodic call numbers all of it, not one batch every two seconds.

    Catches: the sequencer stopping after a full batch."""
    import sqlalchemy as sa

    from buildmax.events import SEQUENCE_BATCH
    from buildmax.tables import event_outbox
    from buildmax.tables import events as events_table

    owner = await make_principal("human")
    space = await make_space(owner)
    await app.events.stop()  # no periodic statement racing this one
    left = SEQUENCE_BATCH + 5
    async with app.db.write() as tx:
        await tx.execute(
            event_outbox.insert().values(
                [
                    {"space_id": space.pk, "type": "left", "data": "{}", "created_at": 0}
                    for _ in range(left)
                ]
            )
        )
    assert await app.events.sequence_once() == left
    async with app.db.read() as conn:
        assert await conn.fetch_val(sa.select(sa.func.count()).select_from(event_outbox)) == 0
        numbered = sa.select(sa.func.max(events_table.c.seq)).where(
            events_table.c.space_id == space.pk
        )
        assert await conn.fetch_val(numbered) == left
