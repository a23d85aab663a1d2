"""On PostgreSQL short reads have connections of their own: a read answers
while writers hold every connection of the write pool (waiting on a row
lock, say), instead of queueing behind them."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import sqlalchemy as sa

from buildmax.config import Config
from buildmax.testing import PrincipalHandle, SpaceHandle, call

pytestmark = pytest.mark.postgres_only


@pytest.fixture
def buildmax_settings(buildmax_settings: Config) -> Config:
    return buildmax_settings.replace(pg_pool_min=2, pg_pool_max=2, pg_read_pool=1)


async def test_a_read_answers_while_writers_hold_every_write_connection(
    app: Any,
    client: Any,
    make_principal: Callable[..., Awaitable[PrincipalHandle]],
    make_space: Callable[..., Awaitable[SpaceHandle]],
) -> None:
    owner = await make_principal("human")
    space = await make_space(owner)
    holding = asyncio.Event()
    release = asyncio.Event()
    held = 0

    async def hold_a_write_connection() -> None:
        nonlocal held
        async with app.db.write() as tx:
            await tx.fetch_val(sa.text("SELECT 1"))
            held += 1
            if held == 2:
                holding.set()
            await release.wait()

    async def one_more_write() -> int:
        async with app.db.write() as tx:
            return int(await tx.fetch_val(sa.text("SELECT 1")))

    holders = [asyncio.create_task(hold_a_write_connection()) for _ in range(2)]
    await asyncio.wait_for(holding.wait(), 10)
    waiting_write = asyncio.create_task(one_more_write())
    try:
        answer = await asyncio.wait_for(
            call(client, "GET", f"/v1/spaces/{space.id}", owner, expect=200), 10
        )
        assert answer["id"] == space.id
        # The write pool really was exhausted: the third write still waits.
        await asyncio.sleep(0.2)
        assert not waiting_write.done()
    finally:
        release.set()
        await asyncio.gather(*holders)
    assert await asyncio.wait_for(waiting_write, 10) == 1


async def test_a_long_read_and_a_backup_snapshot_leave_the_short_reads_alone(
    app: Any,
    client: Any,
    make_principal: Callable[..., Awaitable[PrincipalHandle]],
    make_space: Callable[..., Awaitable[SpaceHandle]],
) -> None:
    """Catches: a long read (``background=True``) or the backup's snapshot
    taking the one connection kept for short reads."""
    owner = await make_principal("human")
    space = await make_space(owner)
    async with app.db.read(background=True) as long_read, app.db.snapshot() as snap:
        assert await long_read.fetch_val(sa.text("SELECT 1")) == 1
        assert await snap.conn.fetch_val(sa.text("SELECT 1")) == 1
        answer = await asyncio.wait_for(
            call(client, "GET", f"/v1/spaces/{space.id}", owner, expect=200), 10
        )
    assert answer["id"] == space.id
