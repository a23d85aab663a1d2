"""Typed calls for the lessons plugin's routes, on top of :mod:`buildmax.client`.

:class:`LessonsClient` wraps a kernel :class:`~buildmax.client.Client` (and
:class:`AsyncLessonsClient` an :class:`~buildmax.client.AsyncClient`), so one
connection, with its retries, idempotency keys and paging, serves the
kernel's calls and these::

    with Client() as bmx:
        lessons = LessonsClient(bmx)
        made = lessons.publish(
            "web", "gotcha", "Migrations need a lock timeout",
            "Set lock_timeout before ALTER TABLE, or the deploy waits behind a long query.",
            project="shop",
            applies_to=AppliesTo(paths=("migrations/**",), tags=("db",)),
            sources=["task:ta_...", "https://wiki.example/postmortem-12"],
        )
        for hit in itertools.islice(lessons.search("web", "lock timeout"), 5):
            print(hit.id, hit.title, hit.match.marked("[", "]") if hit.match else "")
        lessons.vote("web", made.id, "helpful")

Every call names the space (id or slug) first. Answers are frozen records
(:class:`Lesson`, :class:`Revision`, :class:`Vote`), read field by field:
an answer that is not what the API promises (a field missing or of another
type, a control character in a title, an id that is not one, another lesson
than the one asked for) raises :class:`MalformedAnswer`, and nothing of it
is used. A list or a search is an iterator that asks for the next page only
when it is reached.

Every change is sent with an ``Idempotency-Key``: a fresh one (the same on
each of the client's retries), or the caller's ``idempotency_key`` so that
a call repeated after a crash acts once.

Wrapping a kernel client gives it the plugin's problems as typed exceptions
(:data:`ERRORS`): :class:`LessonChanged`, :class:`LessonSuperseded`,
:class:`InvalidLessonSource`.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar

from buildmax.client import (
    BuildMaxError,
    Conflict,
    OverAsyncClient,
    OverClient,
    ValidationError,
    present,
    space_path,
)
from buildmax.fulltext import MARK_END as MARK_END
from buildmax.fulltext import MARK_START as MARK_START
from buildmax_lessons import problems

# -- errors -------------------------------------------------------------------


class LessonChanged(Conflict, answers=problems.LessonChanged):
    """another correction came first: the lesson
    has a newer revision than the one named (see ``current_revision``)."""

    @property
    def current_revision(self) -> int | None:
        """The lesson's revision now, as the server named it."""
        found = self.body.get("current_revision") if isinstance(self.body, dict) else None
        return found if isinstance(found, int) and not isinstance(found, bool) else None


class LessonSuperseded(Conflict, answers=problems.LessonSuperseded):
    """the lesson was superseded (correct its replacement instead), or the
    replacement named was itself superseded."""


class InvalidLessonSource(ValidationError, answers=problems.BadSource):
    """a source (or the replacement) names no record of the space."""


#: The plugin's exception classes, one per problem of :mod:`buildmax_lessons.problems`.
ERRORS: tuple[type[BuildMaxError], ...] = (LessonChanged, LessonSuperseded, InvalidLessonSource)


class MalformedAnswer(Exception):
    """The server answered, but not what the API promises: nothing of the
    answer was used."""

    def __init__(self, where: str, problem: str) -> None:
        self.where = where
        super().__init__(f"the server's answer is malformed: {where} {problem}")


# -- records --------------------------------------------------------------------

#: What a source's reference names, other than a URL.
RECORD_SOURCES = ("task", "attempt", "submission", "artifact")
#: A public id as the server issues them (``ls_...``, ``ta_...``, ``pr_...``).
_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
#: Control characters no title, text, reason or note holds (tab and line
#: breaks aside); a snippet may also hold its marks.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SNIPPET_CONTROL = re.compile(r"[\x00\x01\x04-\x08\x0b\x0c\x0e-\x1f\x7f]")
_URL = re.compile(r"https?://[^\s\x00-\x1f\x7f]+", re.IGNORECASE)


@dataclass(frozen=True)
class AppliesTo:
    """Where a lesson applies: task kinds, paths or globs, tags (each empty:
    anywhere)."""

    task_kinds: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Source:
    """Where a lesson came from: a record of the space (``type`` one of
    :data:`RECORD_SOURCES`, with its ``id``) or a web page (``type`` ``url``,
    with its ``url``)."""

    type: str
    id: str | None = None
    url: str | None = None

    @classmethod
    def parse(cls, text: str) -> Source:
        """``task:ta_...``, ``attempt:...``, ``submission:...``,
        ``artifact:...`` or an ``http(s)`` URL; ``ValueError`` otherwise."""
        if _URL.fullmatch(text):
            return cls("url", url=text)
        kind, colon, ident = text.partition(":")
        if colon and kind in RECORD_SOURCES and _ID.fullmatch(ident):
            return cls(kind, id=ident)
        raise ValueError(
            f"{text!r} is not a source: write task:ID, attempt:ID, submission:ID, "
            "artifact:ID or an http(s) URL"
        )

    def __str__(self) -> str:
        return self.url if self.type == "url" and self.url else f"{self.type}:{self.id}"

    def body(self) -> dict[str, str]:
        """The source as the API reads it."""
        return {"type": self.type, **present(id=self.id, url=self.url)}


@dataclass(frozen=True)
class Usefulness:
    """The votes on a lesson's current revision; ``score`` is helpful - not
    helpful - 2 * wrong."""

    helpful: int = 0
    not_helpful: int = 0
    wrong: int = 0
    score: int = 0


@dataclass(frozen=True)
class Match:
    """Why a search found a lesson: a few words of it around what matched,
    each matched word between :data:`MARK_START` and :data:`MARK_END`, and
    its relevance relative to the best hit's (1.0)."""

    snippet: str
    relevance: float

    def marked(self, start: str, end: str) -> str:
        """The snippet with its marks replaced by ``start`` and ``end`` (a
        mark left open is closed; a stray end is dropped)."""
        shown: list[str] = []
        inside = False
        for char in self.snippet:
            if char == MARK_START and not inside:
                shown.append(start)
                inside = True
            elif char == MARK_END and inside:
                shown.append(end)
                inside = False
            elif char not in (MARK_START, MARK_END):
                shown.append(char)
        if inside:
            shown.append(end)
        return "".join(shown)

    @property
    def words(self) -> tuple[str, ...]:
        """The matched words, in the order the snippet shows them."""
        return tuple(
            re.findall(f"{re.escape(MARK_START)}([^{MARK_START}{MARK_END}]*)", self.snippet)
        )


@dataclass(frozen=True)
class Lesson:
    """A lesson as it stands: its current revision, where it lives (a
    project, or the space's ``common`` collection), its provenance, votes
    and supersession. ``match`` is set on a search's hits only."""

    id: str
    space_id: str
    project_id: str | None
    collection: str
    kind: str
    title: str
    text: str
    applies_to: AppliesTo
    sources: tuple[Source, ...]
    revision: int
    author_id: str | None
    revised_by: str | None
    correction_reason: str
    usefulness: Usefulness
    superseded_by: str | None
    superseded_at: str | None
    superseded_reason: str | None
    supersedes: tuple[str, ...]
    created_at: str
    updated_at: str
    match: Match | None = field(default=None)

    def as_dict(self) -> dict[str, Any]:
        """The lesson as the API shows it (JSON-ready)."""
        found: dict[str, Any] = _json_ready(asdict(self))
        if self.match is None:
            del found["match"]
        for source in found["sources"]:
            for empty in [k for k, v in source.items() if v is None]:
                del source[empty]
        return found


@dataclass(frozen=True)
class Revision:
    """One revision of a lesson, kept for good: what it said, who wrote it
    and why it was corrected (empty for the first)."""

    number: int
    kind: str
    title: str
    text: str
    applies_to: AppliesTo
    sources: tuple[Source, ...]
    author_id: str | None
    author_kind: str
    reason: str
    created_at: str

    def as_dict(self) -> dict[str, Any]:
        """The revision as the API shows it (JSON-ready)."""
        found: dict[str, Any] = _json_ready(asdict(self))
        for source in found["sources"]:
            for empty in [k for k, v in source.items() if v is None]:
                del source[empty]
        return found


@dataclass(frozen=True)
class Vote:
    """A principal's usefulness vote on one revision of a lesson."""

    principal_id: str
    revision: int
    vote: str
    note: str
    created_at: str
    updated_at: str

    def as_dict(self) -> dict[str, Any]:
        """The vote as the API shows it (JSON-ready)."""
        found: dict[str, Any] = _json_ready(asdict(self))
        return found


def _json_ready(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    return value


# -- reading answers --------------------------------------------------------------


class _Fields:
    """The fields of one JSON object of an answer, read with their types
    checked; :class:`MalformedAnswer` naming the first that is wrong."""

    def __init__(self, value: Any, where: str) -> None:
        if not isinstance(value, dict):
            raise MalformedAnswer(where, f"is {_kind(value)}, not an object")
        self.data: Mapping[str, Any] = value
        self.where = where

    def _get(self, name: str) -> Any:
        if name not in self.data:
            raise MalformedAnswer(f"{self.where}.{name}", "is missing")
        return self.data[name]

    def _wrong(self, name: str, value: Any, expected: str) -> MalformedAnswer:
        return MalformedAnswer(f"{self.where}.{name}", f"is {_kind(value)}, not {expected}")

    def integer(self, name: str, minimum: int | None = None) -> int:
        value = self._get(name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._wrong(name, value, "an integer")
        if minimum is not None and value < minimum:
            raise MalformedAnswer(f"{self.where}.{name}", f"is {value}, below {minimum}")
        return value

    def number(self, name: str) -> float:
        value = self._get(name)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise self._wrong(name, value, "a number")
        if not math.isfinite(value):
            raise MalformedAnswer(f"{self.where}.{name}", "is not a finite number")
        return float(value)

    def text(self, name: str, pattern: re.Pattern[str] = _CONTROL) -> str:
        """A string without control characters (tab and line breaks aside)."""
        value = self._get(name)
        if not isinstance(value, str):
            raise self._wrong(name, value, "a string")
        if pattern.search(value):
            raise MalformedAnswer(f"{self.where}.{name}", "holds a control character")
        return value

    def optional_text(self, name: str) -> str | None:
        return None if self._get(name) is None else self.text(name)

    def ident(self, name: str) -> str:
        """A public id."""
        value = self._get(name)
        if not isinstance(value, str) or not _ID.fullmatch(value):
            raise self._wrong(name, value, "an id")
        return value

    def optional_ident(self, name: str) -> str | None:
        return None if self._get(name) is None else self.ident(name)

    def moment(self, name: str) -> str:
        """An RFC 3339 time."""
        value = self.text(name)
        try:
            datetime.fromisoformat(value)
        except ValueError:
            raise MalformedAnswer(
                f"{self.where}.{name}", f"is {value[:40]!r}, not a time"
            ) from None
        return value

    def optional_moment(self, name: str) -> str | None:
        return None if self._get(name) is None else self.moment(name)

    def items(self, name: str) -> list[Any]:
        value = self._get(name)
        if not isinstance(value, list):
            raise self._wrong(name, value, "a list")
        return value

    def texts(self, name: str) -> tuple[str, ...]:
        found = []
        for number, value in enumerate(self.items(name)):
            if not isinstance(value, str) or _CONTROL.search(value):
                raise self._wrong(f"{name}[{number}]", value, "a string")
            found.append(value)
        return tuple(found)

    def idents(self, name: str) -> tuple[str, ...]:
        found = []
        for number, value in enumerate(self.items(name)):
            if not isinstance(value, str) or not _ID.fullmatch(value):
                raise self._wrong(f"{name}[{number}]", value, "an id")
            found.append(value)
        return tuple(found)

    def object(self, name: str) -> _Fields:
        return _Fields(self._get(name), f"{self.where}.{name}")


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    return {int: "an integer", float: "a number", list: "a list", dict: "an object"}.get(
        type(value), type(value).__name__
    )


def _applies_to(fields: _Fields) -> AppliesTo:
    return AppliesTo(
        task_kinds=fields.texts("task_kinds"),
        paths=fields.texts("paths"),
        tags=fields.texts("tags"),
    )


def _sources(fields: _Fields, name: str) -> tuple[Source, ...]:
    found = []
    for number, value in enumerate(fields.items(name)):
        source = _Fields(value, f"{fields.where}.{name}[{number}]")
        kind = source.text("type")
        if kind == "url":
            url = source.text("url")
            if not _URL.fullmatch(url):
                raise MalformedAnswer(f"{source.where}.url", "is not an http(s) URL")
            found.append(Source("url", url=url))
        elif kind in RECORD_SOURCES:
            found.append(Source(kind, id=source.ident("id")))
        else:
            raise MalformedAnswer(f"{source.where}.type", f"is {kind[:40]!r}, not a source type")
    return tuple(found)


def parse_lesson(value: Any, where: str = "lesson") -> Lesson:
    """A :class:`Lesson` from an answer; :class:`MalformedAnswer` when it is not one."""
    fields = _Fields(value, where)
    usefulness = fields.object("usefulness")
    project_id = fields.optional_ident("project_id")
    collection = fields.text("collection")
    if collection != ("common" if project_id is None else "project"):
        raise MalformedAnswer(
            f"{where}.collection", f"is {collection[:40]!r} for project {project_id}"
        )
    match = None
    if fields.data.get("match") is not None:
        found = fields.object("match")
        match = Match(found.text("snippet", _SNIPPET_CONTROL), found.number("relevance"))
    return Lesson(
        id=fields.ident("id"),
        space_id=fields.ident("space_id"),
        project_id=project_id,
        collection=collection,
        kind=fields.text("kind"),
        title=fields.text("title"),
        text=fields.text("text"),
        applies_to=_applies_to(fields.object("applies_to")),
        sources=_sources(fields, "sources"),
        revision=fields.integer("revision", minimum=1),
        author_id=fields.optional_ident("author_id"),
        revised_by=fields.optional_ident("revised_by"),
        correction_reason=fields.text("correction_reason"),
        usefulness=Usefulness(
            helpful=usefulness.integer("helpful", minimum=0),
            not_helpful=usefulness.integer("not_helpful", minimum=0),
            wrong=usefulness.integer("wrong", minimum=0),
            score=usefulness.integer("score"),
        ),
        superseded_by=fields.optional_ident("superseded_by"),
        superseded_at=fields.optional_moment("superseded_at"),
        superseded_reason=fields.optional_text("superseded_reason"),
        supersedes=fields.idents("supersedes"),
        created_at=fields.moment("created_at"),
        updated_at=fields.moment("updated_at"),
        match=match,
    )


def parse_revision(value: Any, where: str = "revision") -> Revision:
    """A :class:`Revision` from an answer; :class:`MalformedAnswer` when it is not one."""
    fields = _Fields(value, where)
    return Revision(
        number=fields.integer("number", minimum=1),
        kind=fields.text("kind"),
        title=fields.text("title"),
        text=fields.text("text"),
        applies_to=_applies_to(fields.object("applies_to")),
        sources=_sources(fields, "sources"),
        author_id=fields.optional_ident("author_id"),
        author_kind=fields.text("author_kind"),
        reason=fields.text("reason"),
        created_at=fields.moment("created_at"),
    )


def parse_vote(value: Any, where: str = "vote") -> Vote:
    """A :class:`Vote` from an answer; :class:`MalformedAnswer` when it is not one."""
    fields = _Fields(value, where)
    return Vote(
        principal_id=fields.ident("principal_id"),
        revision=fields.integer("revision", minimum=1),
        vote=fields.text("vote"),
        note=fields.text("note"),
        created_at=fields.moment("created_at"),
        updated_at=fields.moment("updated_at"),
    )


def _page(value: Any) -> tuple[list[Any], str | None]:
    """The items and the next cursor of a page of a list."""
    fields = _Fields(value, "page")
    items = fields.items("items")
    cursor = fields.data.get("next_cursor")
    if cursor is not None and (not isinstance(cursor, str) or not cursor):
        raise MalformedAnswer("page.next_cursor", f"is {_kind(cursor)}, not a cursor")
    return items, cursor


def _next_cursor(cursor: str | None, seen: set[str]) -> str | None:
    """``cursor``, unless the server gave it before (a list that never ends)."""
    if cursor is not None:
        if cursor in seen:
            raise MalformedAnswer("page.next_cursor", "repeats an earlier page's")
        seen.add(cursor)
    return cursor


def _the_lesson(lesson: Lesson, ident: str | None, by: str | None = None) -> Lesson:
    """``lesson``, if it is lesson ``ident`` (and superseded by ``by``)."""
    if ident is not None and lesson.id != ident:
        raise MalformedAnswer("lesson.id", f"is {lesson.id}, not the lesson asked for ({ident})")
    if by is not None and lesson.superseded_by != by:
        raise MalformedAnswer("lesson.superseded_by", f"is {lesson.superseded_by}, not {by}")
    return lesson


def _applies_body(applies_to: AppliesTo) -> dict[str, list[str]]:
    return {
        "task_kinds": list(applies_to.task_kinds),
        "paths": list(applies_to.paths),
        "tags": list(applies_to.tags),
    }


def _sources_body(sources: Sequence[Source | str]) -> list[dict[str, str]]:
    return [(s if isinstance(s, Source) else Source.parse(s)).body() for s in sources]


# -- the calls ------------------------------------------------------------------

_One = TypeVar("_One")
_Many = TypeVar("_Many")
_Revisions = TypeVar("_Revisions")
_Votes = TypeVar("_Votes")


class _LessonRoutes(ABC, Generic[_One, _Many, _Revisions, _Votes]):
    """The calls, shared by the sync and async clients.

    ``_One`` is what a call about one lesson returns (a :class:`Lesson`, or
    an awaitable of one), ``_Many`` a list or search (an iterator of
    lessons, or an async one), ``_Revisions`` and ``_Votes`` a lesson's
    revisions and votes (a list, or an awaitable of one). Optional
    arguments left at ``None`` are not sent, so the server's defaults apply.
    """

    @abstractmethod
    def _lesson(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        key: str | None = None,
        ident: str | None = None,
        by: str | None = None,
    ) -> _One: ...

    @abstractmethod
    def _lessons(self, path: str, params: dict[str, Any]) -> _Many: ...

    @abstractmethod
    def _revisions(self, path: str) -> _Revisions: ...

    @abstractmethod
    def _votes(self, path: str) -> _Votes: ...

    def publish(
        self,
        space: str,
        kind: str,
        title: str,
        text: str,
        *,
        project: str | None = None,
        applies_to: AppliesTo | None = None,
        sources: Sequence[Source | str] = (),
        idempotency_key: str | None = None,
    ) -> _One:
        """Publish a lesson (members, or an attempt's token) in ``project``
        (id or name), or in the space's common collection without one.
        ``kind``: gotcha, convention, how-to, decision or note. ``sources``
        are :class:`Source` records or their text (``task:ta_...``, a URL).
        Refusals: :class:`InvalidLessonSource` (a source that is not the
        space's), :class:`~buildmax.client.ValidationError`."""
        body: dict[str, Any] = {
            "project": project,
            "kind": kind,
            "title": title,
            "text": text,
            "sources": _sources_body(sources),
        }
        if applies_to is not None:
            body["applies_to"] = _applies_body(applies_to)
        return self._lesson("POST", space_path(space, "lessons"), body, key=idempotency_key)

    def list(
        self,
        space: str,
        *,
        project: str | None = None,
        common: str | None = None,
        kind: str | None = None,
        task_kind: str | None = None,
        tag: str | None = None,
        path: str | None = None,
        superseded: str | None = None,
        page_size: int | None = None,
    ) -> _Many:
        """The lessons the filters keep, newest first (viewers). ``project``
        keeps that project's lessons and the common ones (``common``:
        ``include``, ``exclude``, ``only``); ``superseded`` (``exclude``,
        ``include``, ``only``) leaves the superseded ones out by default."""
        params = present(
            project=project,
            common=common,
            kind=kind,
            task_kind=task_kind,
            tag=tag,
            path=path,
            superseded=superseded,
            limit=page_size,
        )
        return self._lessons(space_path(space, "lessons"), params)

    def search(
        self,
        space: str,
        text: str,
        *,
        project: str | None = None,
        common: str | None = None,
        kind: str | None = None,
        task_kind: str | None = None,
        tag: str | None = None,
        path: str | None = None,
        superseded: str | None = None,
        page_size: int | None = None,
    ) -> _Many:
        """The lessons holding every word (stemmed) and ``"quoted phrase"``
        of ``text`` that the filters keep (as :meth:`list`): the most
        relevant first, then the most useful, then the most recently
        changed, among the newest 1,000 that match. Each has
        :attr:`Lesson.match`.
        A ``text`` with no word is refused
        (:class:`~buildmax.client.ValidationError`)."""
        params = present(
            q=text,
            project=project,
            common=common,
            kind=kind,
            task_kind=task_kind,
            tag=tag,
            path=path,
            superseded=superseded,
            limit=page_size,
        )
        return self._lessons(space_path(space, "lessons"), params)

    def show(self, space: str, lesson: str) -> _One:
        """A lesson as it stands (its current revision), superseded or not."""
        return self._lesson("GET", space_path(space, "lessons", lesson), ident=lesson)

    def revisions(self, space: str, lesson: str) -> _Revisions:
        """Every revision of a lesson, newest first."""
        return self._revisions(space_path(space, "lessons", lesson, "revisions"))

    def correct(
        self,
        space: str,
        lesson: str,
        revision: int,
        reason: str,
        *,
        kind: str | None = None,
        title: str | None = None,
        text: str | None = None,
        applies_to: AppliesTo | None = None,
        sources: Sequence[Source | str] | None = None,
        idempotency_key: str | None = None,
    ) -> _One:
        """Correct a lesson: a new revision made against ``revision``, the
        current one (:class:`LessonChanged` when another correction came
        first), with what changes (``applies_to`` and ``sources`` are
        replaced whole). The votes start afresh. A superseded lesson is
        refused (:class:`LessonSuperseded`)."""
        body: dict[str, Any] = {
            "revision": revision,
            "reason": reason,
            **present(kind=kind, title=title, text=text),
        }
        if applies_to is not None:
            body["applies_to"] = _applies_body(applies_to)
        if sources is not None:
            body["sources"] = _sources_body(sources)
        path = space_path(space, "lessons", lesson, "revisions")
        return self._lesson("POST", path, body, key=idempotency_key, ident=lesson)

    def supersede(
        self,
        space: str,
        lesson: str,
        by: str,
        reason: str = "",
        *,
        idempotency_key: str | None = None,
    ) -> _One:
        """Mark ``lesson`` superseded by lesson ``by`` (a live lesson of the
        space): it leaves default lists, searches and claims' offers, and
        is still shown by its id. Refusals: :class:`LessonSuperseded`,
        :class:`InvalidLessonSource` (no such replacement)."""
        path = space_path(space, "lessons", lesson, "supersede")
        body = {"by": by, "reason": reason}
        return self._lesson("POST", path, body, key=idempotency_key, ident=lesson, by=by)

    def vote(
        self,
        space: str,
        lesson: str,
        vote: str,
        *,
        revision: int | None = None,
        note: str | None = None,
        idempotency_key: str | None = None,
    ) -> _One:
        """Vote ``helpful``, ``not_helpful`` or ``wrong`` on the lesson's
        current revision (``revision`` checks it is that one:
        :class:`LessonChanged` otherwise). One vote per principal and
        revision: voting again replaces it. The lesson with its new tally."""
        body = {"vote": vote, **present(revision=revision, note=note)}
        path = space_path(space, "lessons", lesson, "votes")
        return self._lesson("POST", path, body, key=idempotency_key, ident=lesson)

    def votes(self, space: str, lesson: str) -> _Votes:
        """The votes on every revision of a lesson, newest revision first."""
        return self._votes(space_path(space, "lessons", lesson, "votes"))


class LessonsClient(
    OverClient, _LessonRoutes[Lesson, Iterator[Lesson], list[Revision], list[Vote]]
):
    """The lessons plugin's calls over a synchronous
    :class:`~buildmax.client.Client` (which the caller opens and closes)."""

    ERRORS = ERRORS

    def _lesson(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        key: str | None = None,
        ident: str | None = None,
        by: str | None = None,
    ) -> Lesson:
        answer = self.client.request(method, path, json=body, idempotency_key=key)
        return _the_lesson(parse_lesson(answer), ident, by)

    def _items(self, path: str, params: dict[str, Any]) -> Iterator[Any]:
        cursor: str | None = None
        seen: set[str] = set()
        while True:
            asked = {**params, **present(cursor=cursor)}
            items, cursor = _page(self.client.request("GET", path, params=asked))
            yield from items
            if _next_cursor(cursor, seen) is None:
                return

    def _lessons(self, path: str, params: dict[str, Any]) -> Iterator[Lesson]:
        for number, item in enumerate(self._items(path, params)):
            yield parse_lesson(item, f"items[{number}]")

    def _revisions(self, path: str) -> list[Revision]:
        return [parse_revision(r, f"items[{n}]") for n, r in enumerate(self._items(path, {}))]

    def _votes(self, path: str) -> list[Vote]:
        return [parse_vote(v, f"items[{n}]") for n, v in enumerate(self._items(path, {}))]


class AsyncLessonsClient(
    OverAsyncClient,
    _LessonRoutes[
        Awaitable[Lesson], AsyncIterator[Lesson], Awaitable[list[Revision]], Awaitable[list[Vote]]
    ],
):
    """The asynchronous twin of :class:`LessonsClient`, over an
    :class:`~buildmax.client.AsyncClient`: the same calls, awaited (a list
    or search is an async iterator)."""

    ERRORS = ERRORS

    async def _lesson(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        key: str | None = None,
        ident: str | None = None,
        by: str | None = None,
    ) -> Lesson:
        answer = await self.client.request(method, path, json=body, idempotency_key=key)
        return _the_lesson(parse_lesson(answer), ident, by)

    async def _items(self, path: str, params: dict[str, Any]) -> AsyncIterator[Any]:
        cursor: str | None = None
        seen: set[str] = set()
        while True:
            asked = {**params, **present(cursor=cursor)}
            items, cursor = _page(await self.client.request("GET", path, params=asked))
            for item in items:
                yield item
            if _next_cursor(cursor, seen) is None:
                return

    async def _lessons(self, path: str, params: dict[str, Any]) -> AsyncIterator[Lesson]:
        number = 0
        async for item in self._items(path, params):
            yield parse_lesson(item, f"items[{number}]")
            number += 1

    async def _revisions(self, path: str) -> list[Revision]:
        found: list[Revision] = []
        async for item in self._items(path, {}):
            found.append(parse_revision(item, f"items[{len(found)}]"))
        return found

    async def _votes(self, path: str) -> list[Vote]:
        found: list[Vote] = []
        async for item in self._items(path, {}):
            found.append(parse_vote(item, f"items[{len(found)}]"))
        return found


__all__ = [
    "ERRORS",
    "MARK_END",
    "MARK_START",
    "AppliesTo",
    "AsyncLessonsClient",
    "InvalidLessonSource",
    "Lesson",
    "LessonChanged",
    "LessonSuperseded",
    "LessonsClient",
    "MalformedAnswer",
    "Match",
    "Revision",
    "Source",
    "Usefulness",
    "Vote",
    "parse_lesson",
    "parse_revision",
    "parse_vote",
]
