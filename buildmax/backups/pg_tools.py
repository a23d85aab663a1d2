"""PostgreSQL's own dump tools, ``pg_dump`` and ``pg_restore``, run for a
backup and a restore.

The tool is looked up in ``pg_bin_dir`` (if set) or on the PATH, and
refused, with what to install, when it is missing or older than the server
(an older ``pg_dump`` cannot read a newer server's catalog). The password
of the database URL is never put on the tool's command line (where any user
of the machine could read it) nor logged: it is written to a passfile
readable by its owner only, named to the tool by ``PGPASSFILE``, and
removed when the tool exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from .layout import BackupError

_VERSION = re.compile(r"\(PostgreSQL\) (\d+)(?:\.(\d+))?")
INSTALL_HINT = "install PostgreSQL's client tools (Debian: postgresql-client) or set pg_bin_dir"


def find_tool(name: str, bin_dir: str = "") -> str:
    """The path of ``pg_dump``/``pg_restore``, or :class:`BackupError`."""
    found = shutil.which(name, path=bin_dir or None)
    if found is None:
        where = bin_dir or "the PATH"
        raise BackupError(f"{name} is not installed (looked in {where}): {INSTALL_HINT}")
    return found


async def tool_major(tool: str) -> int:
    """The major version ``tool --version`` prints."""
    proc = await asyncio.create_subprocess_exec(
        tool, "--version", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    match = _VERSION.search(out.decode(errors="replace"))
    if proc.returncode != 0 or match is None:
        raise BackupError(f"{tool} --version did not say its version: {INSTALL_HINT}")
    return int(match.group(1))


def require_version(tool: str, tool_major_version: int, server_version_num: int) -> None:
    """Refuse a tool older than the server (``server_version_num`` as the
    server reports it: 150004 is 15.4)."""
    server_major = server_version_num // 10000
    if tool_major_version < server_major:
        raise BackupError(
            f"{Path(tool).name} is version {tool_major_version}, older than the PostgreSQL "
            f"server ({server_major}): install the client tools of version {server_major} "
            "or newer, or set pg_bin_dir"
        )


def _without_password(url: str) -> tuple[str, str | None]:
    """``url`` without its password (in the user part or the query), and the password."""
    parts = urlsplit(url.replace("postgres://", "postgresql://", 1))
    password = unquote(parts.password) if parts.password is not None else None
    query = parse_qsl(parts.query, keep_blank_values=True)
    for key, value in query:
        if key == "password":
            password = value
    parts = parts._replace(query=urlencode([(k, v) for k, v in query if k != "password"]))
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    if parts.username:
        netloc = f"{parts.username}@{netloc}"
    return urlunsplit(parts._replace(netloc=netloc)), password


def public_url(url: str) -> str:
    """``url`` without its password, fit for a message."""
    return _without_password(url)[0]


@contextlib.contextmanager
def _passfile(password: str | None, scratch: Path | None) -> Iterator[dict[str, str]]:
    """The tool's environment: with the URL's password in a passfile (in
    ``scratch``, removed with it even if this process is killed), else as
    given (``PGPASSWORD``, ``PGPASSFILE``, ``~/.pgpass``)."""
    env = dict(os.environ)
    if password is None:
        yield env
        return
    env.pop("PGPASSWORD", None)
    escaped = password.replace("\\", "\\\\").replace(":", "\\:")
    fd, name = tempfile.mkstemp(prefix=".pgpass-", dir=scratch)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(f"*:*:*:*:{escaped}\n")
        env["PGPASSFILE"] = name
        yield env
    finally:
        os.unlink(name)


async def run_tool(
    tool: str, url: str, arguments: Sequence[str], *, scratch: Path | None = None
) -> None:
    """Run ``tool`` against the database at ``url`` (its password through a
    passfile, in ``scratch`` if given); :class:`BackupError` with the tool's
    last error line when it fails."""
    dbname, password = _without_password(url)
    with _passfile(password, scratch) as env:
        proc = await asyncio.create_subprocess_exec(
            tool,
            *arguments,
            f"--dbname={dbname}",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
        _, err = await proc.communicate()
    if proc.returncode != 0:
        lines = [line for line in err.decode(errors="replace").splitlines() if line.strip()]
        last = lines[-1] if lines else f"exit status {proc.returncode}"
        raise BackupError(f"{Path(tool).name} failed: {last}")
