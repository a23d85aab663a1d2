"""The hardened reader against generated archives: whatever hypothesis
builds (hostile names, links, devices, duplicates, wrong sizes, junk
bytes; manifests, hooks and MCP-server files nested deeply, of wrong
types, with malformed URLs and oversized values), extraction either
succeeds into its target or refuses cleanly with :class:`PackageRefused`;
it never crashes, hangs, or writes outside the target.

``BUILDMAX_FUZZ_EXAMPLES`` sets the number of cases (200 here in the
``py`` run; the ``fuzz`` tox env runs 5,000).
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import tempfile
import warnings
import zipfile
from pathlib import Path

import pytest
from buildmax_marketplace.package import Limits, Package, PackageRefused, extract, inspect
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .archives import FILES, SKILL_ONLY

EXAMPLES = int(os.environ.get("BUILDMAX_FUZZ_EXAMPLES", "200"))
# About 25 ms a case on a busy machine: the fuzz env's 5,000 take minutes.
pytestmark = [pytest.mark.engine_independent, pytest.mark.timeout(max(120, EXAMPLES // 20))]
LIMITS = Limits(max_entries=50, max_total_bytes=64 * 1024, max_ratio=1000)

segment = st.one_of(
    st.sampled_from(["..", ".", "", "skills", "note", "SKILL.md", "agents", "hooks", "a", "A"]),
    st.text(
        alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=8
    ),
    # Bytes that are not UTF-8 (a tar name holds any), and names longer in
    # bytes than in characters.
    st.text(alphabet=st.characters(min_codepoint=0xDC80, max_codepoint=0xDCFF), min_size=1),
    st.sampled_from(["é" * 128, "€" * 85, "😀" * 64]),
)
name = st.one_of(
    st.lists(segment, min_size=1, max_size=4).map("/".join),
    st.sampled_from(["/etc/passwd", "C:/x", "skills\\note\\x", "skills/note/SKILL.md"]),
)
kind = st.sampled_from(["file", "file", "file", "dir", "symlink", "hardlink", "fifo", "device"])
entry = st.tuples(name, kind, st.binary(max_size=64), st.integers(min_value=-2, max_value=2))


def _tar(entries: list[tuple[str, str, bytes, int]]) -> bytes:
    out = io.BytesIO()
    types = {
        "file": tarfile.REGTYPE,
        "dir": tarfile.DIRTYPE,
        "symlink": tarfile.SYMTYPE,
        "hardlink": tarfile.LNKTYPE,
        "fifo": tarfile.FIFOTYPE,
        "device": tarfile.CHRTYPE,
    }
    with tarfile.open(fileobj=out, mode="w:gz", format=tarfile.PAX_FORMAT) as archive:
        for path, what, data, skew in entries:
            info = tarfile.TarInfo(path)
            info.type = types[what]
            info.linkname = "../../etc/passwd" if what in ("symlink", "hardlink") else ""
            if what == "file":
                info.size = len(data)
                # A skewed header only where the data stays readable.
                archive.addfile(info, io.BytesIO(data + b"\0" * max(skew, 0)))
            else:
                archive.addfile(info)
    return out.getvalue()


def _zip(entries: list[tuple[str, str, bytes, int]]) -> bytes:
    out = io.BytesIO()
    with (
        warnings.catch_warnings(),  # duplicate names are the point
        zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive,
    ):
        warnings.simplefilter("ignore")
        for path, what, data, _ in entries:
            # A zip name is UTF-8 or cp437: undecodable bytes do not go in one.
            name = path.encode("utf-8", "replace").decode("utf-8")
            info = zipfile.ZipInfo(name + ("/" if what == "dir" else ""))
            if what == "symlink":
                info.external_attr = 0o120777 << 16
            elif what in ("fifo", "device"):
                info.external_attr = (0o010644 if what == "fifo" else 0o020644) << 16
            archive.writestr(info, b"" if what == "dir" else data)
    return out.getvalue()


def _outside(root: Path, allowed: Path) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path == allowed or path in allowed.parents or allowed in path.parents:
            continue
        if path.name == "release":
            continue
        found.append(str(path.relative_to(root)))
    return found


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    entries=st.lists(entry, max_size=12),
    with_release=st.booleans(),
    form=st.sampled_from(["tar", "zip", "junk"]),
    junk=st.binary(max_size=200),
    cut=st.integers(min_value=0, max_value=64),
)
def test_generated_archives_extract_or_are_refused_cleanly(entries, with_release, form, junk, cut):
    if with_release:
        entries = [(p, "file", c.encode(), 0) for p, c in SKILL_ONLY.items()] + entries
    if form == "tar":
        data = _tar(entries)
    elif form == "zip":
        data = _zip(entries)
    else:
        data = junk
    if cut:
        data = data[: max(len(data) - cut, 0)] if cut % 2 else data
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        source = root / "release"
        source.write_bytes(data)
        dest = root / "home" / "plugins" / "x"
        try:
            inspected: Package | PackageRefused = inspect(source, LIMITS)
        except PackageRefused as refused:
            inspected = refused
        try:
            package = extract(source, dest, LIMITS)
        except PackageRefused as refused:
            assert refused.reason
            assert not dest.exists()
            # Publish sends the refusal as JSON, the commands print it.
            str(refused).encode("utf-8")
            # What publishing accepts, every worker extracts.
            assert isinstance(inspected, PackageRefused), (str(refused), inspected)
        else:
            assert inspected == package
            extracted = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
            assert extracted == sorted(path for path, _ in package.files)
            assert not any(p.is_symlink() for p in dest.rglob("*"))
        assert _outside(root, dest) == []


# -- the manifest, the hooks file and the MCP-server file ---------------------------

scheme = st.sampled_from(["http", "https", "HTTPS", "ftp", "file", "javascript", "ws", ""])
host = st.one_of(
    st.sampled_from(
        ["example.com", "10.0.0.7", "[::1]", "[::1", "::1]", "[zz]", "[fe80::1%eth0]", "a b", ""]
    ),
    st.text(max_size=12),
)
port = st.one_of(
    st.sampled_from(["", ":0", ":443", ":65535", ":65536", ":99999", ":x", ":-1", ":"]),
    st.integers(min_value=-(10**30), max_value=10**30).map(lambda n: f":{n}"),
)
structured_url = st.builds(
    lambda s, h, p, rest: f"{s}://{h}{p}/{rest}", scheme, host, port, st.text(max_size=8)
)
url = st.one_of(
    structured_url,
    structured_url,
    structured_url,
    st.builds(lambda s, rest: f"{s}:{rest}", scheme, st.text(max_size=16)),
    st.text(max_size=40),
)
scalar = st.one_of(
    st.text(max_size=20),
    url,
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["1.2.0", "one", "1." + "9" * 5000, "x" * 3000, "a\x00b", "lint-helpers"]),
)
value = st.recursive(
    scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


def _toml_value(item: object) -> str:
    """``item`` as a TOML value (inline tables and arrays; floats TOML spells itself)."""
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, float):
        if item != item:
            return "nan"
        if item in (float("inf"), float("-inf")):
            return "inf" if item > 0 else "-inf"
        return repr(item)
    if isinstance(item, int):
        return str(item)
    if isinstance(item, str):
        return json.dumps(item, ensure_ascii=False)
    if isinstance(item, list):
        return "[" + ", ".join(_toml_value(v) for v in item) + "]"
    assert isinstance(item, dict)
    return "{" + ", ".join(f"{_key(k)} = {_toml_value(v)}" for k, v in item.items()) + "}"


def _key(key: str) -> str:
    return json.dumps(key, ensure_ascii=False)


def _toml(table: dict[str, object]) -> str:
    return "".join(f"{_key(k)} = {_toml_value(v)}\n" for k, v in table.items())


def _nested(depth: int, inline_tables: bool) -> str:
    if inline_tables:
        return "{a = " * depth + "1" + "}" * depth
    return "[" * depth + "]" * depth


manifest = st.fixed_dictionaries(
    {
        "name": st.one_of(st.just("lint-helpers"), value),
        "version": st.one_of(st.just("1.2.0"), value),
    },
    optional={
        "description": value,
        "contributes": st.one_of(
            st.just(
                {
                    "skills": ["fix-lint"],
                    "agents": ["reviewer"],
                    "hooks": True,
                    "mcp_servers": True,
                    "environment": ["GITHUB_TOKEN"],
                }
            ),
            st.dictionaries(
                st.sampled_from(["skills", "agents", "hooks", "mcp_servers", "environment", "x"]),
                value,
            ),
        ),
        "extra": value,
    },
)
hook = st.one_of(
    st.fixed_dictionaries({"event": st.one_of(st.just("PreToolUse"), value), "command": value}),
    value,
)
hooks_file = st.one_of(
    st.fixed_dictionaries({"hooks": st.lists(hook, max_size=4)}),
    st.fixed_dictionaries({"hooks": st.lists(hook, max_size=4)}),
    st.dictionaries(st.text(max_size=6), value, max_size=3),
)
server = st.one_of(
    st.fixed_dictionaries({"url": url}),
    st.fixed_dictionaries({"url": url}),
    st.fixed_dictionaries({"command": st.one_of(st.just("npx search"), value)}),
    st.dictionaries(st.sampled_from(["url", "command", "args"]), value, max_size=3),
    value,
)
servers_table = st.fixed_dictionaries(
    {
        "servers": st.dictionaries(
            st.one_of(st.sampled_from(["docs", "search"]), st.text(max_size=8)),
            server,
            min_size=1,
            max_size=4,
        )
    }
)
servers_file = st.one_of(
    servers_table,
    servers_table,
    servers_table,
    st.dictionaries(st.text(max_size=6), value, max_size=3),
)
toml_text = {
    "buildmax-plugin.toml": manifest.map(_toml),
    "hooks/hooks.toml": hooks_file.map(_toml),
    "mcp/servers.toml": servers_file.map(_toml),
}


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    generated=st.one_of(*(st.tuples(st.just(path), text) for path, text in toml_text.items())),
    depth=st.one_of(st.just(0), st.integers(min_value=1, max_value=3000)),
    inline_tables=st.booleans(),
    padding=st.sampled_from([0, 0, 0, 200 * 1024, 300 * 1024]),
    form=st.sampled_from(["tar", "zip"]),
)
def test_generated_manifests_hooks_and_server_files_are_read_or_refused_cleanly(
    generated, depth, inline_tables, padding, form
):
    """One of the three TOML files of a full release is generated (wrong
    types, hostile URLs, huge numbers), nested ``depth`` levels deep and
    padded past the size limit; the reader reports it or refuses it with
    a reason, nothing else. (What extraction writes is the archive test's
    concern: here the archive is only inspected.)"""
    path, text = generated
    if depth:
        text = f"deep = {_nested(depth, inline_tables)}\n" + text
    if padding:
        text = "# " + "x" * padding + "\n" + text
    entries = [(p, "file", (text if p == path else c).encode(), 0) for p, c in FILES.items()]
    with tempfile.NamedTemporaryFile() as source:
        source.write(_tar(entries) if form == "tar" else _zip(entries))
        source.flush()
        try:
            package = inspect(Path(source.name))
        except PackageRefused as refused:
            assert refused.reason
            return
    report = json.loads(json.dumps(package.report))
    assert report == package.report
    assert all(server["host"] or server["executable"] for server in report["mcp_servers"])
    assert "\x00" not in json.dumps(report, ensure_ascii=False) + package.description
