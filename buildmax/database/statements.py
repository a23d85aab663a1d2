"""Compile SQLAlchemy Core statements to SQL text and parameters, cached.

Compiling a statement costs far more than running a primary-key read on
SQLite, so compiled forms are cached by SQLAlchemy's own cache key (the
mechanism its engines use); only the bound values are extracted per call.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.ddl import ExecutableDDLElement

CACHE_SIZE = 2000


class StatementCompiler:
    """Compiles statements for one dialect with a bounded LRU cache."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect
        self._cache: OrderedDict[Any, Any] = OrderedDict()

    def compile(self, statement: ClauseElement | str) -> tuple[str, dict[str, Any]]:
        """``(sql, params)`` for the dialect's named paramstyle."""
        if isinstance(statement, str):
            raise TypeError("pass a SQLAlchemy statement (use sqlalchemy.text() for raw SQL)")
        if isinstance(statement, ExecutableDDLElement):
            return str(statement.compile(dialect=self.dialect)), {}
        key = statement._generate_cache_key()
        if key is None:
            return self._compile_fresh(statement)
        compiled = self._cache.get(key.key)
        if compiled is None:
            compiled = statement.compile(dialect=self.dialect, cache_key=key)
            if compiled.post_compile_params:
                # Expanding IN lists change the SQL text per call: not cacheable.
                return self._compile_fresh(statement)
            self._cache[key.key] = compiled
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key.key)
        params = compiled.construct_params(extracted_parameters=key.bindparams)
        return compiled.string, self._process(compiled, params)

    def _compile_fresh(self, statement: ClauseElement) -> tuple[str, dict[str, Any]]:
        compiled = statement.compile(
            dialect=self.dialect, compile_kwargs={"render_postcompile": True}
        )
        return compiled.string, self._process(compiled, compiled.construct_params())

    @staticmethod
    def _process(compiled: Any, params: dict[str, Any]) -> dict[str, Any]:
        processors = compiled._bind_processors
        if not processors:
            return params
        return {k: processors[k](v) if k in processors else v for k, v in params.items()}
