"""The pool of template clones the ``pg`` env's tests take their databases
from (``buildmax.testing.postgres.ClonePool``), against the configured server."""

from __future__ import annotations

import asyncio

import pytest

from buildmax.database import servers
from buildmax.testing import ClonePool


def _databases(server: str, prefix: str) -> list[str]:
    async def names() -> list[str]:
        [names] = await servers.administer(
            server,
            [f"SELECT string_agg(datname, ',') FROM pg_database WHERE datname LIKE '{prefix}%'"],
        )
        return sorted(str(names).split(",")) if names else []

    return asyncio.run(names())


@pytest.mark.postgres_only
def test_the_clone_pool_hands_out_fresh_clones_and_leaves_none_behind(
    buildmax_pg_server, buildmax_pg_template
):
    """Every clone is handed out once, is a copy of the template (its
    migrations are recorded), and nothing the pool made survives ``close``:
    neither the clones given back nor the ones still in stock."""
    pool = ClonePool(buildmax_pg_server, buildmax_pg_template, prefix="bmx_pooltest")
    try:
        taken = [pool.take() for _ in range(4)]
        assert len(set(taken)) == 4
        migrated = asyncio.run(
            servers.administer(
                servers.database_url(buildmax_pg_server, taken[0]),
                ["SELECT count(*) FROM schema_migrations"],
            )
        )
        assert migrated[0] > 0
        for name in taken:
            pool.give_back(name)
    finally:
        pool.close()
    assert _databases(buildmax_pg_server, "bmx_pooltest") == []


@pytest.mark.postgres_only
def test_a_clone_that_cannot_be_made_fails_the_test_that_waits_for_it(buildmax_pg_server):
    """Mutation: a maker that swallows its failure leaves ``take`` waiting forever."""
    pool = ClonePool(buildmax_pg_server, "bmx_no_such_template", prefix="bmx_pooltest")
    try:
        with pytest.raises(RuntimeError, match="bmx_no_such_template"):
            pool.take()
        with pytest.raises(RuntimeError):  # and every later one
            pool.take()
    finally:
        pool.close()
