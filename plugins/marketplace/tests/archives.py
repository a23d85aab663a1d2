"""Building release archives for the tests: well-formed ones and hostile ones."""

from __future__ import annotations

import gzip
import io
import tarfile
import zipfile
from pathlib import Path

MANIFEST = """\
name = "lint-helpers"
version = "1.2.0"
description = "Skills and a hook for linting"
[contributes]
skills = ["fix-lint"]
agents = ["reviewer"]
hooks = true
mcp_servers = true
environment = ["GITHUB_TOKEN"]
"""
HOOKS = """\
[[hooks]]
event = "PreToolUse"
command = "hooks/check.sh --strict"
"""
SERVERS = """\
[servers.search]
command = "npx search-server --port 0"
[servers.docs]
url = "https://docs.example.com/mcp"
"""
FILES = {
    "buildmax-plugin.toml": MANIFEST,
    "README.md": "# lint helpers\n",
    "skills/fix-lint/SKILL.md": "Fix lint.\n",
    "skills/fix-lint/rules.txt": "E501\n",
    "agents/reviewer.md": "You review.\n",
    "hooks/hooks.toml": HOOKS,
    "hooks/check.sh": "#!/bin/sh\nexit 0\n",
    "mcp/servers.toml": SERVERS,
}
SKILL_ONLY = {
    "buildmax-plugin.toml": 'name = "notes"\nversion = "0.1"\n[contributes]\nskills = ["note"]\n',
    "skills/note/SKILL.md": "Take notes.\n",
}


def _bytes(value: str | bytes) -> bytes:
    return value.encode() if isinstance(value, str) else value


def tar_gz(
    path: Path,
    files: dict[str, str | bytes] | None = None,
    extra: list[tarfile.TarInfo] | None = None,
) -> Path:
    """A ``.tar.gz`` of ``files`` (the full release by default) and ``extra``
    members (links, devices, lying headers) written as given."""
    with tarfile.open(path, "w:gz") as archive:
        for name, content in (FILES if files is None else files).items():
            data = _bytes(content)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755 if name.endswith(".sh") else 0o644
            archive.addfile(info, io.BytesIO(data))
        for info in extra or []:
            archive.addfile(info, io.BytesIO(b"\0" * info.size) if info.isreg() else None)
    return path


def many_entries_tar(path: Path, count: int) -> Path:
    """A ``.tar.gz`` of the full release and ``count`` empty files (headers
    built from one template: ``TarInfo.tobuf`` is slow at this scale)."""
    body = bytearray()
    for name, content in FILES.items():
        data = _bytes(content)
        info = tarfile.TarInfo(name)
        info.size = len(data)
        body += info.tobuf() + data + b"\0" * (-len(data) % 512)
    template = bytearray(tarfile.TarInfo("x").tobuf(format=tarfile.USTAR_FORMAT))
    for i in range(count):
        header = bytearray(template)
        name = f"skills/fix-lint/f{i}.txt".encode()
        header[0:100] = name.ljust(100, b"\0")
        header[148:156] = b" " * 8
        header[148:156] = b"%06o\0 " % sum(header)
        body += header
    body += b"\0" * 1024
    path.write_bytes(gzip.compress(bytes(body), 1))
    return path


def zip_file(
    path: Path, files: dict[str, str | bytes] | None = None, method: int = zipfile.ZIP_DEFLATED
) -> Path:
    """A ``.zip`` of ``files`` (the full release by default)."""
    with zipfile.ZipFile(path, "w", method) as archive:
        for name, content in (FILES if files is None else files).items():
            archive.writestr(name, _bytes(content))
    return path


def member(
    name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, link: str = ""
) -> tarfile.TarInfo:
    """A tar header of any kind."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    info.linkname = link
    return info


def zip64_locator_past_the_end(path: Path) -> Path:
    """A release ``.zip`` whose end record says "see the zip64 directory" and
    whose zip64 locator points 10**15 bytes in, past what a file may hold."""
    data = bytearray(zip_file(path, SKILL_ONLY).read_bytes())
    end = data.rfind(b"PK\x05\x06")
    data[end + 10 : end + 12] = b"\xff\xff"  # entries: in the zip64 record
    locator = b"PK\x06\x07" + (0).to_bytes(4, "little") + (10**15).to_bytes(8, "little")
    path.write_bytes(bytes(data[:end]) + locator + (1).to_bytes(4, "little") + data[end:])
    return path
