"""``buildmax lesson``: publish, search, show, correct, supersede and vote
on lessons through a server's API.

Like every remote command, each takes ``--url``, ``--token``, ``--space``
(or ``$BUILDMAX_SPACE``) and ``--json``; a refusal is one ``error:`` line
on stderr and exit code 1. What a server sends is printed only after the
typed client has read it (:mod:`.client`), and with any control character
shown escaped, so a lesson cannot drive the terminal.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import IO, Any

import click
from buildmax_hookspecs import TASK_KINDS
from click.globals import resolve_color_default

from buildmax.commands.identity import CommandError, Remote, connected, render_table, space_option

from .client import (
    MARK_END,
    MARK_START,
    AppliesTo,
    Lesson,
    LessonChanged,
    LessonsClient,
    MalformedAnswer,
    Match,
    Source,
)
from .schemas import MAX_TEXT
from .tables import KINDS, VOTES

#: The most lessons ``search`` prints unless told otherwise.
DEFAULT_LIMIT = 20
#: Lessons asked for per page (at most the server's default page size).
_PAGE = 50
#: What a terminal would act on: control characters but tab and newline.
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SPACES = re.compile(r"\s+")
_BOLD, _PLAIN = "\x1b[1m", "\x1b[0m"
#: The width of the labels of ``show`` (the longest: "superseded by").
_LABEL_WIDTH = 13
#: The lists ``correct --clear`` empties.
CLEARABLE = ("task-kinds", "paths", "tags", "sources")


@click.group("lesson")
def lesson_group() -> None:
    """Lessons: what agents and people of a space learned, kept with provenance.

    A lesson lives in a project, or in the space's common collection
    (offered in every project). It has a kind (gotcha, convention, how-to,
    decision, note), a title and a text, where it applies (task kinds,
    paths, tags) and its sources. Correcting one makes a new revision;
    superseding one hides it behind its replacement; votes (helpful, not
    helpful, wrong) rank it. A claim offers the lessons that apply to its
    task.

    \b
    Examples:
      export BUILDMAX_SPACE=web
      buildmax lesson add --project shop --kind gotcha \\
          --title "Migrations need a lock timeout" \\
          --text "Set lock_timeout before ALTER TABLE." \\
          --path 'migrations/**' --tag db --source task:ta_...
      buildmax lesson search lock timeout --project shop
      buildmax lesson search '"lock timeout"' --kind gotcha --json
      buildmax lesson show ls_...
      buildmax lesson correct ls_... --reason "5s is too short" --text notes.md
      buildmax lesson vote ls_... helpful
      buildmax lesson supersede ls_old... --by ls_new... --reason "merged"
    """


# -- the connection -----------------------------------------------------------------


@dataclass
class _Desk:
    """What a lesson command works with: one space, the lessons calls and
    the output mode."""

    space: str
    lessons: LessonsClient
    as_json: bool

    def echo_json(self, value: Any) -> None:
        click.echo(json.dumps(value, indent=2))


def _in_space(command: Callable[..., None]) -> Callable[..., None]:
    """Give ``command`` --space, --url, --token and --json and call it with
    a :class:`_Desk`; a malformed answer is one ``error:`` line too."""

    @space_option
    @connected
    @functools.wraps(command)
    def run(remote: Remote, space: str, **arguments: Any) -> None:
        desk = _Desk(space, LessonsClient(remote.client), remote.as_json)
        try:
            command(desk, **arguments)
        except MalformedAnswer as exc:
            raise CommandError(str(exc)) from None

    return run


# -- reading what the person typed ---------------------------------------------------

#: What a lesson's id looks like (the server checks it is one).
_LESSON_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _sources(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[Source]:
    found = []
    for value in values:
        try:
            found.append(Source.parse(value))
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None
    return found


def _lesson_id(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not _LESSON_ID.fullmatch(value):
        raise click.BadParameter(f"{value!r} is not a lesson id (ls_...)", ctx, param)
    return value


def _vote(ctx: click.Context, param: click.Parameter, value: str) -> str:
    vote = value.replace("-", "_")
    if vote not in VOTES:
        raise click.BadParameter(f"{value!r}: vote one of {', '.join(VOTES)}", ctx, param)
    return vote


def _read_text(text: str | None, file: IO[str] | None, *, required: bool) -> str | None:
    """The lesson's text: ``--text``, or the FILE (``-``: stdin)."""
    if text is not None and file is not None:
        raise click.UsageError("give the text as --text or as FILE, not both")
    if file is not None:
        # What the server takes and a little more: a longer text reaches
        # the server, which refuses it, rather than being cut here.
        try:
            read = file.read(MAX_TEXT + 1)
            if len(read) > MAX_TEXT:
                read += file.read(4096)
        except UnicodeDecodeError as exc:
            name = getattr(file, "name", "the text")
            raise CommandError(f"{name}: not UTF-8 text (byte {exc.start})") from None
        text = read.rstrip("\n")
    if text is None and required:
        raise click.UsageError("give the lesson's text: --text TEXT, or FILE (- for stdin)")
    return text


text_option = click.option("--text", metavar="TEXT", help="The text (or give FILE).")
file_argument = click.argument(
    "file", type=click.File("r", encoding="utf-8"), required=False, metavar="[FILE]"
)
project_option = click.option(
    "--project", metavar="PROJECT", help="A project (id or name): its lessons and the common ones."
)


def applicability_options(command: Callable[..., None]) -> Callable[..., None]:
    """``--task-kind``, ``--path``, ``--tag`` (each repeatable) and ``--source``."""
    for option in reversed(
        (
            click.option(
                "--task-kind",
                "task_kinds",
                multiple=True,
                type=click.Choice(TASK_KINDS),
                help="A kind of task it applies to (repeatable) [default: any].",
            ),
            click.option(
                "--path",
                "paths",
                multiple=True,
                metavar="GLOB",
                help="A path or glob it applies to, e.g. 'src/auth/**' (repeatable).",
            ),
            click.option(
                "--tag",
                "tags",
                multiple=True,
                metavar="TAG",
                help="A tag (repeatable); a claim offers lessons tagged with a task label first.",
            ),
            click.option(
                "--source",
                "sources",
                multiple=True,
                callback=_sources,
                metavar="SOURCE",
                help="Where it came from (repeatable): task:ID, attempt:ID, submission:ID, "
                "artifact:ID or an http(s) URL.",
            ),
        )
    ):
        command = option(command)
    return command


def filter_options(command: Callable[..., None]) -> Callable[..., None]:
    """The filters of ``search``."""
    for option in reversed(
        (
            project_option,
            click.option(
                "--common",
                type=click.Choice(("include", "exclude", "only")),
                help="The space's common collection: include (default), exclude or only.",
            ),
            click.option("--kind", type=click.Choice(KINDS), help="Only lessons of this kind."),
            click.option(
                "--task-kind",
                type=click.Choice(TASK_KINDS),
                help="Only lessons that apply to this kind of task.",
            ),
            click.option("--tag", metavar="TAG", help="Only lessons with this tag."),
            click.option("--path", metavar="PATH", help="Only lessons that apply to this path."),
            click.option(
                "--superseded",
                type=click.Choice(("exclude", "include", "only")),
                help="Superseded lessons: exclude (default), include or only.",
            ),
        )
    ):
        command = option(command)
    return command


# -- printing ----------------------------------------------------------------------


def plain(text: str) -> str:
    """``text`` safe on a terminal: a control character other than tab and
    newline is shown escaped (``\\x1b``)."""
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def one_line(text: str) -> str:
    """``text`` on one line, safe on a terminal."""
    return _SPACES.sub(" ", plain(text)).strip()


def styled() -> bool:
    """Whether what is printed keeps its styles: a terminal (or a forced
    colour), as ``click.echo`` decides."""
    color = resolve_color_default()
    return color if color is not None else sys.stdout.isatty()


def snippet(match: Match, bold: bool) -> str:
    """A search's snippet on one line, safe on a terminal, its matched words
    in bold (``bold``) or between ``[`` and ``]``; never its marks."""
    parts = re.split(f"([{MARK_START}{MARK_END}])", match.snippet)
    safe = "".join(p if p in (MARK_START, MARK_END) else _SPACES.sub(" ", plain(p)) for p in parts)
    start, end = (_BOLD, _PLAIN) if bold else ("[", "]")
    return Match(safe, match.relevance).marked(start, end).strip()


def _summary_line(lesson: Lesson) -> str:
    line = f"{lesson.id}  {one_line(lesson.kind):<10}  score {lesson.usefulness.score:>3}  "
    line += one_line(lesson.title)
    if lesson.superseded_by:
        line += f"  (superseded by {lesson.superseded_by})"
    return line


def _applicability(applies_to: AppliesTo) -> str:
    parts = [
        f"{name} {', '.join(one_line(v) for v in values)}"
        for name, values in (
            ("task kinds", applies_to.task_kinds),
            ("paths", applies_to.paths),
            ("tags", applies_to.tags),
        )
        if values
    ]
    return "; ".join(parts) or "anywhere"


def _usefulness(lesson: Lesson) -> str:
    u = lesson.usefulness
    return (
        f"score {u.score}: {u.helpful} helpful, {u.not_helpful} not helpful, {u.wrong} wrong "
        f"(on revision {lesson.revision})"
    )


def _rows(rows: Iterable[tuple[str, str | None]]) -> str:
    """``label  value`` lines (those with a value), a value of several lines
    indented under its first."""
    indent = "\n" + " " * (_LABEL_WIDTH + 2)
    return "\n".join(
        f"{label.ljust(_LABEL_WIDTH)}  {value.replace(chr(10), indent)}"
        for label, value in rows
        if value
    )


def describe(lesson: Lesson) -> str:
    """A lesson for a person: what it says, where it lives and applies,
    where it came from, who wrote and corrected it, its votes and what
    replaced it."""
    collection = (
        f"project {lesson.project_id}" if lesson.project_id else "common (the space's collection)"
    )
    if lesson.revision > 1:
        revision = f"{lesson.revision}, corrected by {lesson.revised_by or '(unknown)'}"
        if lesson.correction_reason:
            revision += f": {one_line(lesson.correction_reason)}"
    else:
        revision = "1"
    superseded = None
    if lesson.superseded_by:
        superseded = f"{lesson.superseded_by} at {lesson.superseded_at}"
        if lesson.superseded_reason:
            superseded += f": {one_line(lesson.superseded_reason)}"
    head = _rows(
        [
            ("lesson", lesson.id),
            ("title", one_line(lesson.title)),
            ("kind", one_line(lesson.kind)),
            ("collection", collection),
            ("applies to", _applicability(lesson.applies_to)),
            ("sources", "\n".join(plain(str(s)) for s in lesson.sources) or "-"),
            ("author", f"{lesson.author_id or '(unknown)'}, {lesson.created_at}"),
            ("revision", revision),
            ("updated", lesson.updated_at),
            ("usefulness", _usefulness(lesson)),
            ("superseded by", superseded),
            ("supersedes", ", ".join(lesson.supersedes)),
        ]
    )
    return f"{head}\n\n{plain(lesson.text)}"


def _show(desk: _Desk, lesson: Lesson) -> None:
    if desk.as_json:
        desk.echo_json(lesson.as_dict())
    else:
        click.echo(describe(lesson))


# -- the commands -------------------------------------------------------------------


@lesson_group.command("add")
@file_argument
@click.option("--kind", required=True, type=click.Choice(KINDS), help="What kind of lesson.")
@click.option("--title", required=True, metavar="TITLE", help="A one-line title (200 at most).")
@text_option
@click.option(
    "--project",
    metavar="PROJECT",
    help="The project (id or name) it belongs to [default: the space's common collection].",
)
@applicability_options
@_in_space
def add_command(
    desk: _Desk,
    file: IO[str] | None,
    kind: str,
    title: str,
    text: str | None,
    project: str | None,
    task_kinds: tuple[str, ...],
    paths: tuple[str, ...],
    tags: tuple[str, ...],
    sources: list[Source],
) -> None:
    """Publish a lesson; its text is --text, or FILE (- reads stdin).

    Without --project it joins the space's common collection, offered in
    every project.

    \b
    Examples:
      buildmax lesson add --project shop --kind gotcha \\
          --title "Migrations need a lock timeout" --text "Set lock_timeout first." \\
          --task-kind code --path 'migrations/**' --tag db \\
          --source task:ta_... --source https://wiki.example/postmortem-12
      git log -1 --format=%B | buildmax lesson add --kind decision \\
          --title "We squash-merge" -
    """
    body = _read_text(text, file, required=True)
    assert body is not None
    made = desk.lessons.publish(
        desk.space,
        kind,
        title,
        body,
        project=project,
        applies_to=AppliesTo(task_kinds=task_kinds, paths=paths, tags=tags),
        sources=sources,
    )
    _show(desk, made)


@lesson_group.command("search")
@click.argument("words", nargs=-1)
@filter_options
@click.option(
    "--limit",
    type=click.IntRange(1, 1000),
    default=DEFAULT_LIMIT,
    show_default=True,
    help="Print at most this many lessons.",
)
@_in_space
def search_command(
    desk: _Desk,
    words: tuple[str, ...],
    project: str | None,
    common: str | None,
    kind: str | None,
    task_kind: str | None,
    tag: str | None,
    path: str | None,
    superseded: str | None,
    limit: int,
) -> None:
    """Search lessons for every one of WORDS (stemmed: `failing` finds
    `fails`) and "quoted phrases"; without WORDS, list the newest.

    The most relevant first, then the most useful, then the most recently
    changed. Each hit shows its id, kind, usefulness score and title, and
    a snippet with the matched words in bold on a terminal, else between
    [ and ]. Superseded lessons are left out unless --superseded says so.

    \b
    Examples:
      buildmax lesson search flaky test --project shop
      buildmax lesson search '"lock timeout"' migration --kind gotcha
      buildmax lesson search --tag db --task-kind code --limit 5
      buildmax lesson search deploy --json
    """
    filters: dict[str, Any] = dict(
        project=project,
        common=common,
        kind=kind,
        task_kind=task_kind,
        tag=tag,
        path=path,
        superseded=superseded,
        page_size=min(limit + 1, _PAGE),
    )
    text = " ".join(words).strip()
    found = (
        desk.lessons.search(desk.space, text, **filters)
        if text
        else desk.lessons.list(desk.space, **filters)
    )
    hits = list(itertools.islice(found, limit + 1))
    more = len(hits) > limit
    hits = hits[:limit]
    if desk.as_json:
        desk.echo_json([hit.as_dict() for hit in hits])
        return
    if not hits:
        click.echo("No lessons found.")
        return
    bold = styled()
    for hit in hits:
        click.echo(_summary_line(hit))
        if hit.match is not None:
            click.echo(f"    {snippet(hit.match, bold)}")
    if more:
        click.echo(f"(the first {limit}: --limit shows more)", err=True)


@lesson_group.command("show")
@click.argument("lesson", callback=_lesson_id)
@_in_space
def show_command(desk: _Desk, lesson: str) -> None:
    """Show LESSON as it stands (its current revision) with its provenance:
    sources, author, revision and reason, usefulness, and what superseded
    it or what it supersedes.

    \b
    Example:
      buildmax lesson show ls_...
    """
    _show(desk, desk.lessons.show(desk.space, lesson))


@lesson_group.command("correct")
@click.argument("lesson", callback=_lesson_id)
@file_argument
@click.option("--reason", required=True, metavar="TEXT", help="Why it is corrected (required).")
@click.option(
    "--revision",
    type=click.IntRange(min=1),
    help="Correct only if the lesson is still at this revision [default: the current one].",
)
@click.option("--kind", type=click.Choice(KINDS), help="A new kind.")
@click.option("--title", metavar="TITLE", help="A new title.")
@text_option
@applicability_options
@click.option(
    "--clear",
    multiple=True,
    type=click.Choice(CLEARABLE),
    help="Empty this list (repeatable): task-kinds, paths, tags or sources.",
)
@_in_space
def correct_command(
    desk: _Desk,
    lesson: str,
    file: IO[str] | None,
    reason: str,
    revision: int | None,
    kind: str | None,
    title: str | None,
    text: str | None,
    task_kinds: tuple[str, ...],
    paths: tuple[str, ...],
    tags: tuple[str, ...],
    sources: list[Source],
    clear: tuple[str, ...],
) -> None:
    """Correct LESSON: a new revision with what changes and why (its votes
    start afresh). The new text is --text, or FILE (- reads stdin).

    The current revision is read first, so a correction made meanwhile
    by someone else is refused rather than overwritten (--revision pins
    the one you read). --task-kind, --path and --tag replace that list
    only, --source replaces the sources; --clear empties a list.

    \b
    Examples:
      buildmax lesson correct ls_... --reason "the timeout is 5s now" \\
          --text "Set lock_timeout = '5s' before ALTER TABLE."
      buildmax lesson correct ls_... --reason "rewritten" notes.md --revision 2
      buildmax lesson correct ls_... --reason "not db-specific" --clear tags
    """
    new_text = _read_text(text, file, required=False)
    current = desk.lessons.show(desk.space, lesson)
    asked = revision or current.revision
    if asked != current.revision:
        raise _changed(lesson, asked, current.revision)
    applies_to = None
    if task_kinds or paths or tags or set(clear) - {"sources"}:
        was = current.applies_to
        applies_to = AppliesTo(
            task_kinds=task_kinds or (() if "task-kinds" in clear else was.task_kinds),
            paths=paths or (() if "paths" in clear else was.paths),
            tags=tags or (() if "tags" in clear else was.tags),
        )
    new_sources = sources if sources or "sources" in clear else None
    if (kind, title, new_text, applies_to, new_sources) == (None,) * 5:
        raise click.UsageError(
            "nothing to correct: give --title, --text or FILE, --kind, --task-kind, --path, "
            "--tag, --source or --clear"
        )
    try:
        fixed = desk.lessons.correct(
            desk.space,
            lesson,
            asked,
            reason,
            kind=kind,
            title=title,
            text=new_text,
            applies_to=applies_to,
            sources=new_sources,
        )
    except LessonChanged as exc:
        raise _changed(lesson, asked, exc.current_revision) from None
    _show(desk, fixed)


def _changed(lesson: str, asked: int, current: int | None) -> CommandError:
    now = f"it is at revision {current} now" if current else "it has a newer revision now"
    return CommandError(
        f"someone else corrected {lesson} first: {now}, not {asked}. Read it again "
        f"(buildmax lesson show {lesson}) and correct what it says now."
    )


@lesson_group.command("supersede")
@click.argument("lesson", callback=_lesson_id)
@click.option(
    "--by",
    required=True,
    metavar="LESSON",
    callback=_lesson_id,
    help="The lesson that replaces it.",
)
@click.option("--reason", default="", metavar="TEXT", help="Why it is replaced.")
@_in_space
def supersede_command(desk: _Desk, lesson: str, by: str, reason: str) -> None:
    """Mark LESSON superseded by another: it leaves default searches, lists
    and claims' offers, and `show` still finds it (with superseded_by).

    \b
    Example:
      buildmax lesson supersede ls_old... --by ls_new... --reason "merged into one"
    """
    _show(desk, desk.lessons.supersede(desk.space, lesson, by, reason))


@lesson_group.command("vote")
@click.argument("lesson", callback=_lesson_id)
@click.argument("vote", metavar="helpful|not-helpful|wrong", callback=_vote)
@click.option("--note", metavar="TEXT", help="Why (kept with your vote).")
@click.option(
    "--revision",
    type=click.IntRange(min=1),
    help="Vote only if the lesson is still at this revision.",
)
@_in_space
def vote_command(
    desk: _Desk, lesson: str, vote: str, note: str | None, revision: int | None
) -> None:
    """Say whether LESSON helped: helpful, not-helpful or wrong.

    One vote per person and revision: voting again replaces yours. Its
    score (helpful - not helpful - 2 x wrong) ranks it in searches and
    claims' offers; a correction starts the votes afresh.

    \b
    Examples:
      buildmax lesson vote ls_... helpful
      buildmax lesson vote ls_... wrong --note "the flag was removed in 3.2"
    """
    try:
        voted = desk.lessons.vote(desk.space, lesson, vote, revision=revision, note=note)
    except LessonChanged as exc:
        now = exc.current_revision
        raise CommandError(
            f"{lesson} was corrected: it is at revision {now}, not {revision}. "
            f"Read it again (buildmax lesson show {lesson}) before you vote."
        ) from None
    if desk.as_json:
        desk.echo_json(voted.as_dict())
        return
    click.echo(f"Voted {vote.replace('_', ' ')} on {voted.id} revision {voted.revision}.")
    click.echo(f"Usefulness: {_usefulness(voted)}")


@lesson_group.command("revisions")
@click.argument("lesson", callback=_lesson_id)
@_in_space
def revisions_command(desk: _Desk, lesson: str) -> None:
    """List LESSON's revisions, newest first: who wrote each and why."""
    found = desk.lessons.revisions(desk.space, lesson)
    if desk.as_json:
        desk.echo_json([r.as_dict() for r in found])
        return
    click.echo(
        _table(
            [
                {
                    "revision": r.number,
                    "kind": r.kind,
                    "author": r.author_id,
                    "created_at": r.created_at,
                    "reason": one_line(r.reason),
                    "title": one_line(r.title),
                }
                for r in found
            ],
            ("revision", "kind", "author", "created_at", "reason", "title"),
        )
    )


@lesson_group.command("votes")
@click.argument("lesson", callback=_lesson_id)
@_in_space
def votes_command(desk: _Desk, lesson: str) -> None:
    """List the votes on LESSON, newest revision first."""
    found = desk.lessons.votes(desk.space, lesson)
    if desk.as_json:
        desk.echo_json([v.as_dict() for v in found])
        return
    click.echo(
        _table(
            [
                {
                    "revision": v.revision,
                    "vote": v.vote,
                    "principal": v.principal_id,
                    "updated_at": v.updated_at,
                    "note": one_line(v.note),
                }
                for v in found
            ],
            ("revision", "vote", "principal", "updated_at", "note"),
        )
    )


def _table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    return render_table(
        [{k: plain(str(v)) if v else v for k, v in r.items()} for r in rows], columns
    )
