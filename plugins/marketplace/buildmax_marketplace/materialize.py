"""Materializing a run: the exact pinned packages, verified, under a home.

``materialize(client, attempt_id, home)`` asks the server for the attempt's
pins (with the run token), downloads each package, checks its sha256
before reading it, extracts it with the hardened reader into
``<home>/plugins/<name>/`` and writes ``<home>/plugins/environment.lock``
(``name version sha256`` per line). Everything is built in a staging
directory next to ``<home>/plugins`` and renamed into place at the end: a
package that fails verification or inspection leaves no ``plugins``
directory at all.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.version import Version

from buildmax.client import BuildMaxError, Client, IncompleteDownload

from .package import CHUNK, DEFAULT_LIMITS, Limits, PackageRefused, extract


class MaterializationFailed(Exception):
    """A pinned package could not be verified or extracted; nothing was placed."""


@dataclass(frozen=True)
class Materialized:
    """What was placed: the pins, the lock file, and the environment
    variables the packages read that are not set here."""

    pins: list[dict[str, Any]]
    lock: Path
    unset_environment: dict[str, list[str]] = field(default_factory=dict)


def materialize(
    client: Client, attempt_id: str, home: Path, limits: Limits | None = None
) -> Materialized:
    """Download, verify and extract an attempt's pinned packages under
    ``home/plugins`` (which must not exist yet); all or nothing. ``limits``
    default to the server's (what it accepted at publish)."""
    listing = client.request("GET", f"/v1/attempts/{attempt_id}/packages")
    pins: list[dict[str, Any]] = list(listing["pins"])
    if limits is None:
        limits = Limits(**listing["limits"]) if "limits" in listing else DEFAULT_LIMITS
    target = home / "plugins"
    if target.exists() or target.is_symlink():
        raise MaterializationFailed(f"{target} exists already; materialize into a fresh home")
    home.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".plugins-", dir=home))
    unset: dict[str, list[str]] = {}
    try:
        for pin in pins:
            package = _fetch(client, pin, staging, limits)
            missing = [name for name in package.report["environment"] if name not in os.environ]
            if missing:
                unset[pin["name"]] = missing
        lock = staging / "environment.lock"
        lock.write_text(
            "".join(f"{p['name']} {p['version']} {p['sha256']}\n" for p in pins), encoding="utf-8"
        )
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return Materialized(pins, target / "environment.lock", unset)


def _fetch(client: Client, pin: dict[str, Any], staging: Path, limits: Limits) -> Any:
    archive = staging / f".{pin['name']}.download"
    digest = hashlib.sha256()
    try:
        with client.stream("GET", pin["package_url"]) as response, open(archive, "wb") as out:
            for chunk in response.iter_bytes(CHUNK):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != pin["sha256"]:
            raise MaterializationFailed(
                f"{pin['name']} {pin['version']}: the bytes' sha256 is {digest.hexdigest()}, "
                f"not the pinned {pin['sha256']}"
            )
        try:
            package = extract(archive, staging / pin["name"], limits)
        except PackageRefused as refused:
            raise MaterializationFailed(
                f"{pin['name']} {pin['version']} was refused: {refused}"
            ) from None
        if (package.name, str(Version(package.version))) != (pin["name"], pin["version"]):
            raise MaterializationFailed(
                f"{pin['name']} {pin['version']}: the package says it is "
                f"{package.name} {package.version}"
            )
        return package
    except (BuildMaxError, IncompleteDownload) as exc:
        raise MaterializationFailed(f"{pin['name']} {pin['version']}: {exc}") from None
    finally:
        archive.unlink(missing_ok=True)
