"""Statements through the engines' compile cache: compiled once, values
bound per call, IN lists expanded per call, values round-tripped as the
driver returns them. Written for PostgreSQL (asyncpg's ``$n`` form); every
test also holds on SQLite."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.schema import CreateIndex, CreateTable

metadata = sa.MetaData()
parents = sa.Table(
    "test_stmt_parents",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("big", sa.BigInteger, nullable=False),
    sa.Column("code", sa.String(20), nullable=False, unique=True),
)
children = sa.Table(
    "test_stmt_children",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("parent_id", sa.Integer, sa.ForeignKey("test_stmt_parents.id"), nullable=False),
    sa.Column("payload", sa.LargeBinary, nullable=True),
    sa.Column("state", sa.Text, nullable=False),
)
children_by_state = sa.Index("test_stmt_children_state", children.c.state, children.c.parent_id)

BIG = 2**53 + 7

#: Built once and run with ``params``: the engines compile it once.
_CHILDREN_OF = (
    sa.select(parents.c.name, parents.c.big, children.c.id, children.c.payload)
    .select_from(parents.join(children, children.c.parent_id == parents.c.id))
    .where(parents.c.id == sa.bindparam("parent"), children.c.state == sa.bindparam("state"))
    .order_by(children.c.id)
)
_PARENTS_IN = (
    sa.select(parents.c.id)
    .where(parents.c.id.in_(sa.bindparam("ids", expanding=True)))
    .order_by(parents.c.id)
)


@pytest.fixture
async def db(app: Any) -> Any:
    async with app.db.write() as tx:
        await tx.execute(CreateTable(parents))
        await tx.execute(CreateTable(children))
        await tx.execute(CreateIndex(children_by_state))
        for i in range(1, 6):
            await tx.execute(parents.insert().values(id=i, name=f"p{i}", big=BIG * i, code=f"c{i}"))
            await tx.execute(
                children.insert().values(
                    id=10 * i, parent_id=i, payload=bytes([0, i, 255]), state="ready"
                )
            )
            await tx.execute(
                children.insert().values(id=10 * i + 1, parent_id=i, payload=None, state="done")
            )
    return app.db


@pytest.fixture
def compiles(db: Any) -> Iterator[list[Any]]:
    """Every statement the engine's compiler compiles while the test runs."""
    dialect = db._compiler.dialect
    original = dialect.statement_compiler
    seen: list[Any] = []

    def counting(dialect_: Any, statement: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(statement)
        return original(dialect_, statement, *args, **kwargs)

    dialect.statement_compiler = counting
    try:
        yield seen
    finally:
        dialect.statement_compiler = original


async def test_a_prebuilt_statement_is_compiled_once_and_binds_each_call(db, compiles):
    for parent in (1, 2, 3, 2):
        async with db.read() as conn:
            rows = await conn.fetch_all(_CHILDREN_OF, {"parent": parent, "state": "ready"})
        assert rows == [
            {
                "name": f"p{parent}",
                "big": BIG * parent,
                "id": 10 * parent,
                "payload": bytes([0, parent, 255]),
            }
        ]
    async with db.write() as tx:
        rows = await tx.fetch_all(_CHILDREN_OF, {"parent": 4, "state": "done"})
    assert rows == [{"name": "p4", "big": BIG * 4, "id": 41, "payload": None}]
    assert len(compiles) == 1


async def test_a_statement_built_per_call_is_compiled_once_per_shape(db, compiles):
    for parent in (1, 5, 3):
        async with db.read() as conn:
            name = await conn.fetch_val(sa.select(parents.c.name).where(parents.c.id == parent))
        assert name == f"p{parent}"
    assert len(compiles) == 1


@pytest.mark.parametrize("prebuilt", [True, False])
async def test_in_lists_of_every_length_return_the_right_rows(db, compiles, prebuilt):
    """An expanding IN list changes the SQL text per call; the statement is
    still compiled once and each call's text has as many placeholders as
    values (an empty list matches nothing; NOT IN of it matches everything)."""
    for ids in ([], [3], [5, 1], [4, 2, 99, 3], list(range(1, 40))):
        expected = sorted(i for i in ids if 1 <= i <= 5)
        async with db.read() as conn:
            if prebuilt:
                rows = await conn.fetch_all(_PARENTS_IN, {"ids": ids})
            else:
                rows = await conn.fetch_all(
                    sa.select(parents.c.id).where(parents.c.id.in_(ids)).order_by(parents.c.id)
                )
            rest = await conn.fetch_all(
                sa.select(parents.c.id)
                .where(parents.c.id.not_in(ids), parents.c.name != "p9")
                .order_by(parents.c.id)
            )
        assert [r["id"] for r in rows] == expected
        assert [r["id"] for r in rest] == [i for i in range(1, 6) if i not in expected]
    assert len(compiles) == 2


async def test_values_come_back_as_the_driver_returns_them(db):
    """LargeBinary as bytes, BigInteger beyond 32 and 53 bits as int, NULL as None."""
    async with db.write() as tx:
        inserted = await tx.fetch_one(
            children.insert()
            .values(id=99, parent_id=2, payload=b"\x00\xff" * 1000, state="new")
            .returning(children.c.id, children.c.payload)
        )
    assert inserted == {"id": 99, "payload": b"\x00\xff" * 1000}
    async with db.read() as conn:
        row = await conn.fetch_one(
            sa.select(parents.c.big, children.c.payload, children.c.state)
            .join(children, children.c.parent_id == parents.c.id)
            .where(children.c.id == 99)
        )
        missing = await conn.fetch_val(sa.select(children.c.payload).where(children.c.id == 21))
    assert row == {"big": BIG * 2, "payload": b"\x00\xff" * 1000, "state": "new"}
    assert type(row["big"]) is int and type(row["payload"]) is bytes
    assert missing is None


async def test_a_label_repeated_in_a_select_keeps_its_last_value(db):
    """SQLAlchemy renames a repeated column name; a label repeated on purpose
    keeps the last column's value, on both engines."""
    joined = parents.join(children, children.c.parent_id == parents.c.id)
    async with db.read() as conn:
        renamed = await conn.fetch_one(
            sa.select(parents.c.id, children.c.id).select_from(joined).where(children.c.id == 31)
        )
        repeated = await conn.fetch_one(
            sa.select(parents.c.id.label("x"), children.c.id.label("x"))
            .select_from(joined)
            .where(children.c.id == 31)
        )
    assert renamed == {"id": 3, "id_1": 31}
    assert repeated == {"x": 31}


async def test_text_statements_bind_by_name_and_keep_percent_signs(db):
    async with db.read() as conn:
        value = await conn.fetch_val(
            sa.text("SELECT name || '%' || :suffix AS v FROM test_stmt_parents WHERE id = :id"),
            {"suffix": "s", "id": 2},
        )
        like = await conn.fetch_all(
            sa.select(parents.c.id).where(parents.c.name.like("p%")).order_by(parents.c.id)
        )
    assert value == "p2%s"
    assert [r["id"] for r in like] == [1, 2, 3, 4, 5]


async def test_one_value_used_twice_binds_once(db):
    edge = sa.bindparam("edge")
    statement = (
        sa.select(parents.c.id)
        .where(sa.or_(parents.c.id == edge, parents.c.id == edge + 1))
        .order_by(parents.c.id)
    )
    async with db.read() as conn:
        rows = await conn.fetch_all(statement, {"edge": 3})
    assert [r["id"] for r in rows] == [3, 4]


async def test_a_recursive_cte_and_row_locks(db):
    chain = sa.select(parents.c.id.label("n")).where(parents.c.id == 1).cte("chain", recursive=True)
    chain = chain.union_all(sa.select((chain.c.n + 1).label("n")).where(chain.c.n < 4))
    async with db.write() as tx:
        numbers = await tx.fetch_all(sa.select(chain.c.n).order_by(chain.c.n))
        locked = await tx.fetch_all(
            sa.select(children.c.id)
            .where(children.c.state == "ready")
            .order_by(children.c.id)
            .limit(2)
            .with_for_update(skip_locked=db.dialect == "postgresql")
        )
    assert [r["n"] for r in numbers] == [1, 2, 3, 4]
    assert [r["id"] for r in locked] == [10, 20]


async def test_a_unique_violation_reaches_the_caller_and_rolls_back(db):
    with pytest.raises(Exception) as refused:
        async with db.write() as tx:
            await tx.execute(parents.update().where(parents.c.id == 1).values(name="renamed"))
            await tx.execute(parents.insert().values(id=6, name="p6", big=1, code="c2"))
    assert "unique" in str(refused.value).lower()
    async with db.read() as conn:
        assert await conn.fetch_val(sa.select(parents.c.name).where(parents.c.id == 1)) == "p1"
        assert await conn.fetch_val(sa.select(sa.func.count()).select_from(parents)) == 5


@pytest.mark.postgres_only
async def test_postgres_functions_and_set_local(db):
    async with db.write() as tx:
        await tx.execute(sa.text("SET LOCAL enable_seqscan = off"))
        setting = await tx.fetch_val(sa.text("SHOW enable_seqscan"))
        await tx.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.bindparam("key"))), {"key": 7})
        await tx.execute(sa.select(sa.func.pg_notify("test_stmt", "hello")))
    assert setting == "off"


async def test_one_statement_per_call(db):
    """Several statements in one text are refused (asyncpg's extended
    protocol, SQLite's execute), with or without parameters."""
    for params in (None, {"id": 1}):
        with pytest.raises(Exception) as refused:
            async with db.write() as tx:
                await tx.execute(
                    sa.text("UPDATE test_stmt_parents SET name = 'x'; SELECT 1"), params
                )
        message = str(refused.value)
        assert "multiple commands" in message or "one statement at a time" in message
    async with db.read() as conn:
        assert await conn.fetch_val(sa.select(parents.c.name).where(parents.c.id == 1)) == "p1"


async def test_concurrent_statements_on_one_transaction_take_turns(db):
    async with db.write() as tx:
        results = await asyncio.gather(
            *(tx.fetch_all(_CHILDREN_OF, {"parent": i, "state": "ready"}) for i in range(1, 6)),
            tx.execute(parents.update().where(parents.c.id == 5).values(name="five")),
        )
    assert [rows[0]["id"] for rows in results[:5]] == [10, 20, 30, 40, 50]
    async with db.read() as conn:
        assert await conn.fetch_val(sa.select(parents.c.name).where(parents.c.id == 5)) == "five"
