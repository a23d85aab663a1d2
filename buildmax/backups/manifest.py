"""A backup's manifest: what it holds and how to check it.

``manifest.json`` names the engine, the BuildMax and plugin versions, the
migrations applied per plugin, the row count of every table, each part's
size and sha256 (the database dump and the blob list), the blobs' count and
bytes (and the keys the blob store had lost before the backup), every
plugin's facts (the audit chains' heads) and the moment of the snapshot.
The blob list, ``blobs.jsonl``, has one ``{"key", "size", "sha256"}`` per
line. A restore's audit event names the manifest's own sha256.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .layout import BLOB_LIST, MANIFEST, BackupError

FORMAT = "buildmax-backup/1"


@dataclass(frozen=True)
class Part:
    """One file of a backup, with its size and sha256."""

    size: int
    sha256: str


@dataclass(frozen=True)
class ListedBlob:
    """One blob a backup references: its key in the blob store, size and digest."""

    key: str
    size: int
    sha256: str


@dataclass
class Manifest:
    """Everything ``manifest.json`` says (see the module docstring)."""

    engine: str
    created_at: int
    versions: dict[str, str]
    migrations: dict[str, int]
    row_counts: dict[str, int]
    parts: dict[str, Part]
    blob_count: int
    blob_bytes: int
    missing_blobs: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    format: str = FORMAT

    def to_json(self) -> bytes:
        """The manifest as written: indented, keys sorted."""
        body = asdict(self)
        return (json.dumps(body, indent=2, sort_keys=True) + "\n").encode()

    @property
    def plugin_facts(self) -> dict[str, Mapping[str, Any]]:
        """The facts recorded by each plugin, by plugin name."""
        return {k: v for k, v in self.facts.items() if isinstance(v, Mapping)}

    @property
    def database_part(self) -> str:
        """The name of the database dump among the parts."""
        return next(name for name in self.parts if name.startswith("database."))


def _require(body: Mapping[str, Any], key: str, kind: type | tuple[type, ...]) -> Any:
    value = body.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise BackupError(f"{MANIFEST}: {key!r} is missing or not a {_kind_name(kind)}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(
        {dict: "object", list: "list", str: "string", int: "number"}[k] for k in kinds
    )


def _counts(body: Mapping[str, Any], key: str) -> dict[str, int]:
    value = _require(body, key, dict)
    if not all(isinstance(k, str) and type(v) is int and v >= 0 for k, v in value.items()):
        raise BackupError(f"{MANIFEST}: {key!r} must map names to counts")
    return dict(value)


def read_manifest(folder: Path) -> tuple[Manifest, bytes]:
    """The manifest of the backup in ``folder`` and its exact bytes;
    :class:`BackupError` naming what is wrong with it."""
    path = folder / MANIFEST
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise BackupError(f"{folder} is not a backup: it has no {MANIFEST}") from None
    except OSError as exc:
        raise BackupError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        body = json.loads(raw)
    except ValueError:
        raise BackupError(f"{path} is not JSON (truncated or damaged)") from None
    if not isinstance(body, dict):
        raise BackupError(f"{path} is not a JSON object")
    if body.get("format") != FORMAT:
        raise BackupError(
            f"{path} has format {body.get('format')!r}; this BuildMax reads {FORMAT!r}"
        )
    engine = _require(body, "engine", str)
    if engine not in ("sqlite", "postgresql"):
        raise BackupError(f"{MANIFEST}: unknown engine {engine!r}")
    parts: dict[str, Part] = {}
    for name, part in _require(body, "parts", dict).items():
        if (
            not isinstance(part, dict)
            or type(part.get("size")) is not int
            or not isinstance(part.get("sha256"), str)
            or "/" in name
            or name.startswith(".")
        ):
            raise BackupError(f"{MANIFEST}: part {name!r} is malformed")
        parts[name] = Part(part["size"], part["sha256"])
    if BLOB_LIST not in parts or not any(n.startswith("database.") for n in parts):
        raise BackupError(f"{MANIFEST}: the database dump or the blob list is not among its parts")
    missing = _require(body, "missing_blobs", list)
    if not all(isinstance(key, str) for key in missing):
        raise BackupError(f"{MANIFEST}: 'missing_blobs' must list keys")
    manifest = Manifest(
        engine=engine,
        created_at=_require(body, "created_at", int),
        versions={str(k): str(v) for k, v in _require(body, "versions", dict).items()},
        migrations=_counts(body, "migrations"),
        row_counts=_counts(body, "row_counts"),
        parts=parts,
        blob_count=_require(body, "blob_count", int),
        blob_bytes=_require(body, "blob_bytes", int),
        missing_blobs=list(missing),
        facts=_require(body, "facts", dict),
    )
    return manifest, raw


def listed_blobs(path: Path) -> Iterator[ListedBlob]:
    """The blobs of a blob list, one line at a time."""
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            try:
                item = json.loads(line)
                blob = ListedBlob(str(item["key"]), int(item["size"]), str(item["sha256"]))
            except (ValueError, KeyError, TypeError):
                raise BackupError(f"{path.name} line {number} is not a blob entry") from None
            yield blob


def blob_line(blob: ListedBlob) -> bytes:
    """One line of a blob list."""
    return (json.dumps(asdict(blob), sort_keys=True, separators=(",", ":")) + "\n").encode()
