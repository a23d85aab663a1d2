"""Compile SQLAlchemy Core statements to SQL text and parameters, cached.

Compiling a statement costs far more than running a primary-key read on
SQLite. Two caches avoid it:

- a statement built once (at import time) and run with ``params`` for its
  ``bindparam`` placeholders is compiled once, keyed by the object itself;
- any other statement is cached by SQLAlchemy's own cache key (the
  mechanism its engines use), and only its bound values are extracted per
  call. Building a fresh statement per call still costs the key walk, so
  hot paths use the first form.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.ddl import ExecutableDDLElement

CACHE_SIZE = 2000


def _has_post_compile(compiled: Any) -> bool:
    """Whether the SQL text depends on the values (expanding IN lists)."""
    return bool(compiled.post_compile_params)


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
        """``(sql, params)`` for the dialect's named paramstyle."""
        if isinstance(statement, str):
            raise TypeError("pass a SQLAlchemy statement (use sqlalchemy.text() for raw SQL)")
        if isinstance(statement, ExecutableDDLElement):
            return str(statement.compile(dialect=self.dialect)), {}
        if params is not None:
            return self._compile_prepared(statement, params)
        key = statement._generate_cache_key()
        if key is None:
            return self._compile_fresh(statement)
        compiled = self._cache.get(key.key)
        if compiled is None:
            compiled = statement.compile(dialect=self.dialect, cache_key=key)
            if _has_post_compile(compiled):
                # Expanding IN lists change the SQL text per call: not cacheable.
                return self._compile_fresh(statement)
            self._remember(self._cache, key.key, compiled)
        else:
            self._cache.move_to_end(key.key)
        values = dict(compiled.construct_params(extracted_parameters=key.bindparams) or {})
        return compiled.string, self._process(compiled, values)

    def _compile_prepared(
        self, statement: ClauseElement, params: Mapping[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        entry = self._prepared.get(id(statement))
        if entry is None or entry[0] is not statement:
            compiled = statement.compile(dialect=self.dialect)
            if _has_post_compile(compiled):
                fresh = statement.params(**params)
                return self._compile_fresh(fresh)
            entry = (statement, compiled)
            self._remember(self._prepared, id(statement), entry)
        else:
            self._prepared.move_to_end(id(statement))
        compiled = entry[1]
        return compiled.string, self._process(
            compiled, dict(compiled.construct_params(dict(params)) or {})
        )

    @staticmethod
    def _remember(cache: OrderedDict[Any, Any], key: Any, value: Any) -> None:
        cache[key] = value
        if len(cache) > CACHE_SIZE:
            cache.popitem(last=False)

    def _compile_fresh(self, statement: ClauseElement) -> tuple[str, dict[str, Any]]:
        compiled = statement.compile(
            dialect=self.dialect, compile_kwargs={"render_postcompile": True}
        )
        return compiled.string, self._process(compiled, dict(compiled.construct_params() or {}))

    @staticmethod
    def _process(compiled: Any, params: dict[str, Any]) -> dict[str, Any]:
        processors = compiled._bind_processors
        if not processors:
            return params
        return {k: processors[k](v) if k in processors else v for k, v in params.items()}
