"""The app of a server process: :func:`served_app` (``buildmax.serving``
calls it in each worker; ``hypercorn buildmax.asgi:served_app()`` works too).

Each worker process builds its app from the environment (``BUILDMAX_*``),
which ``buildmax serve`` fills from its flags and configuration file.
"""

from __future__ import annotations

from . import passwords
from .app import BuildMax, create_app
from .config import load_config
from .logs import configure_logging


def served_app() -> BuildMax:
    """An app for a server process: migrations applied at start on SQLite."""
    settings = load_config()
    configure_logging(settings.log_level, settings.log_format)
    passwords.prepare()
    return create_app(settings, auto_migrate=settings.engine == "sqlite")
