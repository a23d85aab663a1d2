"""The hardened reader: a well-formed release is inspected and extracted; a
corpus of hostile archives is refused, each with its reason, with nothing
written outside a temporary directory and memory bounded.

Every test here touches no database: they run once, in the SQLite env.
"""

from __future__ import annotations

import gzip
import os
import re
import tarfile
import tracemalloc
import zipfile
from pathlib import Path

import pytest
from buildmax_marketplace.package import Limits, PackageRefused, extract, inspect

from .archives import (
    FILES,
    SKILL_ONLY,
    many_entries_tar,
    member,
    tar_gz,
    zip64_locator_past_the_end,
    zip_file,
)

pytestmark = pytest.mark.engine_independent

REPORT = {
    "skills": ["fix-lint"],
    "subagents": ["reviewer"],
    "hooks": [{"event": "PreToolUse", "executable": "hooks/check.sh"}],
    "mcp_servers": [
        {"name": "docs", "executable": None, "host": "docs.example.com"},
        {"name": "search", "executable": "npx", "host": None},
    ],
    "environment": ["GITHUB_TOKEN"],
}


def everything_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("build", [tar_gz, zip_file], ids=["tar.gz", "zip"])
def test_a_release_is_inspected_and_extracted(tmp_path, build):
    archive = build(tmp_path / "release")
    package = inspect(archive)
    assert (package.name, package.version) == ("lint-helpers", "1.2.0")
    assert package.report == REPORT and package.executable
    assert [p for p, _ in package.files] == sorted(FILES)

    dest = tmp_path / "home" / "plugins" / "lint-helpers"
    assert extract(archive, dest) == package
    for name, content in FILES.items():
        assert (dest / name).read_text() == content
    assert everything_under(tmp_path / "home") == sorted(
        ["plugins", "plugins/lint-helpers"]
        + [f"plugins/lint-helpers/{p}" for p in everything_under(dest)]
    )
    assert not (dest / "skills/fix-lint/SKILL.md").stat().st_mode & 0o111


def test_a_skill_only_release_starts_nothing(tmp_path):
    package = inspect(tar_gz(tmp_path / "notes.tar.gz", SKILL_ONLY))
    assert package.report["hooks"] == [] and package.report["mcp_servers"] == []
    assert not package.executable


HOSTILE = {
    "traversal": (
        [member("../evil.txt", size=3)],
        "'..', '.' or empty path component",
    ),
    "absolute path": ([member("/etc/cron.d/evil", size=3)], "an absolute path"),
    "symlink to /etc/passwd": (
        [member("skills/fix-lint/passwd", tarfile.SYMTYPE, link="/etc/passwd")],
        "a symbolic link (to '/etc/passwd')",
    ),
    "hard link": (
        [member("skills/fix-lint/copy", tarfile.LNKTYPE, link="README.md")],
        "a hard link",
    ),
    "device file": ([member("skills/fix-lint/sda", tarfile.BLKTYPE)], "a device file"),
    "named pipe": ([member("skills/fix-lint/fifo", tarfile.FIFOTYPE)], "a named pipe"),
    "duplicate path": ([member("README.md", size=2)], "duplicate of 'README.md'"),
    "case-folded duplicate": ([member("readme.MD", size=2)], "duplicate of 'README.md'"),
    "undeclared file": ([member("bin/run", size=2)], "a file the manifest does not declare"),
    "undeclared skill": (
        [member("skills/other/SKILL.md", size=2)],
        "a file of a skill the manifest does not declare",
    ),
    "backslash path": ([member("skills\\fix-lint\\x", size=1)], "a backslash"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_tar_is_refused_with_its_reason(tmp_path, case):
    extra, reason = HOSTILE[case]
    archive = tar_gz(tmp_path / "hostile.tar.gz", extra=extra)
    with pytest.raises(PackageRefused) as refused:
        inspect(archive)
    assert reason in str(refused.value)

    home = tmp_path / "home"
    with pytest.raises(PackageRefused):
        extract(archive, home / "plugins" / "lint-helpers")
    assert everything_under(home) == ["plugins"]
    assert not (tmp_path / "evil.txt").exists()


def test_a_symlink_in_a_zip_is_refused(tmp_path):
    path = zip_file(tmp_path / "link.zip")
    with zipfile.ZipFile(path, "a") as archive:
        info = zipfile.ZipInfo("skills/fix-lint/passwd")
        info.external_attr = 0o120777 << 16
        archive.writestr(info, "/etc/passwd")
    with pytest.raises(PackageRefused, match="a symbolic link"):
        inspect(path)


def test_zip_duplicates_and_traversal_are_refused(tmp_path):
    files = {**FILES, "../outside": "x"}
    with pytest.raises(PackageRefused, match=re.escape("'..'")):
        inspect(zip_file(tmp_path / "up.zip", files))
    path = zip_file(tmp_path / "dup.zip")
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("Readme.md", "again")
    with pytest.raises(PackageRefused, match=re.escape("duplicate of 'README.md'")):
        inspect(path)


def test_a_ten_gigabyte_member_is_refused_from_its_header(tmp_path):
    """A tar header declaring 10 GB: refused before a byte of it is read."""
    body = bytearray()
    for name, content in FILES.items():
        data = content.encode()
        info = tarfile.TarInfo(name)
        info.size = len(data)
        body += info.tobuf() + data + b"\0" * (-len(data) % 512)
    huge = tarfile.TarInfo("skills/fix-lint/huge.bin")
    huge.size = 10 * 1024**3
    body += huge.tobuf(format=tarfile.GNU_FORMAT)
    path = tmp_path / "bomb.tar.gz"
    path.write_bytes(gzip.compress(bytes(body)))
    with pytest.raises(PackageRefused, match="bytes when extracted"):
        inspect(path)


@pytest.mark.parametrize("build", [tar_gz, zip_file], ids=["tar.gz", "zip"])
def test_a_compression_bomb_is_refused_in_bounded_memory(tmp_path, build):
    files = {**FILES, "skills/fix-lint/zeros.bin": b"\0" * (64 * 1024 * 1024)}
    archive = build(tmp_path / "bomb", files)
    assert archive.stat().st_size < 1024 * 1024
    tracemalloc.start()
    try:
        with pytest.raises(PackageRefused, match="compression ratio above 200:1"):
            extract(archive, tmp_path / "home" / "x")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024, peak
    assert everything_under(tmp_path / "home") == []


def test_too_many_entries_are_refused(tmp_path):
    tar = many_entries_tar(tmp_path / "many.tar.gz", 100_000)
    with pytest.raises(PackageRefused, match="more than 2000 entries"):
        inspect(tar)
    many = {f"skills/fix-lint/f{i}.txt": "" for i in range(100_000)}
    zipped = zip_file(tmp_path / "many.zip", {**FILES, **many}, zipfile.ZIP_STORED)
    tracemalloc.start()
    try:
        with pytest.raises(PackageRefused, match="more than 2000 entries"):
            inspect(zipped)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024, peak


@pytest.mark.parametrize(
    "manifest, reason",
    [
        (None, "no buildmax-plugin.toml"),
        ('name = "Bad Name"\nversion = "1"\n', "name must be"),
        ('name = "x"\nversion = "one"\n', "not a PEP 440 version"),
        ('name = "x"\nversion = "1"\n[contributes]\nskills = ["note", "fix-lint"]\n', None),
        ('name = "x"\nversion = "1"\n[contributes]\nthemes = []\n', "unknown keys: themes"),
        ('name = "x"\nversion = "1"\n[contributes]\nenvironment = ["lower"]\n', "environment"),
        ("name = ", "not valid TOML"),
    ],
)
def test_a_manifest_that_does_not_match_is_refused(tmp_path, manifest, reason):
    files = dict(SKILL_ONLY)
    del files["buildmax-plugin.toml"]
    if manifest is not None:
        files["buildmax-plugin.toml"] = manifest
    with pytest.raises(PackageRefused) as refused:
        inspect(tar_gz(tmp_path / "m.tar.gz", files))
    # A manifest naming a skill whose files are absent or other: its reason.
    assert (reason or "skill 'fix-lint' has no skills/fix-lint/SKILL.md") in str(refused.value)


def test_declared_hooks_must_exist_and_undeclared_ones_are_refused(tmp_path):
    files = dict(FILES)
    del files["hooks/hooks.toml"]
    with pytest.raises(PackageRefused, match=re.escape("hooks are declared but hooks/hooks.toml")):
        inspect(tar_gz(tmp_path / "a.tar.gz", files))
    files = {**SKILL_ONLY, "hooks/hooks.toml": FILES["hooks/hooks.toml"]}
    with pytest.raises(PackageRefused, match="hooks the manifest does not declare"):
        inspect(tar_gz(tmp_path / "b.tar.gz", files))


def test_a_member_shorter_than_its_header_is_refused(tmp_path):
    body = bytearray()
    info = tarfile.TarInfo("buildmax-plugin.toml")
    info.size = 500
    body += info.tobuf() + b'name = "x"\n'
    path = tmp_path / "short.tar.gz"
    path.write_bytes(gzip.compress(bytes(body)))
    with pytest.raises(PackageRefused):
        inspect(path)


def test_not_an_archive_and_an_existing_destination(tmp_path):
    junk = tmp_path / "junk"
    junk.write_bytes(os.urandom(100))
    with pytest.raises(PackageRefused, match=re.escape("not a .tar.gz or .zip")):
        inspect(junk)
    dest = tmp_path / "there"
    dest.mkdir()
    with pytest.raises(FileExistsError):
        extract(tar_gz(tmp_path / "ok.tar.gz"), dest)


def test_limits_are_configurable(tmp_path):
    archive = tar_gz(tmp_path / "ok.tar.gz")
    with pytest.raises(PackageRefused, match="more than 3 entries"):
        inspect(archive, Limits(max_entries=3))
    with pytest.raises(PackageRefused, match="more than 10 bytes"):
        inspect(archive, Limits(max_total_bytes=10))


def test_an_oversized_tar_header_is_cut_off_while_decompressing(tmp_path):
    """A pax header of 1 MiB (headers are read whole by ``tarfile``): the
    decompressed stream stops at the limits' budget."""
    path = tmp_path / "pax.tar.gz"
    with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as archive:
        info = tarfile.TarInfo("README.md")
        info.pax_headers = {"comment": "x" * 1024 * 1024}
        archive.addfile(info, None)
    with pytest.raises(PackageRefused, match="more bytes than the limits allow"):
        inspect(path, Limits(max_entries=10, max_total_bytes=1000))


def test_a_bzip2_zip_entry_is_refused_before_it_inflates(tmp_path):
    """``zipfile`` bounds only deflate: a 2 KB bzip2 entry could inflate to
    gigabytes. Only stored and deflate are read."""
    path = tmp_path / "bz.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_BZIP2) as archive:
        for name, content in SKILL_ONLY.items():
            archive.writestr(name, content)
    with pytest.raises(PackageRefused, match="a method other than stored or deflate"):
        inspect(path)


def test_an_encrypted_zip_entry_and_a_directory_with_data_are_refused(tmp_path):
    path = zip_file(tmp_path / "enc.zip", SKILL_ONLY)
    raw = bytearray(path.read_bytes())
    # Set the encryption bit of every local and central header.
    for signature, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = raw.find(signature)
        while at >= 0:
            raw[at + offset] |= 0x1
            at = raw.find(signature, at + 4)
    path.write_bytes(bytes(raw))
    with pytest.raises(PackageRefused, match="an encrypted entry"):
        inspect(path)

    folder = tmp_path / "dir.zip"
    with zipfile.ZipFile(folder, "w") as archive:
        for name, content in SKILL_ONLY.items():
            archive.writestr(name, content)
        info = zipfile.ZipInfo("skills/note/stash/")
        info.external_attr = 0o040755 << 16
        archive.writestr(info, b"hidden bytes")
    with pytest.raises(PackageRefused, match="a directory entry holding data"):
        inspect(folder)


def test_a_tarball_of_a_directory_with_dot_slash_names_is_read(tmp_path):
    """``tar -C dir -czf x.tar.gz .`` writes ``./`` and ``./name``."""
    source = tmp_path / "src"
    for name, content in SKILL_ONLY.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(content)
    path = tmp_path / "dot.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        archive.add(source, arcname=".")
    package = inspect(path)
    assert [p for p, _ in package.files] == sorted(SKILL_ONLY)
    dest = tmp_path / "out"
    extract(path, dest)
    assert (dest / "skills/note/SKILL.md").read_text() == SKILL_ONLY["skills/note/SKILL.md"]


@pytest.mark.parametrize(
    "extra, reason",
    [
        ([member("skills/note/x", size=1), member("skills/note/x/y", size=1)], "is a file"),
        ([member("skills/note/x/y", size=1), member("skills/note/x", size=1)], "needs a directory"),
        (
            [
                member("skills/note/caf\u00e9.md", size=1),
                member("skills/note/cafe\u0301.md", size=1),
            ],
            "duplicate of",
        ),
    ],
    ids=["file then its child", "child then a file", "unicode normalisation"],
)
def test_conflicting_paths_are_refused(tmp_path, extra, reason):
    with pytest.raises(PackageRefused, match=reason):
        inspect(tar_gz(tmp_path / "c.tar.gz", SKILL_ONLY, extra=extra))


def test_a_zip_device_entry_is_refused(tmp_path):
    path = zip_file(tmp_path / "dev.zip", SKILL_ONLY)
    with zipfile.ZipFile(path, "a") as archive:
        info = zipfile.ZipInfo("skills/note/dev")
        info.external_attr = 0o020644 << 16
        archive.writestr(info, b"")
    with pytest.raises(PackageRefused, match="not a regular file or a directory"):
        inspect(path)


def _servers(url: str) -> str:
    return f'[servers.remote]\nurl = "{url}"\n'


DEEP = 2000
#: A hostile manifest, hooks file or servers file: (file, its text, the reason).
HOSTILE_TOML = {
    "nested arrays in the manifest": (
        "buildmax-plugin.toml",
        FILES["buildmax-plugin.toml"] + "x = " + "[" * DEEP + "]" * DEEP + "\n",
        "nested deeper than",
    ),
    "nested inline tables in the manifest": (
        "buildmax-plugin.toml",
        FILES["buildmax-plugin.toml"].replace(
            "[contributes]", "y = " + "{a = " * DEEP + "1" + "}" * DEEP + "\n[contributes]"
        ),
        "nested deeper than",
    ),
    "nested but within the recursion limit": (
        "buildmax-plugin.toml",
        'x = [[[[[[[[[[[[[[[[[["deep"]]]]]]]]]]]]]]]]]]\n' + FILES["buildmax-plugin.toml"],
        "nested deeper than 16 levels",
    ),
    "nested arrays in the servers file": (
        "mcp/servers.toml",
        "x = " + "[" * DEEP + "]" * DEEP + "\n" + FILES["mcp/servers.toml"],
        "nested deeper than",
    ),
    "nested arrays in the hooks file": (
        "hooks/hooks.toml",
        "x = " + "[" * DEEP + "]" * DEEP + "\n" + FILES["hooks/hooks.toml"],
        "nested deeper than",
    ),
    "an integer of 5000 digits": (
        "buildmax-plugin.toml",
        "x = 1" + "0" * 5000 + "\n" + FILES["buildmax-plugin.toml"],
        "not valid TOML",
    ),
    "a version of 5000 digits": (
        "buildmax-plugin.toml",
        FILES["buildmax-plugin.toml"].replace('"1.2.0"', '"1.' + "9" * 5000 + '"'),
        "version must be",
    ),
    "a version that is a number": (
        "buildmax-plugin.toml",
        FILES["buildmax-plugin.toml"].replace('"1.2.0"', "1.10"),
        "version must be",
    ),
    "a NUL in the description": (
        "buildmax-plugin.toml",
        FILES["buildmax-plugin.toml"].replace("for linting", "for\\u0000linting"),
        "description must be",
    ),
    "too many environment names": (
        "buildmax-plugin.toml",
        FILES["buildmax-plugin.toml"].replace(
            '["GITHUB_TOKEN"]', "[" + ", ".join(f'"V{i}"' for i in range(1001)) + "]"
        ),
        "contributes.environment must be",
    ),
    "an unclosed IPv6 bracket": ("mcp/servers.toml", _servers("http://[::1/mcp"), "malformed url"),
    "an IPv6 host that is not one": ("mcp/servers.toml", _servers("http://[zz]/"), "malformed url"),
    "a port out of range": ("mcp/servers.toml", _servers("https://a.example:99999/"), "malformed"),
    "a port that is not a number": (
        "mcp/servers.toml",
        _servers("https://a.example:x/"),
        "malformed",
    ),
    "a file url": ("mcp/servers.toml", _servers("file:///etc/passwd"), "http or https"),
    "a javascript url": ("mcp/servers.toml", _servers("javascript:alert(1)"), "http or https"),
    "a host with a space": (
        "mcp/servers.toml",
        _servers("http://a b.example/"),
        "not a valid host",
    ),
    "a url with a newline": (
        "mcp/servers.toml",
        _servers("http://a.example/\\n"),
        "a url of at most",
    ),
    "a url that is a table": (
        "mcp/servers.toml",
        "[servers.x.url]\nhost = 1\n",
        "a url of at most",
    ),
    "a server name with a slash": (
        "mcp/servers.toml",
        '[servers."../x"]\ncommand = "run"\n',
        "server names are",
    ),
    "too many servers": (
        "mcp/servers.toml",
        "".join(f'[servers.s{i}]\ncommand = "run"\n' for i in range(101)),
        "at most 100 servers",
    ),
    "a servers table that is a list": ("mcp/servers.toml", "servers = [1, 2]\n", "at least one"),
    "a hook event that is a table": (
        "hooks/hooks.toml",
        '[[hooks]]\ncommand = "x"\n[hooks.event]\na = 1\n',
        "names an event",
    ),
    "a hook event with a slash": (
        "hooks/hooks.toml",
        '[[hooks]]\nevent = "../Pre"\ncommand = "x"\n',
        "names an event",
    ),
    "a hook command of 5000 characters": (
        "hooks/hooks.toml",
        '[[hooks]]\nevent = "Pre"\ncommand = "' + "x" * 5000 + '"\n',
        "a command must be",
    ),
    "a hook command with a NUL": (
        "hooks/hooks.toml",
        '[[hooks]]\nevent = "Pre"\ncommand = "run\\u0000 x"\n',
        "a command must be",
    ),
    "too many hooks": (
        "hooks/hooks.toml",
        '[[hooks]]\nevent = "Pre"\ncommand = "x"\n' * 101,
        "at most 100 hooks",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_TOML))
def test_a_hostile_manifest_hooks_or_servers_file_is_refused_with_its_reason(tmp_path, case):
    """Each case once escaped the reader as RecursionError, ValueError or a
    value the catalog could not store (a NUL on PostgreSQL); the guard of its
    class is named by the reason (drop it and the case raises, or passes)."""
    path, text, reason = HOSTILE_TOML[case]
    archive = tar_gz(tmp_path / "t.tar.gz", {**FILES, path: text})
    with pytest.raises(PackageRefused) as refused:
        inspect(archive)
    assert refused.value.path == path
    assert reason in refused.value.reason, refused.value.reason
    home = tmp_path / "home"
    with pytest.raises(PackageRefused):
        extract(archive, home / "plugins" / "lint-helpers")
    assert everything_under(home) == ["plugins"]


@pytest.mark.parametrize(
    "url, host",
    [
        ("https://docs.example.com/mcp", "docs.example.com"),
        ("http://[::1]:8080/mcp", "::1"),
        ("https://10.0.0.7/", "10.0.0.7"),
        ("https://Docs.Example.COM:443/x?y=1", "docs.example.com"),
    ],
)
def test_a_well_formed_server_url_reports_its_host(tmp_path, url, host):
    archive = tar_gz(tmp_path / "u.tar.gz", {**FILES, "mcp/servers.toml": _servers(url)})
    (server,) = inspect(archive).report["mcp_servers"]
    assert server == {"name": "remote", "executable": None, "host": host}


def test_any_other_failure_of_a_parser_is_a_refusal_not_a_crash(tmp_path, monkeypatch):
    """The reader's backstop: a parser failing in a way no guard foresaw
    (here ``tomllib`` raising ``IndexError``) is a refusal naming it
    (mutation: drop the backstop in ``_read`` and the IndexError escapes)."""
    import buildmax_marketplace.package as package

    def broken(text: str) -> None:
        raise IndexError("a parser bug")

    monkeypatch.setattr(package.tomllib, "loads", broken)
    with pytest.raises(PackageRefused, match=r"could not be read \(IndexError: a parser bug\)"):
        inspect(tar_gz(tmp_path / "ok.tar.gz"))


#: Archives that escaped the reader, or that inspection accepted and no
#: extraction could write: (how to build it, a word of the reason).
UNWRITABLE = {
    "a name that is not UTF-8": (
        lambda p: tar_gz(p, SKILL_ONLY, [member("skills/note/\udcff.txt", size=1)]),
        "skills/note/\\udcff.txt: a path that is not UTF-8",
    ),
    "an undeclared name that is not UTF-8": (
        lambda p: tar_gz(p, SKILL_ONLY, [member("\udcfe", size=1)]),
        "\\udcfe: a path that is not UTF-8",
    ),
    "a link whose name is not UTF-8": (
        lambda p: tar_gz(p, SKILL_ONLY, [member("skills/\udcff", tarfile.SYMTYPE, link="x")]),
        "skills/\\udcff: a symbolic link",
    ),
    "a name of 200 two-byte characters": (
        lambda p: tar_gz(p, SKILL_ONLY, [member("skills/note/" + "é" * 200, size=1)]),
        "a path too long",
    ),
    "a path of 1100 bytes": (
        lambda p: tar_gz(p, SKILL_ONLY, [member("skills/note/" + "/".join(["é" * 100] * 6))]),
        "a path too long",
    ),
    "a zip64 locator past the end": (zip64_locator_past_the_end, "a broken zip64 directory"),
}


@pytest.mark.parametrize("case", sorted(UNWRITABLE))
def test_inspection_refuses_what_extraction_could_not_write_in_printable_words(tmp_path, case):
    """A tar name of undecodable bytes made a refusal holding surrogates
    (publish answered 500 encoding it; the name was accepted otherwise), a
    name longer than 255 bytes in fewer characters passed inspection and
    failed every extraction, and a zip64 locator past the largest file
    escaped as ``OSError`` (publish 500). Mutations: drop the surrogate
    check in ``_clean`` or the escaping in ``PackageRefused``, count path
    lengths in characters, or drop the offset check in ``_zip64_directory``."""
    build, reason = UNWRITABLE[case]
    archive = build(tmp_path / ("x.zip" if "zip" in case else "x.tar.gz"))
    with pytest.raises(PackageRefused) as refused:
        inspect(archive)
    assert reason in str(refused.value)
    str(refused.value).encode("utf-8")  # printable and sendable as it is
    home = tmp_path / "home"
    with pytest.raises(PackageRefused):
        extract(archive, home / "plugins" / "notes")
    assert everything_under(home) == ["plugins"]
