"""Server configuration: defaults, a TOML file, ``BUILDMAX_*`` variables.

Precedence, lowest first: built-in defaults, the TOML file (``--config`` or
``BUILDMAX_CONFIG``), environment variables, command-line flags. Every key
is documented in ``docs/configuration.md``.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

from buildmax_hookspecs import App

ENV_PREFIX = "BUILDMAX_"

#: The values of ``log_format``.
LOG_FORMATS = ("text", "json")


class ConfigError(Exception):
    """A configuration value is missing, unknown or of the wrong type."""


@dataclass(frozen=True)
class Config:
    """Every setting of a BuildMax server, with its default."""

    #: Folder of the embedded default: ``buildmax.db`` and ``blobs/``.
    data_dir: str = "./buildmax-data"
    #: ``postgresql://...`` switches to PostgreSQL; empty means SQLite in data_dir.
    database_url: str = ""
    #: Where blobs live; empty means ``file://<data_dir>/blobs``.
    blob_store_url: str = ""
    #: Where ``buildmax backup create`` writes backups (one folder each,
    #: their blobs shared under ``blobs/``).
    backup_dir: str = "./buildmax-backups"
    #: Folder of PostgreSQL's ``pg_dump``/``pg_restore``; empty: the PATH.
    pg_bin_dir: str = ""
    host: str = "127.0.0.1"
    port: int = 8420
    workers: int = 1
    #: Largest JSON request body, in bytes; refused with 413 before it is read.
    max_body_bytes: int = 1024 * 1024
    page_size_default: int = 50
    page_size_max: int = 200
    #: How long an idempotency receipt answers a repeated request.
    idempotency_ttl_seconds: int = 24 * 3600
    #: A token's last-used time is written at most this often.
    token_touch_interval_seconds: int = 60
    #: Lifetime of a token minted by password sign-in.
    session_ttl_seconds: int = 7 * 24 * 3600
    #: Failed sign-ins allowed per principal name, and per client address, per window.
    sign_in_max_failures_per_name: int = 5
    sign_in_max_failures_per_address: int = 20
    sign_in_window_seconds: int = 15 * 60
    #: Reader threads of the SQLite engine for long (background) reads; short
    #: reads run on the event loop's connection and the writer is always one.
    sqlite_readers: int = 2
    #: The SQLite write-ahead log is cut back to this size each time it starts over.
    sqlite_wal_soft_limit_bytes: int = 64 * 1024 * 1024
    #: Past this size of SQLite write-ahead log, writes are refused (503) until
    #: the reader that holds an old snapshot lets go.
    sqlite_wal_hard_limit_bytes: int = 1024 * 1024 * 1024
    #: Pool bounds of the PostgreSQL engine (write transactions and long reads).
    pg_pool_min: int = 2
    pg_pool_max: int = 10
    #: PostgreSQL connections kept open for short reads, apart from that pool:
    #: a read never waits while writers hold every connection of the pool.
    pg_read_pool: int = 3
    #: Seconds in-flight requests get to finish after SIGTERM.
    shutdown_grace_seconds: int = 10
    #: Free bytes kept on the disks of the data directory and a file blob
    #: store: an upload or a publish that would go below is refused (507).
    min_free_bytes: int = 512 * 1024 * 1024
    #: Comma-separated addresses or networks (CIDR) of reverse proxies whose
    #: ``X-Forwarded-For`` / ``Forwarded`` headers name the client; empty:
    #: the connection's address is the client's, and such headers are ignored.
    trusted_proxies: str = ""
    #: Serve ``/metrics`` (to a ``metrics``-scoped token) and count requests.
    metrics: bool = True
    #: A backup older than this is stale (an attention item; 26 hours suits
    #: the nightly timer).
    backup_stale_seconds: int = 26 * 3600
    #: Seconds between keep-alive comments on an idle event stream.
    events_keepalive_seconds: int = 15
    #: A broken plugin aborts start-up instead of being skipped.
    strict_plugins: bool = False
    #: Comma-separated allow-list of entry-point plugins; ``None`` loads all, "" none.
    load_plugins: str | None = None
    #: Log every hook call.
    trace_plugins: bool = False
    log_level: str = "info"
    #: ``text`` (one readable line per record) or ``json`` (one JSON object
    #: per line, for log shippers).
    log_format: str = "text"
    #: Per-plugin settings, from ``[plugins.<name>]`` tables in the TOML file.
    plugins: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def data_path(self) -> Path:
        """The data directory as an absolute path."""
        return Path(self.data_dir).expanduser().resolve()

    @property
    def engine(self) -> str:
        """``"postgresql"`` or ``"sqlite"``."""
        url = self.database_url
        return "postgresql" if url.startswith(("postgresql:", "postgres:")) else "sqlite"

    @property
    def effective_database_url(self) -> str:
        """The database URL, defaulting to ``sqlite:///<data_dir>/buildmax.db``."""
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_path / 'buildmax.db'}"

    @property
    def effective_blob_store_url(self) -> str:
        """The blob store URL, defaulting to ``file://<data_dir>/blobs``."""
        return self.blob_store_url or (self.data_path / "blobs").as_uri()

    @property
    def plugin_allow_list(self) -> set[str] | None:
        """Names from ``load_plugins``, or ``None`` when every plugin loads."""
        if self.load_plugins is None:
            return None
        return {name.strip() for name in self.load_plugins.split(",") if name.strip()}

    def replace(self, **changes: Any) -> Config:
        """A copy with ``changes`` applied (``None`` values are ignored)."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})


def _coerce(name: str, kind: Any, raw: Any) -> Any:
    """Turn a TOML or environment value into the field's type."""
    if kind in (bool, "bool"):
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off", ""):
            return False
        raise ConfigError(f"{name}: expected true or false, got {raw!r}")
    if kind in (int, "int"):
        if isinstance(raw, (bool, float)):
            raise ConfigError(f"{name}: expected an integer, got {raw!r}")
        try:
            return int(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: expected an integer, got {raw!r}") from None
    if isinstance(raw, (dict, list)):
        raise ConfigError(f"{name}: expected a string, got {type(raw).__name__}")
    return str(raw)


def _field_types() -> dict[str, Any]:
    hints = get_type_hints(Config)
    types: dict[str, Any] = {}
    for f in dataclasses.fields(Config):
        hint = hints[f.name]
        if hint is bool:
            types[f.name] = bool
        elif hint is int:
            types[f.name] = int
        else:
            types[f.name] = str
    return types


def load_config(
    path: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    **overrides: Any,
) -> Config:
    """Build the configuration from the TOML file, the environment and overrides.

    ``path`` defaults to ``$BUILDMAX_CONFIG``; a missing named file is an
    error. Unknown keys in the file are an error, so a typo is not ignored.
    """
    env = os.environ if environ is None else environ
    types = _field_types()
    values: dict[str, Any] = {}
    config_path = path or env.get(f"{ENV_PREFIX}CONFIG")
    if config_path:
        try:
            with open(config_path, "rb") as fh:
                data = tomllib.load(fh)
        except FileNotFoundError:
            raise ConfigError(f"configuration file not found: {config_path}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{config_path}: not valid TOML: {exc}") from None
        for key, raw in data.items():
            if key == "plugins":
                if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
                    raise ConfigError("plugins: expected a table of [plugins.<name>] tables")
                values["plugins"] = raw
                continue
            if key not in types:
                raise ConfigError(f"{config_path}: unknown setting {key!r}")
            values[key] = _coerce(key, types[key], raw)
    for key, kind in types.items():
        if key == "plugins":
            continue
        env_name = ENV_PREFIX + key.upper()
        if env_name in env:
            values[key] = _coerce(env_name, kind, env[env_name])
    for key, raw in overrides.items():
        if raw is None:
            continue
        if key not in types:
            raise ConfigError(f"unknown setting {key!r}")
        values[key] = raw if key == "plugins" else _coerce(key, types[key], raw)
    config = Config(**values)
    _validate(config)
    return config


def _validate(config: Config) -> None:
    if config.workers < 1:
        raise ConfigError("workers must be at least 1")
    if config.max_body_bytes < 1024:
        raise ConfigError("max_body_bytes must be at least 1024")
    if not 1 <= config.page_size_default <= config.page_size_max:
        raise ConfigError("page_size_default must be between 1 and page_size_max")
    if config.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ConfigError(
            f"log_level must be debug, info, warning, error or critical, got {config.log_level!r}"
        )
    if config.log_format not in LOG_FORMATS:
        raise ConfigError(f"log_format must be text or json, got {config.log_format!r}")
    if config.min_free_bytes < 0:
        raise ConfigError("min_free_bytes must be at least 0")
    if config.backup_stale_seconds < 60:
        raise ConfigError("backup_stale_seconds must be at least 60")
    if config.shutdown_grace_seconds < 0:
        raise ConfigError("shutdown_grace_seconds must be at least 0")
    _check_trusted_proxies(config.trusted_proxies)
    if config.events_keepalive_seconds < 1:
        raise ConfigError("events_keepalive_seconds must be at least 1")
    if not 1 <= config.pg_pool_min <= config.pg_pool_max:
        raise ConfigError("pg_pool_min must be at least 1 and at most pg_pool_max")
    if config.pg_read_pool < 1:
        raise ConfigError("pg_read_pool must be at least 1")
    if config.sqlite_readers < 1:
        raise ConfigError("sqlite_readers must be at least 1")
    if config.sqlite_wal_soft_limit_bytes < 0:
        raise ConfigError("sqlite_wal_soft_limit_bytes must be at least 0")
    if config.sqlite_wal_hard_limit_bytes < 2 * max(config.sqlite_wal_soft_limit_bytes, 1 << 20):
        raise ConfigError(
            "sqlite_wal_hard_limit_bytes must be at least twice sqlite_wal_soft_limit_bytes "
            "and at least 2 MiB"
        )
    url = config.database_url
    if url and config.engine == "sqlite" and not url.startswith("sqlite:///"):
        raise ConfigError(f"database_url must be postgresql://... or sqlite:///<path>, got {url!r}")


def _check_trusted_proxies(value: str) -> None:
    from .addresses import parse_networks

    try:
        parse_networks(value)
    except ValueError as exc:
        raise ConfigError(f"trusted_proxies: {exc}") from None


S = TypeVar("S")


def integer_settings(cls: type[S], plugin: str, raw: Mapping[str, Any], *, minimum: int) -> S:
    """A plugin's settings dataclass of integers from its ``[plugins.<plugin>]``
    table: an unknown key, or a value that is not an integer of at least
    ``minimum``, is a :class:`ConfigError` naming the table and key."""
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"[plugins.{plugin}]: unknown setting(s) {', '.join(unknown)}")
    for key, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(
                f"[plugins.{plugin}] {key}: expected an integer of at least {minimum}"
            )
    return cls(**raw)


def plugin_settings(app: App, plugin: str, parse: Callable[[Mapping[str, Any]], S]) -> S:
    """``app``'s ``[plugins.<plugin>]`` table parsed by ``parse``, once: the
    result is kept on the app."""
    key = f"{plugin}.settings"
    cached = app.extensions.get(key)
    if cached is None:
        cached = parse(app.settings.plugins.get(plugin, {}))
        app.extensions[key] = cached
    return cached
