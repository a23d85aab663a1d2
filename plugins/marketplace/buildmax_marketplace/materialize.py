"""Materializing a run: the exact pinned packages, verified, under a home.

``materialize(client, attempt_id, home)`` asks the server for the attempt's
pins (with the run token), downloads each package, checks its sha256
before reading it, extracts it with the hardened reader into
``<home>/plugins/<name>/`` and writes ``<home>/plugins/environment.lock``
(``name version sha256`` per line). Everything is built in a staging
directory next to ``<home>/plugins`` and renamed into place at the end: a
package that fails verification or inspection leaves no ``plugins``
directory at all.

Nothing the server sends is trusted: the listing must have the expected
shape and size, every pin a plugin name (one path segment), a normalised PEP 440
version, a lowercase hex sha256 and a package URL on the client's own
server (the run token goes nowhere else), and no name twice. The limits the
server advertises can only tighten the worker's own, and no download may be
larger than an archive within those limits. Anything else is a
:class:`MaterializationFailed` before a byte is written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from packaging.version import InvalidVersion, Version

from buildmax.client import BuildMaxError, Client, ForeignOrigin, IncompleteDownload

from .package import (
    CHUNK,
    DEFAULT_LIMITS,
    MAX_VERSION,
    Limits,
    PackageRefused,
    extract,
    is_plugin_name,
)

#: Most pins a listing may hold (an agent names at most 50 plugins).
MAX_PINS = 50
#: Longest package URL accepted from the server.
MAX_URL = 2048
#: Largest listing of pins read (50 pins take a few kilobytes).
MAX_LISTING_BYTES = 1024 * 1024
#: Room for an archive's headers beyond its extracted bytes, per entry:
#: no archive within the limits is larger, so no download may be either.
HEADER_ROOM = 4096
_SHA256 = re.compile(r"^[0-9a-f]{64}\Z")


#: Why a materialization failed: each code and what it means. A worker
#: reports the code to the server (``buildmax run materialize`` does), which
#: counts and lists failures by it; the words stay with the worker.
REASONS = {
    "listing": "the server's listing of pins (or its limits) was refused",
    "download": "a package could not be downloaded in full",
    "digest": "a package's bytes did not have the pinned sha256",
    "package": "a package was refused by the hardened reader or named another release",
    "server": "the server refused to list the pins",
    "local": "the worker's own disk or home (it exists already, or cannot be written)",
}


class MaterializationFailed(Exception):
    """A pinned package could not be verified or extracted, or the server's
    answer was not one to trust; nothing was placed. ``reason`` is one of
    :data:`REASONS`."""

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        if reason not in REASONS:
            raise ValueError(f"no such materialization failure reason: {reason!r}")
        self.reason = reason


@dataclass(frozen=True)
class Materialized:
    """What was placed: the pins, the lock file, and the environment
    variables the packages read that are not set here."""

    pins: list[dict[str, Any]]
    lock: Path
    unset_environment: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Pin:
    """A pin of the listing, every field checked."""

    name: str
    version: str
    sha256: str
    package_url: str


def materialize(
    client: Client, attempt_id: str, home: Path, limits: Limits | None = None
) -> Materialized:
    """Download, verify and extract an attempt's pinned packages under
    ``home/plugins`` (which must not exist yet); all or nothing. ``limits``
    are this worker's own (default :data:`DEFAULT_LIMITS`); the server's
    advertised limits apply only where they are stricter."""
    listing = read_listing(client, attempt_id)
    pins = _pins(client, listing.get("pins"))
    limits = _stricter_limits(limits or DEFAULT_LIMITS, listing.get("limits"))
    target = home / "plugins"
    if target.exists() or target.is_symlink():
        raise MaterializationFailed(
            f"{target} exists already; materialize into a fresh home", reason="local"
        )
    home.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".plugins-", dir=home))
    unset: dict[str, list[str]] = {}
    try:
        for pin in pins:
            package = _fetch(client, pin, staging, limits)
            missing = [name for name in package.report["environment"] if name not in os.environ]
            if missing:
                unset[pin.name] = missing
        lock = staging / "environment.lock"
        lock.write_text(
            "".join(f"{p.name} {p.version} {p.sha256}\n" for p in pins), encoding="utf-8"
        )
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Materialized([dataclasses.asdict(p) for p in pins], target / "environment.lock", unset)


def read_listing(client: Client, attempt_id: str) -> dict[str, Any]:
    """The server's listing of the attempt's pins: a JSON object of at most
    :data:`MAX_LISTING_BYTES` (read no further), else
    :class:`MaterializationFailed`."""
    path = f"/v1/attempts/{quote(attempt_id, safe='')}/packages"
    body = bytearray()
    try:
        with client.stream("GET", path) as response:
            for chunk in response.iter_bytes(CHUNK):
                body += chunk
                if len(body) > MAX_LISTING_BYTES:
                    raise MaterializationFailed(
                        f"the server's listing of pins is larger than {MAX_LISTING_BYTES} bytes",
                        reason="listing",
                    )
    except IncompleteDownload as exc:
        raise MaterializationFailed(
            f"the server's listing of pins: {exc}", reason="listing"
        ) from None
    try:
        listing = json.loads(body)
    except (ValueError, RecursionError):
        listing = None
    if not isinstance(listing, dict):
        raise MaterializationFailed(
            "the server's listing of pins is not a JSON object", reason="listing"
        )
    return listing


def _pins(client: Client, pins: Any) -> list[_Pin]:
    """The listing's pins, each field checked (see the module)."""
    if not isinstance(pins, list) or len(pins) > MAX_PINS:
        raise MaterializationFailed(
            f"the server's pins are not a list of at most {MAX_PINS}; nothing was fetched",
            reason="listing",
        )
    checked: list[_Pin] = []
    for number, pin in enumerate(pins, 1):
        try:
            checked.append(_pin(client, pin))
        except ValueError as exc:
            raise MaterializationFailed(
                f"the server's pin {number} is refused: {exc}; nothing was fetched",
                reason="listing",
            ) from None
    names = [pin.name for pin in checked]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise MaterializationFailed(
            f"the server pins {', '.join(twice)} twice; nothing was fetched", reason="listing"
        )
    return checked


def _pin(client: Client, pin: Any) -> _Pin:
    if not isinstance(pin, dict):
        raise ValueError("it is not a JSON object")
    name, version, digest, url = (pin.get(k) for k in ("name", "version", "sha256", "package_url"))
    if not is_plugin_name(name):
        raise ValueError(f"its name {_shown(name)} is not a plugin name")
    if not isinstance(version, str) or len(version) > MAX_VERSION:
        raise ValueError(f"{name}'s version {_shown(version)} is not a version")
    try:
        normal = str(Version(version))
    except (InvalidVersion, ValueError):
        normal = None
    if normal != version:
        raise ValueError(f"{name}'s version {_shown(version)} is not a normalised PEP 440 version")
    if not isinstance(digest, str) or not _SHA256.match(digest):
        raise ValueError(f"{name}'s sha256 {_shown(digest)} is not 64 lowercase hex digits")
    if not isinstance(url, str) or len(url) > MAX_URL:
        raise ValueError(f"{name}'s package_url {_shown(url)} is not a URL")
    try:
        client.url_for(url)
    except ForeignOrigin as exc:
        raise ValueError(f"{name}'s package_url: {exc}") from None
    return _Pin(name, version, digest, url)


def _shown(value: Any) -> str:
    """A server-supplied value, shortened, for an error message."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _stricter_limits(own: Limits, advertised: Any) -> Limits:
    """``own`` limits, each lowered to the server's where it advertises a
    lower one: a server can tighten a worker's limits, never lift them.
    Limits the worker does not know are ignored; a known one that is not a
    non-negative integer fails the materialization."""
    if advertised is None:
        return own
    if not isinstance(advertised, dict):
        raise MaterializationFailed("the server's limits are not a JSON object", reason="listing")
    values: dict[str, int] = {}
    for limit in dataclasses.fields(Limits):
        mine: int = getattr(own, limit.name)
        theirs = advertised.get(limit.name, mine)
        if type(theirs) is not int or theirs < 0:
            raise MaterializationFailed(
                f"the server's limit {limit.name} {_shown(theirs)} is not a non-negative integer",
                reason="listing",
            )
        values[limit.name] = min(mine, theirs)
    return Limits(**values)


def _max_download_bytes(limits: Limits) -> int:
    """The largest archive a worker downloads under ``limits``."""
    return limits.max_total_bytes + (limits.max_entries + 2) * HEADER_ROOM


def _fetch(client: Client, pin: _Pin, staging: Path, limits: Limits) -> Any:
    archive = staging / f".{pin.name}.download"
    digest = hashlib.sha256()
    allowed = _max_download_bytes(limits)
    received = 0
    try:
        with client.stream("GET", pin.package_url) as response, open(archive, "xb") as out:
            for chunk in response.iter_bytes(CHUNK):
                received += len(chunk)
                if received > allowed:
                    raise MaterializationFailed(
                        f"{pin.name} {pin.version}: the server sent more than the "
                        f"{allowed} bytes an archive within the limits can have",
                        reason="download",
                    )
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != pin.sha256:
            raise MaterializationFailed(
                f"{pin.name} {pin.version}: the bytes' sha256 is {digest.hexdigest()}, "
                f"not the pinned {pin.sha256}",
                reason="digest",
            )
        try:
            package = extract(archive, staging / pin.name, limits)
        except PackageRefused as refused:
            raise MaterializationFailed(
                f"{pin.name} {pin.version} was refused: {refused}", reason="package"
            ) from None
        if (package.name, str(Version(package.version))) != (pin.name, pin.version):
            raise MaterializationFailed(
                f"{pin.name} {pin.version}: the package says it is "
                f"{package.name} {package.version}",
                reason="package",
            )
        return package
    except (BuildMaxError, IncompleteDownload) as exc:
        raise MaterializationFailed(f"{pin.name} {pin.version}: {exc}", reason="download") from None
    finally:
        archive.unlink(missing_ok=True)
