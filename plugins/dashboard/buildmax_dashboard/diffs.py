"""Unified diffs (``git diff``, ``diff -u``) read into files, hunks and
numbered lines, so that a page shows them as diffs and a finding can name
the path and the line it is about (the new file's line number)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
#: Most lines rendered of one diff (the rest: download it).
MAX_LINES = 20_000


@dataclass
class Line:
    """One line of a hunk: ``add``, ``del`` or ``ctx`` (or ``note`` for
    "\\ No newline at end of file"), with its numbers in the old and new file."""

    kind: str
    text: str
    old: int | None
    new: int | None

    @property
    def anchor(self) -> int | None:
        """The line a finding names: the new file's (a finding has no side,
        so a removed line, which the new file lacks, takes none)."""
        return self.new


@dataclass
class Hunk:
    """One ``@@`` section; ``old_left`` and ``new_left`` count the lines its
    header announced and parsing has not met yet."""

    header: str
    old_left: int
    new_left: int
    lines: list[Line] = field(default_factory=list)

    @property
    def open(self) -> bool:
        """Whether the hunk still expects lines (so a line ``--- x`` in it
        is a removed line, not the next file's header)."""
        return self.old_left > 0 or self.new_left > 0


@dataclass
class FileDiff:
    """The changes to one file."""

    path: str
    old_path: str | None
    hunks: list[Hunk] = field(default_factory=list)


@dataclass
class Diff:
    """A parsed diff; ``truncated`` when it had more than :data:`MAX_LINES`."""

    files: list[FileDiff]
    truncated: bool = False


def _path(raw: str) -> str | None:
    name = raw.split("\t")[0].strip()
    if name == "/dev/null":
        return None
    if name.startswith(("a/", "b/")):
        name = name[2:]
    return name


def parse(text: str) -> Diff:
    """The files, hunks and lines of a unified diff; lines outside any file
    (a commit message, ``diff --git`` headers) are left out."""
    files: list[FileDiff] = []
    current: FileDiff | None = None
    hunk: Hunk | None = None
    old_path: str | None = None
    old = new = 0
    count = 0
    # Lines end at "\n" only: a form feed or U+2028 inside a line is its text.
    for raw in (line.removesuffix("\r") for line in text.split("\n")):
        if raw.startswith("--- ") and (hunk is None or not hunk.open):
            old_path, hunk = _path(raw[4:]), None
            continue
        if raw.startswith("+++ ") and (hunk is None or not hunk.open):
            path = _path(raw[4:]) or old_path or "?"
            current = FileDiff(path, old_path)
            files.append(current)
            hunk = None
            continue
        found = _HUNK.match(raw)
        if found and current is not None:
            old, new = int(found.group(1)), int(found.group(3))
            hunk = Hunk(raw, int(found.group(2) or 1), int(found.group(4) or 1))
            current.hunks.append(hunk)
            continue
        if hunk is None:
            continue
        if not hunk.open and not raw.startswith("\\"):
            hunk = None  # every line its header announced has come
            continue
        count += 1
        if count > MAX_LINES:
            return Diff(files, truncated=True)
        if raw.startswith("+"):
            hunk.lines.append(Line("add", raw[1:], None, new))
            new += 1
            hunk.new_left -= 1
        elif raw.startswith("-"):
            hunk.lines.append(Line("del", raw[1:], old, None))
            old += 1
            hunk.old_left -= 1
        elif raw.startswith("\\"):
            hunk.lines.append(Line("note", raw[1:].strip(), None, None))
        elif raw.startswith(" ") or raw == "":
            hunk.lines.append(Line("ctx", raw[1:], old, new))
            old += 1
            new += 1
            hunk.old_left -= 1
            hunk.new_left -= 1
        else:
            hunk = None  # the hunk ended (a header of the next file follows)
    return Diff(files)


def is_diff(name: str, media_type: str) -> bool:
    """Whether an artifact is shown as a diff."""
    return media_type in ("text/x-diff", "text/x-patch") or name.endswith((".diff", ".patch"))
