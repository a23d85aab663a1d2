"""The hardened reader against generated archives: whatever hypothesis
builds (hostile names, links, devices, duplicates, wrong sizes, junk
bytes), extraction either succeeds into its target or refuses cleanly with
:class:`PackageRefused`; it never crashes, hangs, or writes outside the
target.

``BUILDMAX_FUZZ_EXAMPLES`` sets the number of cases (200 here in the
``py`` run; the ``fuzz`` tox env runs 5,000).
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
import warnings
import zipfile
from pathlib import Path

import pytest
from buildmax_marketplace.package import Limits, PackageRefused, extract
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .archives import SKILL_ONLY

pytestmark = pytest.mark.engine_independent

EXAMPLES = int(os.environ.get("BUILDMAX_FUZZ_EXAMPLES", "200"))
LIMITS = Limits(max_entries=50, max_total_bytes=64 * 1024, max_ratio=1000)

segment = st.one_of(
    st.sampled_from(["..", ".", "", "skills", "note", "SKILL.md", "agents", "hooks", "a", "A"]),
    st.text(
        alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=8
    ),
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
            info = zipfile.ZipInfo(path + ("/" if what == "dir" else ""))
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
            package = extract(source, dest, LIMITS)
        except PackageRefused as refused:
            assert refused.reason
            assert not dest.exists()
        else:
            extracted = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
            assert extracted == sorted(path for path, _ in package.files)
            assert not any(p.is_symlink() for p in dest.rglob("*"))
        assert _outside(root, dest) == []
