"""The hardened reader of plugin release archives, used everywhere a
release is read: publish (inspection) and materialization (extraction).

A release is a ``.tar.gz`` or ``.zip`` holding ``buildmax-plugin.toml`` at
its root and the files it declares::

    name = "lint-helpers"                 # [a-z0-9][a-z0-9-]*, at most 64
    version = "1.2.0"                     # PEP 440
    description = "Skills for linting"
    [contributes]
    skills = ["fix-lint"]                 # skills/<name>/SKILL.md (+ files under it)
    agents = ["reviewer"]                 # agents/<name>.md (subagents)
    hooks = true                          # hooks/hooks.toml (+ files under hooks/)
    mcp_servers = true                    # mcp/servers.toml (+ files under mcp/)
    environment = ["GITHUB_TOKEN"]        # environment variables it reads

``README.md`` and ``LICENSE`` may sit next to the manifest; any other file
is refused. Entries are refused for an absolute or escaping path, a name
that is not UTF-8 or too long to write (counted in bytes), a link,
a device, a duplicate (also case-folded), more entries, more bytes or a
higher compression ratio than the limits allow. Every refusal is a
:class:`PackageRefused` naming the entry and the reason. The reader never
holds more than one chunk of a file in memory (the three TOML files are
read whole, up to :data:`MAX_TOML_BYTES`), and :func:`extract` writes into
a fresh temporary directory renamed into place only when everything
checked out.
"""

from __future__ import annotations

import io
import ipaddress
import os
import posixpath
import re
import shlex
import shutil
import stat
import struct
import tarfile
import tempfile
import tomllib
import unicodedata
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeGuard
from urllib.parse import urlsplit

from packaging.version import InvalidVersion, Version

MANIFEST = "buildmax-plugin.toml"
HOOKS_FILE = "hooks/hooks.toml"
SERVERS_FILE = "mcp/servers.toml"
#: Largest manifest, hooks or servers file read.
MAX_TOML_BYTES = 256 * 1024
#: Deepest nesting of tables and arrays in those files (a file's own table is level 0).
MAX_TOML_DEPTH = 16
#: Most names in one ``contributes`` list, hooks in the hooks file and
#: servers in the servers file.
MAX_NAMES = 1000
MAX_HOOKS = 100
MAX_SERVERS = 100
#: Longest version, description, hook or server command and server url.
MAX_VERSION = 100
MAX_DESCRIPTION = 2000
MAX_COMMAND = 4096
MAX_URL = 2048
CHUNK = 64 * 1024
_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}\Z")
_ITEM = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}\Z")
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}\Z")
#: Control characters refused in text (tab, line feed and carriage return pass).
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
#: Control characters refused in a command or a url (tab passes in a command).
_CONTROL_IN_LINE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_HOST_NAME = re.compile(r"^(?=.{1,253}\Z)[a-z0-9_][a-z0-9_-]{0,62}(\.[a-z0-9_-]{1,63})*\.?\Z")
_TOP_FILES = frozenset({MANIFEST, "README.md", "LICENSE"})
_GZIP = b"\x1f\x8b"
_ZIP = b"PK\x03\x04"
_ZIP_END = b"PK\x05\x06"


@dataclass(frozen=True)
class Limits:
    """What a release archive may hold."""

    max_entries: int = 2000
    max_total_bytes: int = 256 * 1024 * 1024
    max_ratio: int = 200


#: The limits a reader applies when it is given none.
DEFAULT_LIMITS = Limits()


def is_plugin_name(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a plugin name: 1-64 of ``a-z``, ``0-9`` and
    ``-``, starting with a letter or digit (so also one path segment, never
    ``.``, ``..``, absolute or of another case)."""
    return isinstance(value, str) and _NAME.match(value) is not None


class PackageRefused(Exception):
    """The archive is not a release this server accepts: ``reason`` says
    why, ``path`` names the entry when one is at fault."""

    def __init__(self, reason: str, path: str | None = None) -> None:
        # A tar entry's name that is not UTF-8 arrives with surrogates in it:
        # shown escaped, so the refusal can be printed and sent as JSON.
        self.reason = _shown(reason)
        self.path = None if path is None else _shown(path)
        super().__init__(f"{self.path}: {self.reason}" if path else self.reason)


def _shown(text: str) -> str:
    """``text`` with any surrogate (an undecodable byte) as a ``\\udcXX`` escape."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


@dataclass(frozen=True)
class Package:
    """A release archive that passed inspection."""

    name: str
    version: str
    description: str
    report: dict[str, Any]
    files: tuple[tuple[str, int], ...] = field(default=())

    @property
    def executable(self) -> bool:
        """True when it starts processes (hooks or MCP servers)."""
        return bool(self.report["hooks"] or self.report["mcp_servers"])


@dataclass
class _Entry:
    path: str
    size: int
    kind: str  # "file" or "dir"
    mode: int


def inspect(source: Path, limits: Limits = DEFAULT_LIMITS) -> Package:
    """Read the archive at ``source`` without writing anything: its
    manifest, its capability report and its files, or :class:`PackageRefused`."""
    return _read(source, limits, None)


def extract(source: Path, dest: Path, limits: Limits = DEFAULT_LIMITS) -> Package:
    """Inspect and extract the archive into ``dest`` (which must not exist):
    written into a temporary directory next to it and renamed into place,
    so a refused archive leaves nothing at ``dest``."""
    if dest.exists() or dest.is_symlink():
        raise FileExistsError(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".extract-", dir=dest.parent))
    try:
        package = _read(source, limits, staging)
        staging.rename(dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return package


# -- reading --------------------------------------------------------------------


class _Reader:
    """What one pass over an archive collects, whatever its format."""

    def __init__(self, limits: Limits, compressed: int, target: Path | None) -> None:
        self.limits = limits
        self.compressed = max(compressed, 1)
        self.target = target
        self.entries: dict[str, _Entry] = {}
        self.folded: dict[str, str] = {}
        #: Directories implied by the paths admitted so far (case-folded).
        self.implied: set[str] = set()
        self.total = 0
        self.toml: dict[str, bytes] = {}

    def admit(self, raw_name: str, kind: str, size: int, mode: int) -> str | None:
        """Check one entry's name, kind and declared size; its clean path
        (``None`` for the archive's root directory, ``./``)."""
        if kind == "dir" and raw_name.rstrip("/") in (".", ""):
            return None
        if len(self.entries) >= self.limits.max_entries:
            raise PackageRefused(f"more than {self.limits.max_entries} entries")
        path = _clean(raw_name)
        if kind == "file":
            self._count(size, path)
        folded = unicodedata.normalize("NFC", path).casefold()
        if path in self.entries or folded in self.folded:
            first = self.folded.get(folded, path)
            raise PackageRefused(f"duplicate of {first!r}", path)
        if kind == "file" and folded in self.implied:
            raise PackageRefused("a file where another entry needs a directory", path)
        for parent in _parents(path):
            parent_folded = unicodedata.normalize("NFC", parent).casefold()
            existing = self.entries.get(self.folded.get(parent_folded, parent))
            if existing is not None and existing.kind == "file":
                raise PackageRefused(f"{parent!r} is a file, not a directory", path)
            self.implied.add(parent_folded)
        self.entries[path] = _Entry(path, size, kind, mode)
        self.folded[folded] = path
        return path

    def _count(self, size: int, path: str) -> None:
        if size < 0:
            raise PackageRefused("negative size", path)
        self.total += size
        if self.total > self.limits.max_total_bytes:
            raise PackageRefused(
                f"more than {self.limits.max_total_bytes} bytes when extracted", path
            )
        if self.total > self.compressed * self.limits.max_ratio:
            raise PackageRefused(
                f"compression ratio above {self.limits.max_ratio}:1 (an archive bomb?)", path
            )

    def content(self, path: str, chunks: Iterator[bytes], size: int, mode: int) -> None:
        """Take a file's bytes: keep the TOML files the report needs, write
        the file when extracting, and check it holds exactly ``size`` bytes."""
        keep = path in (MANIFEST, HOOKS_FILE, SERVERS_FILE)
        if keep and size > MAX_TOML_BYTES:
            raise PackageRefused(f"larger than {MAX_TOML_BYTES} bytes", path)
        kept = bytearray()
        seen = 0
        with self._output(path, mode) as out:
            for chunk in chunks:
                seen += len(chunk)
                if seen > size:
                    raise PackageRefused("holds more bytes than it declares", path)
                if keep:
                    kept += chunk
                if out is not None:
                    out.write(chunk)
        if seen != size:
            raise PackageRefused("holds fewer bytes than it declares", path)
        if keep:
            self.toml[path] = bytes(kept)

    @contextmanager
    def _output(self, path: str, mode: int) -> Iterator[IO[bytes] | None]:
        if self.target is None:
            yield None
            return
        where = self.target.joinpath(*path.split("/"))
        where.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
        fd = os.open(where, flags, 0o755 if mode & 0o111 else 0o644)
        with os.fdopen(fd, "wb") as out:
            yield out

    def directory(self, path: str) -> None:
        """Create a directory entry when extracting."""
        if self.target is not None:
            self.target.joinpath(*path.split("/")).mkdir(parents=True, exist_ok=True)


def _read(source: Path, limits: Limits, target: Path | None) -> Package:
    size = source.stat().st_size
    with open(source, "rb") as fh:
        head = fh.read(4)
        fh.seek(0)
        reader = _Reader(limits, size, target)
        with _refusing_the_unforeseen():
            if head.startswith(_GZIP):
                _read_tar(fh, reader)
            elif head == _ZIP:
                _read_zip(fh, size, reader)
            else:
                raise PackageRefused("not a .tar.gz or .zip archive")
    with _refusing_the_unforeseen():
        return _package(reader)


@contextmanager
def _refusing_the_unforeseen() -> Iterator[None]:
    """The reader is total: whatever else the parsers of untrusted bytes
    raise (a library's ``ValueError``, ``RecursionError``, ``IndexError``)
    is a :class:`PackageRefused` naming it. Errors of the local machine
    (``OSError`` of its disk, ``MemoryError``) pass unchanged."""
    try:
        yield
    except (PackageRefused, OSError, MemoryError):
        raise
    except Exception as exc:
        raise PackageRefused(f"could not be read ({type(exc).__name__}: {exc})"[:500]) from None


class _Bounded(io.RawIOBase):
    """A decompressed stream that refuses to yield more than ``limit`` bytes
    (headers included), so no tar header can make the reader allocate more."""

    def __init__(self, raw: io.BufferedIOBase, limit: int) -> None:
        self.raw = raw
        self.limit = limit
        self.read_so_far = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.raw.read(len(buffer))
        self.read_so_far += len(data)
        if self.read_so_far > self.limit:
            raise PackageRefused("more bytes than the limits allow when decompressed")
        buffer[: len(data)] = data
        return len(data)


def _read_tar(fh: IO[bytes], reader: _Reader) -> None:
    import gzip

    limits = reader.limits
    # Headers and padding: at most two 512-byte blocks per entry beyond its data.
    budget = limits.max_total_bytes + (limits.max_entries + 2) * 1536
    bounded = io.BufferedReader(_Bounded(gzip.GzipFile(fileobj=fh, mode="rb"), budget))
    try:
        with tarfile.open(fileobj=bounded, mode="r|") as archive:
            for member in archive:
                kind = _tar_kind(member)
                path = reader.admit(
                    member.name, kind, member.size if kind == "file" else 0, member.mode
                )
                if path is None:
                    continue
                if kind == "dir":
                    reader.directory(path)
                    continue
                extracted = archive.extractfile(member)
                assert extracted is not None
                reader.content(path, _chunks(extracted), member.size, member.mode)
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise PackageRefused(f"not a readable .tar.gz archive ({exc})") from None


def _tar_kind(member: tarfile.TarInfo) -> str:
    if member.isreg():
        return "file"
    if member.isdir():
        return "dir"
    if member.issym():
        raise PackageRefused(f"a symbolic link (to {member.linkname!r})", member.name)
    if member.islnk():
        raise PackageRefused(f"a hard link (to {member.linkname!r})", member.name)
    if member.ischr() or member.isblk():
        raise PackageRefused("a device file", member.name)
    if member.isfifo():
        raise PackageRefused("a named pipe", member.name)
    raise PackageRefused("not a regular file or a directory", member.name)


def _read_zip(fh: IO[bytes], size: int, reader: _Reader) -> None:
    _check_zip_directory(fh, size, reader.limits)
    try:
        with zipfile.ZipFile(fh) as archive:
            for info in archive.infolist():
                mode = info.external_attr >> 16
                kind = _zip_kind(info, mode)
                path = reader.admit(
                    info.filename, kind, info.file_size if kind == "file" else 0, mode
                )
                if path is None:
                    continue
                if kind == "dir":
                    reader.directory(path)
                    continue
                with archive.open(info) as member:
                    reader.content(path, _chunks(member), info.file_size, mode)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, zlib.error) as exc:
        raise PackageRefused(f"not a readable .zip archive ({exc})") from None
    except (NotImplementedError, RuntimeError) as exc:
        raise PackageRefused(f"an unsupported .zip feature ({exc})") from None


def _check_zip_directory(fh: IO[bytes], size: int, limits: Limits) -> None:
    """Refuse a central directory with too many entries before ``zipfile``
    reads all of it into memory."""
    tail_size = min(size, 65536 + 22)
    fh.seek(size - tail_size)
    tail = fh.read(tail_size)
    at = tail.rfind(_ZIP_END)
    if at < 0 or at + 22 > len(tail):
        raise PackageRefused("not a readable .zip archive (no end of central directory)")
    entries, directory_size = struct.unpack("<xxxxxxxxxxHI", tail[at : at + 16])
    if entries == 0xFFFF or directory_size == 0xFFFFFFFF:
        entries, directory_size = _zip64_directory(fh, size, tail, at)
    if entries > limits.max_entries or directory_size > limits.max_entries * (46 + 1024):
        raise PackageRefused(f"more than {limits.max_entries} entries")
    fh.seek(0)


def _zip64_directory(fh: IO[bytes], size: int, tail: bytes, at: int) -> tuple[int, int]:
    """(entries, directory size) from a zip64 end of central directory record."""
    locator = tail[at - 20 : at]
    if at < 20 or not locator.startswith(b"PK\x06\x07"):
        raise PackageRefused("not a readable .zip archive (a broken zip64 directory)")
    (offset,) = struct.unpack("<Q", locator[8:16])
    if offset > size - 56:  # seeking past the file can fail like a disk fault
        raise PackageRefused("not a readable .zip archive (a broken zip64 directory)")
    fh.seek(offset)
    record = fh.read(56)
    if len(record) < 56 or not record.startswith(b"PK\x06\x06"):
        raise PackageRefused("not a readable .zip archive (a broken zip64 directory)")
    entries, directory_size = struct.unpack("<QQ", record[32:48])
    return entries, directory_size


#: Zip compression methods read: ``zipfile`` bounds the output of deflate
#: only (a bzip2 or lzma entry of a few bytes can inflate to gigabytes).
_ZIP_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)


def _zip_kind(info: zipfile.ZipInfo, mode: int) -> str:
    if info.flag_bits & 0x1:
        raise PackageRefused("an encrypted entry", info.filename)
    if info.compress_type not in _ZIP_METHODS:
        raise PackageRefused("compressed with a method other than stored or deflate", info.filename)
    file_type = stat.S_IFMT(mode)
    if file_type == stat.S_IFLNK:
        raise PackageRefused("a symbolic link", info.filename)
    if file_type not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise PackageRefused("not a regular file or a directory", info.filename)
    # ``ZipInfo.is_dir`` fails on an empty name: the path check refuses it later.
    if info.filename.endswith("/") or file_type == stat.S_IFDIR:
        if info.file_size:
            raise PackageRefused("a directory entry holding data", info.filename)
        return "dir"
    return "file"


def _chunks(stream: IO[bytes]) -> Iterator[bytes]:
    while chunk := stream.read(CHUNK):
        yield chunk


def _clean(raw: str) -> str:
    """The entry's path, or :class:`PackageRefused` for one that could land
    outside the target or means different things on different systems."""
    name = raw[:-1] if raw.endswith("/") else raw
    while name.startswith("./"):
        name = name[2:]  # what ``tar -C dir .`` writes
    if not name:
        raise PackageRefused("an empty path", raw)
    if "\\" in name or "\x00" in name or any(ord(c) < 32 for c in name):
        raise PackageRefused("a backslash or control character in the path", raw)
    if any(0xD800 <= ord(c) <= 0xDFFF for c in name):
        raise PackageRefused("a path that is not UTF-8", raw)
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name):
        raise PackageRefused("an absolute path", raw)
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise PackageRefused("a '..', '.' or empty path component", raw)
    # Counted in bytes, as file systems count them: inspection refuses what
    # no extraction could write.
    if len(name.encode()) > 1024 or any(len(part.encode()) > 255 for part in parts):
        raise PackageRefused("a path too long", raw)
    return posixpath.normpath(name)


def _parents(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


# -- the manifest and the capability report -----------------------------------------


def _toml(reader: _Reader, path: str) -> dict[str, Any]:
    try:
        table = tomllib.loads(reader.toml[path].decode("utf-8"))
    except RecursionError:
        raise PackageRefused(f"nested deeper than {MAX_TOML_DEPTH} levels", path) from None
    # ValueError: an integer of more digits than Python converts.
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, ValueError) as exc:
        raise PackageRefused(f"not valid TOML ({exc})", path) from None
    if _depth(table) > MAX_TOML_DEPTH:
        raise PackageRefused(f"nested deeper than {MAX_TOML_DEPTH} levels", path)
    return table


def _depth(table: dict[str, Any]) -> int:
    """How deep tables and arrays nest below ``table`` (walked without recursion)."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(table, 0)]
    while pending:
        value, level = pending.pop()
        deepest = max(deepest, level)
        if isinstance(value, dict):
            pending.extend((v, level + 1) for v in value.values())
        elif isinstance(value, list):
            pending.extend((v, level + 1) for v in value)
    return deepest


def _text(value: Any, limit: int, control: re.Pattern[str] = _CONTROL) -> TypeGuard[str]:
    """Whether ``value`` is text of at most ``limit`` characters without control characters."""
    return isinstance(value, str) and len(value) <= limit and not control.search(value)


def _names(value: Any, what: str, pattern: re.Pattern[str]) -> list[str]:
    if (
        not isinstance(value, list)
        or len(value) > MAX_NAMES
        or not all(isinstance(v, str) and pattern.match(v) for v in value)
    ):
        raise PackageRefused(
            f"contributes.{what} must be a list of at most {MAX_NAMES} valid names", MANIFEST
        )
    if len(set(value)) != len(value):
        raise PackageRefused(f"contributes.{what} names one twice", MANIFEST)
    return sorted(value)


def _package(reader: _Reader) -> Package:
    if MANIFEST not in reader.toml:
        raise PackageRefused(f"no {MANIFEST} at the archive's root")
    manifest = _toml(reader, MANIFEST)
    name = manifest.get("name")
    if not is_plugin_name(name):
        raise PackageRefused("name must be 1-64 of a-z, 0-9 and '-'", MANIFEST)
    version = manifest.get("version")
    if not _text(version, MAX_VERSION):
        raise PackageRefused(f"version must be text of at most {MAX_VERSION} characters", MANIFEST)
    try:
        Version(version)
    except InvalidVersion:
        raise PackageRefused(f"version {version!r} is not a PEP 440 version", MANIFEST) from None
    description = manifest.get("description", "")
    if not _text(description, MAX_DESCRIPTION):
        raise PackageRefused(
            f"description must be text of at most {MAX_DESCRIPTION} characters, "
            "without control characters",
            MANIFEST,
        )
    contributes = manifest.get("contributes", {})
    if not isinstance(contributes, dict):
        raise PackageRefused("contributes must be a table", MANIFEST)
    unknown = set(contributes) - {"skills", "agents", "hooks", "mcp_servers", "environment"}
    if unknown:
        raise PackageRefused(
            f"contributes has unknown keys: {', '.join(sorted(unknown))}", MANIFEST
        )
    skills = _names(contributes.get("skills", []), "skills", _ITEM)
    agents = _names(contributes.get("agents", []), "agents", _ITEM)
    environment = _names(contributes.get("environment", []), "environment", _ENV)
    hooks_declared = contributes.get("hooks", False)
    servers_declared = contributes.get("mcp_servers", False)
    if not isinstance(hooks_declared, bool) or not isinstance(servers_declared, bool):
        raise PackageRefused(
            "contributes.hooks and contributes.mcp_servers are true or false", MANIFEST
        )
    _match_files(reader, skills, agents, hooks_declared, servers_declared)
    report = {
        "skills": skills,
        "subagents": agents,
        "hooks": _hooks(reader) if hooks_declared else [],
        "mcp_servers": _servers(reader) if servers_declared else [],
        "environment": environment,
    }
    files = tuple(sorted((e.path, e.size) for e in reader.entries.values() if e.kind == "file"))
    return Package(name, version, description, report, files)


def _match_files(
    reader: _Reader, skills: list[str], agents: list[str], hooks: bool, servers: bool
) -> None:
    """Every file is one the manifest declares, and every declared part exists."""
    files = [e.path for e in reader.entries.values() if e.kind == "file"]
    for path in files:
        top, _, rest = path.partition("/")
        if not rest:
            if path not in _TOP_FILES:
                raise PackageRefused("a file the manifest does not declare", path)
        elif top == "skills":
            if rest.split("/", 1)[0] not in skills:
                raise PackageRefused("a file of a skill the manifest does not declare", path)
        elif top == "agents":
            if "/" in rest or not rest.endswith(".md") or rest[:-3] not in agents:
                raise PackageRefused("a subagent the manifest does not declare", path)
        elif top == "hooks":
            if not hooks:
                raise PackageRefused("hooks the manifest does not declare", path)
        elif top == "mcp":
            if not servers:
                raise PackageRefused("MCP servers the manifest does not declare", path)
        else:
            raise PackageRefused("a file the manifest does not declare", path)
    present = set(files)
    for skill in skills:
        if f"skills/{skill}/SKILL.md" not in present:
            raise PackageRefused(f"skill {skill!r} has no skills/{skill}/SKILL.md", MANIFEST)
    for agent in agents:
        if f"agents/{agent}.md" not in present:
            raise PackageRefused(f"subagent {agent!r} has no agents/{agent}.md", MANIFEST)
    if hooks and HOOKS_FILE not in present:
        raise PackageRefused(f"hooks are declared but {HOOKS_FILE} is missing", MANIFEST)
    if servers and SERVERS_FILE not in present:
        raise PackageRefused(f"MCP servers are declared but {SERVERS_FILE} is missing", MANIFEST)


def _executable(command: Any, where: str) -> str:
    if not _text(command, MAX_COMMAND, _CONTROL_IN_LINE) or not command.strip():
        raise PackageRefused(
            f"a command must be non-empty text of at most {MAX_COMMAND} characters "
            "on one line, without control characters",
            where,
        )
    try:
        return shlex.split(command)[0]
    except ValueError as exc:
        raise PackageRefused(f"a command that does not parse ({exc})", where) from None


def _hooks(reader: _Reader) -> list[dict[str, str]]:
    table = _toml(reader, HOOKS_FILE)
    hooks = table.get("hooks")
    if not isinstance(hooks, list) or not hooks:
        raise PackageRefused("must hold at least one [[hooks]] entry", HOOKS_FILE)
    if len(hooks) > MAX_HOOKS:
        raise PackageRefused(f"may hold at most {MAX_HOOKS} hooks", HOOKS_FILE)
    found = []
    for hook in hooks:
        event = hook.get("event") if isinstance(hook, dict) else None
        if not isinstance(event, str) or not _ITEM.match(event):
            raise PackageRefused(
                "every [[hooks]] entry names an event (1-100 of A-Z, a-z, 0-9, '.', '_' "
                "and '-') and a command",
                HOOKS_FILE,
            )
        found.append(
            {"event": hook["event"], "executable": _executable(hook.get("command"), HOOKS_FILE)}
        )
    return sorted(found, key=lambda h: (h["event"], h["executable"]))


def _servers(reader: _Reader) -> list[dict[str, str | None]]:
    table = _toml(reader, SERVERS_FILE)
    servers = table.get("servers")
    if not isinstance(servers, dict) or not servers:
        raise PackageRefused("must hold at least one [servers.<name>] table", SERVERS_FILE)
    if len(servers) > MAX_SERVERS:
        raise PackageRefused(f"may hold at most {MAX_SERVERS} servers", SERVERS_FILE)
    found: list[dict[str, str | None]] = []
    for name, server in sorted(servers.items()):
        if not _ITEM.match(name):
            raise PackageRefused(
                "server names are 1-100 of A-Z, a-z, 0-9, '.', '_' and '-'", SERVERS_FILE
            )
        if not isinstance(server, dict) or ("command" in server) == ("url" in server):
            raise PackageRefused(f"server {name!r} has a command or a url, not both", SERVERS_FILE)
        if "command" in server:
            found.append(
                {
                    "name": name,
                    "executable": _executable(server["command"], SERVERS_FILE),
                    "host": None,
                }
            )
            continue
        found.append({"name": name, "executable": None, "host": _host(name, server["url"])})
    return found


def _host(name: str, url: Any) -> str:
    """The host an MCP server's ``url`` reaches: an http(s) URL with a valid
    host name or IP address and, if any, a port in range."""
    if not _text(url, MAX_URL, _CONTROL_IN_LINE):
        raise PackageRefused(
            f"server {name!r} needs a url of at most {MAX_URL} characters, as text "
            "without control characters",
            SERVERS_FILE,
        )
    try:
        parts = urlsplit(url)
        host, _ = parts.hostname, parts.port
    except ValueError as exc:
        raise PackageRefused(f"server {name!r} has a malformed url ({exc})", SERVERS_FILE) from None
    if parts.scheme not in ("http", "https"):
        raise PackageRefused(f"server {name!r}: its url must be http or https", SERVERS_FILE)
    if not host:
        raise PackageRefused(f"server {name!r} has no host in its url", SERVERS_FILE)
    if not _HOST_NAME.match(host):
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise PackageRefused(
                f"server {name!r}: {host!r} is not a valid host", SERVERS_FILE
            ) from None
    return host
