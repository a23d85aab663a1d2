"""Rebuilding lesson search: the index made again from the lessons'
current revisions (maintenance; the index is kept with every change and
never holds anything the lessons do not), and ``buildmax lesson reindex``,
which runs it on the server's machine."""

from __future__ import annotations

import click
import sqlalchemy as sa
from buildmax_hookspecs import App, Transaction

from buildmax.commands.server import (
    config_option,
    data_dir_option,
    database_option,
    load_settings,
    with_app,
)

from .tables import CURRENT_REVISION, SEARCH, lessons, revisions

#: Every lesson's key, space, and current title and text: what the index holds.
_INDEXED = sa.select(
    lessons.c.id, lessons.c.space_id, revisions.c.title, revisions.c.text
).select_from(
    lessons.join(
        revisions,
        CURRENT_REVISION,
    )
)


async def rebuild(tx: Transaction) -> int:
    """Empty the index and index every lesson again; how many it holds now."""
    await SEARCH.clear(tx)
    await SEARCH.fill(tx, _INDEXED)
    count = await tx.fetch_val(sa.select(sa.func.count()).select_from(sa.table(SEARCH.name)))
    return int(count)


@click.command("reindex")
@config_option
@data_dir_option
@database_option
def reindex_command(
    config_path: str | None, data_dir: str | None, database_url: str | None
) -> None:
    """Rebuild lesson search from the lessons (on the server's machine: it
    reads the database directly, like `buildmax db`).

    Empties the search index and indexes every lesson's current title and
    text again, in one transaction: searches see the old index until it
    commits. Maintenance only: the index is kept with every change.
    """
    settings = load_settings(config_path, data_dir=data_dir, database_url=database_url)

    async def work(app: App) -> int:
        async with app.db.write() as tx:
            return await rebuild(tx)

    indexed = with_app(settings, work, schema_of=("lessons",))
    click.echo(f"Indexed {indexed} lesson(s) for search.")
