"""Compile SQLAlchemy Core statements to SQL text and parameters, cached.

Compiling a statement costs far more than running a primary-key read. Two
caches avoid it:

- a statement built once (at import time) and run with ``params`` for its
  ``bindparam`` placeholders is compiled once, keyed by the object itself;
- any other statement is cached by SQLAlchemy's own cache key (the
  mechanism its engines use), and only its bound values are extracted per
  call. Building a fresh statement per call still costs the key walk, so
  hot paths use the first form.

A statement with an expanding ``IN`` list (``col.in_([...])``) is cached
like any other; its SQL text is expanded for the values of each call, as
SQLAlchemy's engines do. The same compiler serves a named paramstyle
(SQLite's ``:name``, :meth:`StatementCompiler.compile`) and a positional one
(asyncpg's ``$1``, :meth:`StatementCompiler.compile_positional`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.ddl import ExecutableDDLElement

CACHE_SIZE = 2000


def _expands(compiled: Any) -> bool:
    """Whether the SQL text depends on the values (expanding IN lists,
    values rendered literally at execution)."""
    return bool(compiled.post_compile_params or compiled.literal_execute_params)


class Positional(NamedTuple):
    """A statement compiled for a positional paramstyle."""

    sql: str
    args: list[Any]
    #: Values written into the text (``literal_execute``): a text that
    #: recurs rarely, not worth a place among a connection's prepared
    #: statements.
    one_off: bool


class StatementCompiler:
    """Compiles statements for one dialect with bounded LRU caches."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._cache: OrderedDict[Any, Any] = OrderedDict()
        # id(statement) -> (statement, compiled): the statement is kept alive,
        # so its id cannot be reused by another object while cached.
        self._prepared: OrderedDict[int, tuple[ClauseElement, Any]] = OrderedDict()

    def compile(
        self, statement: ClauseElement | str, params: Mapping[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """``(sql, params)`` for a dialect with a named paramstyle."""
        if self.dialect.positional:
            raise TypeError("this dialect is positional: use compile_positional()")
        compiled, values = self._lookup(statement, params)
        if isinstance(compiled, str):
            return compiled, values
        sql, _, values, processors = self._expand(compiled, values)
        if processors:
            values = {k: processors[k](v) if k in processors else v for k, v in values.items()}
        escaped = compiled.escaped_bind_names
        if escaped:
            values = {escaped.get(k, k): v for k, v in values.items()}
        return sql, values

    def compile_positional(
        self, statement: ClauseElement | str, params: Mapping[str, Any] | None = None
    ) -> Positional:
        """The SQL text and arguments for a dialect with a positional
        paramstyle: the values in the order of the placeholders (``$1``,
        ``$2``, ...)."""
        if not self.dialect.positional:
            raise TypeError("this dialect uses named parameters: use compile()")
        compiled, values = self._lookup(statement, params)
        if isinstance(compiled, str):
            return Positional(compiled, [], one_off=False)
        sql, positions, values, processors = self._expand(compiled, values)
        one_off = bool(compiled.literal_execute_params)
        if processors:
            args = [processors[k](values[k]) if k in processors else values[k] for k in positions]
            return Positional(sql, args, one_off)
        return Positional(sql, [values[k] for k in positions], one_off)

    def _lookup(
        self, statement: ClauseElement | str, params: Mapping[str, Any] | None
    ) -> tuple[Any, dict[str, Any]]:
        """The compiled statement and its bound values by unescaped name; for
        DDL, its SQL text and no values."""
        if isinstance(statement, str):
            raise TypeError("pass a SQLAlchemy statement (use sqlalchemy.text() for raw SQL)")
        if isinstance(statement, ExecutableDDLElement):
            return str(statement.compile(dialect=self.dialect)), {}
        if params is not None:
            return self._lookup_prepared(statement, params)
        key = statement._generate_cache_key()
        compiled: Any
        if key is None:
            compiled = statement.compile(dialect=self.dialect)
            return compiled, compiled.construct_params(escape_names=False)
        compiled = self._cache.get(key.key)
        if compiled is None:
            compiled = statement.compile(dialect=self.dialect, cache_key=key)
            self._remember(self._cache, key.key, compiled)
        else:
            self._cache.move_to_end(key.key)
        return compiled, compiled.construct_params(
            extracted_parameters=key.bindparams, escape_names=False
        )

    def _lookup_prepared(
        self, statement: ClauseElement, params: Mapping[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        entry = self._prepared.get(id(statement))
        if entry is None or entry[0] is not statement:
            entry = (statement, statement.compile(dialect=self.dialect))
            self._remember(self._prepared, id(statement), entry)
        else:
            self._prepared.move_to_end(id(statement))
        compiled: Any = entry[1]
        return compiled, compiled.construct_params(dict(params), escape_names=False)

    @staticmethod
    def _expand(
        compiled: Any, values: dict[str, Any]
    ) -> tuple[str, Sequence[str], dict[str, Any], Mapping[str, Any]]:
        """``(sql, positions, values, bind processors)`` for one execution:
        expanding parameters rendered for this call's values."""
        if not _expands(compiled):
            return compiled.string, compiled.positiontup, values, compiled._bind_processors
        state = compiled._process_parameters_for_postcompile(values)
        processors = compiled._bind_processors
        if state.processors:
            processors = {**processors, **state.processors}
        return state.statement, state.positiontup, state.parameters, processors

    @staticmethod
    def _remember(cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
        cache[key] = value
        if len(cache) > CACHE_SIZE:
            cache.popitem(last=False)
