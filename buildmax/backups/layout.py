"""Where a backup's parts live on disk, and how they are written.

A backup target is a folder holding any number of backups and one pool of
blobs they share::

    <target>/blobs/<aa>/<sha256>          every blob, by content (0600)
    <target>/<name>/manifest.json         one backup (its folder is 0700)
    <target>/<name>/database.sqlite       ... or database.pgdump
    <target>/<name>/blobs.jsonl           the blobs it references
    <target>/.partial-<name>/             a backup being written

A backup is written under ``.partial-<name>`` and renamed to ``<name>`` only
once complete and verified, so a folder without that prefix is always a
whole backup. A blob is written to a temporary file and renamed into the
pool only once its digest is checked, so a later backup into the same target
reuses every blob an earlier one stored (content-addressed).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

MANIFEST = "manifest.json"
BLOB_LIST = "blobs.jsonl"
SQLITE_DUMP = "database.sqlite"
POSTGRES_DUMP = "database.pgdump"
BLOB_POOL = "blobs"
PARTIAL_PREFIX = ".partial-"
#: ``buildmax-20261202T120000123Z``: sorts by time.
BACKUP_NAME = re.compile(r"^buildmax-\d{8}T\d{9}Z$")
CHUNK = 1024 * 1024


#: ``progress(stage, done, total)``: a stage's work done out of its total
#: (0: unknown), for a progress bar.
Progress = Callable[[str, int, int], None]


def quiet(stage: str, done: int, total: int) -> None:
    """A :data:`Progress` that shows nothing."""


class BackupError(Exception):
    """A backup cannot be taken, read, verified or restored: one line why."""


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def backup_name(millis: int) -> str:
    """The folder name of a backup taken at ``millis`` (UTC epoch ms)."""
    import datetime

    moment = datetime.datetime.fromtimestamp(millis / 1000, datetime.UTC)
    return f"buildmax-{moment:%Y%m%dT%H%M%S}{millis % 1000:03d}Z"


def private_dir(path: Path) -> Path:
    """``path``, every folder of it created here readable by its owner only
    (the umask cannot widen them); a folder that exists is left as it is."""
    missing = []
    walk = path
    while not walk.is_dir():
        missing.append(walk)
        walk = walk.parent
    for folder in reversed(missing):
        folder.mkdir(mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)
    return path


def blob_path(target: Path, sha256: str) -> Path:
    """Where the blob with digest ``sha256`` lives in ``target``'s pool."""
    if not _SHA256.match(sha256):
        raise ValueError(f"not a sha256 digest: {sha256!r}")
    return target / BLOB_POOL / sha256[:2] / sha256


def backups_in(target: Path) -> list[Path]:
    """The complete backups in ``target``, oldest first."""
    if not target.is_dir():
        return []
    return sorted(
        p for p in target.iterdir() if BACKUP_NAME.match(p.name) and (p / MANIFEST).is_file()
    )


def file_sha256(path: Path) -> tuple[int, str]:
    """The size and sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def fsync_dir(path: Path) -> None:
    """Make the entries of ``path`` (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


class PrivateFile:
    """A new owner-only file at a temporary name beside ``path``, hashed as
    it is written; :meth:`commit` fsyncs it and renames it to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.temp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        private_dir(path.parent)
        fd = os.open(self.temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        self.fh: BinaryIO = os.fdopen(fd, "wb")
        self.digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        """Append ``data``."""
        self.digest.update(data)
        self.size += len(data)
        self.fh.write(data)

    def commit(self) -> None:
        """Flush, fsync and rename into place."""
        self.fh.flush()
        os.fsync(self.fh.fileno())
        self.fh.close()
        os.replace(self.temp, self.path)
        fsync_dir(self.path.parent)

    def discard(self) -> None:
        """Close and remove the temporary file."""
        self.fh.close()
        self.temp.unlink(missing_ok=True)


@contextlib.contextmanager
def target_lock(target: Path) -> Iterator[None]:
    """Hold the target's lock file (``.lock``) for the block; a second
    holder is refused at once (another backup is running)."""
    fd = os.open(target / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BackupError(f"another backup is being written into {target}") from None
        yield
    finally:
        os.close(fd)


def iter_file(path: Path, start: int = 0) -> Iterator[bytes]:
    """A file's bytes in chunks."""
    with open(path, "rb") as fh:
        fh.seek(start)
        while chunk := fh.read(CHUNK):
            yield chunk
