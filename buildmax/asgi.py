"""The ASGI entry point Hypercorn workers load: ``buildmax.asgi:served_app()``.

Each worker process builds its app from the environment (``BUILDMAX_*``),
which ``buildmax serve`` fills from its flags and configuration file.
"""

from __future__ import annotations

from . import passwords
from .app import BuildMax, create_app
from .config import apply_log_level, load_config


def served_app() -> BuildMax:
    """An app for a server process: migrations applied at start on SQLite."""
    settings = load_config()
    apply_log_level(settings.log_level)
    passwords.prepare()
    return create_app(settings, auto_migrate=settings.engine == "sqlite")
