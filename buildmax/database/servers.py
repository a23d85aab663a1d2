"""Administration of a PostgreSQL server: databases created and dropped
whole (test runs, qualification runs, benchmarks)."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

from .base import DatabaseError


def database_url(server_url: str, name: str) -> str:
    """``server_url`` pointed at database ``name``."""
    parts = urlsplit(server_url)
    return urlunsplit(parts._replace(path="/" + name))


async def administer(server_url: str, statements: list[str]) -> list[object]:
    """Run ``statements`` one by one outside a transaction on ``server_url``;
    the first value each returns. ``DatabaseError`` when the server cannot
    be reached or refuses a statement."""
    import asyncpg

    try:
        conn = await asyncpg.connect(
            server_url.replace("postgresql://", "postgres://", 1), timeout=10
        )
    except Exception as exc:
        raise DatabaseError(f"cannot reach PostgreSQL: {exc}") from exc
    values = []
    try:
        for statement in statements:
            try:
                values.append(await conn.fetchval(statement))
            except asyncpg.PostgresError as exc:  # no right, a busy template, a name taken
                raise DatabaseError(f"{statement}: {exc}") from exc
    finally:
        await conn.close()
    return values


async def create_database(server_url: str, name: str, template: str | None = None) -> str:
    """Create database ``name`` (a copy of ``template`` when given); its URL."""
    suffix = f' TEMPLATE "{template}"' if template else ""
    await administer(server_url, [f'CREATE DATABASE "{name}"{suffix}'])
    return database_url(server_url, name)


async def drop_database(server_url: str, name: str) -> None:
    """Drop database ``name``, disconnecting whoever is still on it."""
    await administer(server_url, [f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'])
