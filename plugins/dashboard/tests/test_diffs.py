"""Reading unified diffs: numbering, what ends a line, what ends a hunk,
the bound, and which lines a finding can name."""

from __future__ import annotations

import pytest
from buildmax_dashboard import diffs

pytestmark = pytest.mark.engine_independent


def _lines(diff: diffs.Diff) -> list[tuple[str, int | None, int | None, str]]:
    return [
        (line.kind, line.old, line.new, line.text)
        for file in diff.files
        for hunk in file.hunks
        for line in hunk.lines
    ]


def test_lines_are_numbered_in_the_old_and_the_new_file():
    diff = diffs.parse("--- a/x.py\n+++ b/x.py\n@@ -1,3 +1,3 @@\n keep\n-old\n+new\n last\n")
    assert [f.path for f in diff.files] == ["x.py"]
    assert _lines(diff) == [
        ("ctx", 1, 1, "keep"),
        ("del", 2, None, "old"),
        ("add", None, 2, "new"),
        ("ctx", 3, 3, "last"),
    ]
    # A finding names the new file's line: a removed line offers none.
    assert [line.anchor for h in diff.files[0].hunks for line in h.lines] == [1, None, 2, 3]


def test_a_line_ends_at_a_newline_only():
    text = (
        "--- a/s.c\n+++ b/s.c\n@@ -1,2 +1,3 @@\n a = 1;\n"
        '+s = "page\x0cbreak\u2028x";\n+t = 2;\r\n b = 3;\n'
    )
    assert _lines(diffs.parse(text)) == [
        ("ctx", 1, 1, "a = 1;"),
        ("add", None, 2, 's = "page\x0cbreak\u2028x";'),
        ("add", None, 3, "t = 2;"),
        ("ctx", 2, 4, "b = 3;"),
    ]


def test_a_removed_line_that_looks_like_a_header_stays_in_its_hunk():
    text = (
        "--- a/m.sql\n+++ b/m.sql\n@@ -1,2 +1,1 @@\n--- a comment\n+++ b new\n"
        "--- a/n.sql\n+++ b/n.sql\n@@ -1 +1 @@\n-x\n+y\n"
    )
    diff = diffs.parse(text)
    assert [f.path for f in diff.files] == ["m.sql", "n.sql"]
    assert _lines(diff)[:2] == [("del", 1, None, "-- a comment"), ("add", None, 1, "++ b new")]


def test_a_diff_longer_than_the_bound_is_cut_and_says_so():
    body = "".join(f"+line {n}\n" for n in range(diffs.MAX_LINES + 5))
    diff = diffs.parse(f"--- /dev/null\n+++ b/big\n@@ -0,0 +1,{diffs.MAX_LINES + 5} @@\n{body}")
    assert diff.truncated
    assert len(_lines(diff)) == diffs.MAX_LINES
    assert diff.files[0].path == "big" and diff.files[0].old_path is None
