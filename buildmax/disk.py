"""The disk reserve: free bytes the server keeps for its database.

An upload or a publish that would leave less than ``min_free_bytes`` free
on the disk of the data directory (the SQLite database and its log) or of a
``file://`` blob store is refused with 507 before its first byte is
written, so a full disk never stops claims, renewals and submissions.
The free space is read through a function a test may replace
(``app.disk.free_space``).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

from .config import Config
from .problems import DiskReserveReached

#: How the free bytes of the file system holding a path are read.
FreeSpace = Callable[[Path], int]


def free_bytes(path: Path) -> int:
    """Free bytes (for an unprivileged user) on the file system holding
    ``path``, or its nearest existing parent."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return shutil.disk_usage("/").free


@dataclass(frozen=True)
class Volume:
    """A place the server writes to, and its free bytes now."""

    name: str
    path: Path
    free: int


class DiskReserve:
    """The reserve of one server (``app.disk``)."""

    def __init__(self, settings: Config, free_space: FreeSpace = free_bytes) -> None:
        self.min_free = settings.min_free_bytes
        self.free_space = free_space
        self._paths = {"data": settings.data_path}
        if settings.engine == "sqlite":
            self._paths["database"] = Path(
                settings.effective_database_url.removeprefix("sqlite:///")
            ).parent
        store = urlsplit(settings.effective_blob_store_url)
        if store.scheme == "file":
            self._paths["blobs"] = Path(url2pathname(store.path))

    def volumes(self) -> list[Volume]:
        """Each place the server writes to with its free bytes (a place on
        the same file system as one before it is listed once)."""
        seen: set[int] = set()
        found = []
        for name, path in self._paths.items():
            device = _device(path)
            if device in seen:
                continue
            seen.add(device)
            found.append(Volume(name, path, self.free_space(path)))
        return found

    def short(self, incoming: int = 0) -> list[Volume]:
        """The volumes that would fall below the reserve after ``incoming``
        more bytes."""
        return [v for v in self.volumes() if v.free - incoming < self.min_free]

    def require_room(self, incoming: int) -> None:
        """Refuse (507) ``incoming`` bytes that would cross the reserve on
        any volume; a body of unknown length counts as 0 here and is bounded
        by its own limit."""
        short = self.short(max(0, incoming))
        if short:
            # The names only: paths and free bytes are for operators
            # (buildmax status), not for whoever uploads.
            where = ", ".join(v.name for v in short)
            raise DiskReserveReached(
                f"accepting {incoming} more bytes would leave less than the server's "
                f"disk reserve free on its {where} disk; retry once an operator has freed "
                "space (or unpinned artifacts were deleted)",
                min_free_bytes=self.min_free,
            )


def _device(path: Path) -> int:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate.stat().st_dev
    return -1
