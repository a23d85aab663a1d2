"""Helpers of the audit plugin's tests: the stored trail, chains, and the
``buildmax audit`` command run against the test's database."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import sqlalchemy as sa
from buildmax_audit.commands import audit_group
from buildmax_audit.tables import chains, events
from buildmax_hookspecs import SYSTEM_ACTOR
from click.testing import CliRunner, Result

from buildmax.config import Config


async def record_rename(app: Any, tx: Any, space_id: str, name: str) -> None:
    """Record, as the system, one ``space.updated`` event of ``space_id`` in ``tx``."""
    await app.audit.record(
        tx,
        SYSTEM_ACTOR,
        "space.updated",
        space_id=space_id,
        target_type="space",
        target_id=space_id,
        details={"name": name},
    )


async def rename(app: Any, space_id: str, *names: str) -> None:
    """One ``space.updated`` event per name, each in its own transaction."""
    for name in names:
        async with app.db.write() as tx:
            await record_rename(app, tx, space_id, name)


async def trail(app: Any, *conditions: Any) -> list[dict[str, Any]]:
    """Stored audit events (details parsed), in chain and sequence order."""
    async with app.db.read() as conn:
        rows = await conn.fetch_all(
            sa.select(events).where(*conditions).order_by(events.c.chain, events.c.seq)
        )
    return [{**dict(row), "details": json.loads(row["details"])} for row in rows]


async def heads(app: Any) -> dict[str, dict[str, Any]]:
    """Every chain's head row, by chain."""
    async with app.db.read() as conn:
        rows = await conn.fetch_all(sa.select(chains))
    return {row["chain"]: dict(row) for row in rows}


async def tamper(app: Any, statement: Any) -> None:
    """Change the stored trail behind the server's back."""
    async with app.db.write() as tx:
        await tx.execute(statement)


class AuditCli:
    """``buildmax audit ...`` against the test's database."""

    def __init__(self, settings: Config) -> None:
        self.settings = settings

    async def __call__(self, *args: str, expect: int = 0, offline: bool = False) -> Result:
        """Run ``buildmax audit *args`` (in a thread: it runs its own event
        loop); ``offline`` leaves out the database options. Checks the exit
        status."""
        location = ["--data-dir", self.settings.data_dir]
        if self.settings.database_url:
            location = ["--database-url", self.settings.database_url]
        argv = [*args, *([] if offline else location)]
        result = await asyncio.to_thread(CliRunner().invoke, audit_group, argv)
        assert result.exit_code == expect, (result.output, result.exception)
        return result


@pytest.fixture
def audit_cli(app: Any, buildmax_settings: Config) -> AuditCli:
    """Run ``buildmax audit`` commands against the test's (started) app's database."""
    return AuditCli(buildmax_settings)
