"""What every importer needs to read a file safely: its lines, bounded and
decoded one at a time (an encoding error is that line's problem, not the
file's), and labels made into the shape a task's label has.

A file is read as it comes, never whole into memory past
:data:`MAX_FILE_BYTES`; a line past :data:`MAX_LINE_BYTES` is skipped
without being held, and reported with its number.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from buildmax_hookspecs import LABEL_PATTERN, TASK_LABELS, SourceRefused

#: The largest file an import reads.
MAX_FILE_BYTES = 64 * 1024 * 1024
#: The longest line (a JSON record, a CSV row's line) read.
MAX_LINE_BYTES = 1024 * 1024
#: The most records one file may hold, and the most lines (blank ones too).
MAX_RECORDS = 50_000
MAX_LINES = 1_000_000

_LABEL = re.compile(LABEL_PATTERN)
_NOT_LABEL = re.compile(r"[^A-Za-z0-9._:/-]+")


@dataclass(frozen=True)
class Line:
    """Line ``number`` (1-based) of a file, decoded; ``problem`` says why
    it cannot be read: not UTF-8 (``text`` then holds it with U+FFFD for
    each bad byte, so that a CSV row keeps its shape) or too long (``cut``:
    ``text`` is empty)."""

    number: int
    text: str
    problem: str | None = None
    cut: bool = False


def lines(source: BinaryIO) -> Iterator[Line]:
    """The lines of ``source``, without their line ends, each decoded as
    UTF-8 (a byte order mark at the start is skipped). Raises
    :class:`SourceRefused` past :data:`MAX_FILE_BYTES` or when the file is
    empty."""
    total = 0
    number = 0
    while True:
        # The limit is the line's, its end (LF or CR LF) aside.
        raw = source.readline(MAX_LINE_BYTES + 2)
        if not raw:
            break
        number += 1
        if number > MAX_LINES:
            raise SourceRefused(number, f"more than {MAX_LINES:,} lines: split the file")
        total += len(raw)
        ended = raw.endswith(b"\n")
        if number == 1 and not ended and b"\r" in raw.rstrip(b"\r"):
            raise SourceRefused(1, "its lines end in CR alone: save it with LF or CR LF line ends")
        problem = None
        if len(raw.removesuffix(b"\n").removesuffix(b"\r")) > MAX_LINE_BYTES:
            if not ended:
                total += _skip_rest_of_line(source)
            problem = f"the line is longer than {MAX_LINE_BYTES // 1024 // 1024} MiB"
        if total > MAX_FILE_BYTES:
            raise SourceRefused(
                number, f"the file is larger than {MAX_FILE_BYTES // 1024 // 1024} MiB"
            )
        if problem is not None:
            yield Line(number, "", problem, cut=True)
            continue
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            where = f"0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line"
            replaced = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            yield Line(number, replaced, f"not UTF-8 text: {where}")
            continue
        yield Line(number, text.rstrip("\r\n"))
    if number == 0:
        raise SourceRefused(1, "the file is empty")


def _skip_rest_of_line(source: BinaryIO) -> int:
    skipped = 0
    while True:
        chunk = source.readline(MAX_LINE_BYTES)
        skipped += len(chunk)
        if not chunk or chunk.endswith(b"\n") or skipped > MAX_FILE_BYTES:
            return skipped


def label(value: str) -> str | None:
    """``value`` in the shape of a task label (letters, digits and
    ``. _ : / -``, at most 64, starting with a letter or digit): runs of
    other characters become ``-``; ``None`` when nothing is left."""
    shaped = _NOT_LABEL.sub("-", value.strip()).strip("-._:/")[:64].rstrip("-")
    return shaped if _LABEL.fullmatch(shaped) else None


def labels(values: list[str], warnings: list[str]) -> tuple[str, ...]:
    """``values`` as task labels (:func:`label`), each once, the first
    :data:`TASK_LABELS`; what was changed or left out is said in
    ``warnings``."""
    kept: dict[str, None] = {}
    for number, value in enumerate(values):
        if len(kept) == TASK_LABELS:
            warnings.append(f"{len(values) - number} labels past the first {TASK_LABELS} left out")
            break
        shaped = label(value)
        if shaped is None:
            warnings.append(f"label {value[:80]!r} has no letter or digit to keep: left out")
            continue
        if shaped != value:
            warnings.append(f"label {value[:80]!r} imported as {shaped!r}")
        kept[shaped] = None
    return tuple(kept)


def text(value: object) -> str | None:
    """``value`` when it is a string, ``None`` when it is not."""
    return value if isinstance(value, str) else None


def unknown(names: set[str], known: frozenset[str]) -> list[str]:
    """The warning for ``names`` a source does not have, if any (the first
    ten, each as :func:`printable`)."""
    extra = sorted(names - known)
    return [f"fields not imported: {some(extra)}"] if extra else []


def some(names: list[str], shown: int = 10) -> str:
    """``names`` for a message: the first ``shown`` of them (each as
    :func:`printable`, cut to 80 characters), then how many more."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(printable(name)[:80] for name in names[:shown]) + more


def printable(text: str) -> str:
    """``text`` with what no text may hold (a NUL, half of a surrogate
    pair) made U+FFFD: for naming a file's words in a message."""
    return (
        text.encode("utf-8", "surrogatepass").decode("utf-8", "replace").replace("\x00", "\ufffd")
    )
