"""What the lesson routes read and answer (marshmallow schemas).

One body shape, :class:`LessonIn`, serves a new lesson over HTTP and a
lesson carried in a submission (``extensions.lessons``); a correction
(:class:`LessonCorrection`) names only what changes.
"""

from __future__ import annotations

import re
from typing import Any

from buildmax_hookspecs import TASK_KINDS
from marshmallow import EXCLUDE, RAISE, Schema, ValidationError, fields, validate, validates_schema

from buildmax.schemas import Pattern, StrictBoolean, revision_number

from .tables import KINDS, VOTES

#: Bounds of a lesson (the issue of every one of them is a 422 naming it).
MAX_TITLE = 200
MAX_TEXT = 20_000
MAX_TAGS = 20
MAX_PATHS = 20
MAX_SOURCES = 20
MAX_REASON = 2_000
#: The most lessons one submission may carry, and the most sources one
#: names besides its task, attempt and submission.
MAX_CARRIED = 5
CARRIED_SOURCES = MAX_SOURCES - 3
#: Task kinds a lesson may apply to (the tasks plugin's kinds).

#: Control characters (tab, newline and carriage return aside): never in a
#: lesson, so the search's snippet marks (U+0002, U+0003) are unambiguous.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
#: A letter or a digit: what a title, a text or a reason holds at least one of.
_WORDY = re.compile(r"[^\W_]")
#: A tag: what a task's label may be, so a tag can match a label.
TAG_PATTERN = Pattern(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,63}$", error="Not a valid tag.")
TAG = fields.String(validate=TAG_PATTERN)
#: A path or glob (``src/auth/**``, ``**/*.sql``): relative, no ``..``
#: segment, at most 32 folders deep.
PATH = fields.String(
    validate=[
        Pattern(r"^(?!/)(?!.*(^|/)\.\.(/|$))[A-Za-z0-9._*?\[\]!/@+=,-]{1,200}$"),
        lambda value: _shallow(value, 32),
    ]
)
#: A public id of the tasks or artifacts plugin (``ta_...``, ``at_...``).
RECORD_ID = Pattern(r"^[A-Za-z0-9_-]{1,64}$", error="Not a valid id.")
SOURCE_TYPES = ("task", "attempt", "submission", "artifact", "url")


def _shallow(value: str, depth: int) -> None:
    if value.count("/") >= depth:
        raise ValidationError(f"At most {depth} folders deep.")


def _plain_text(value: str) -> None:
    if _CONTROL.search(value):
        raise ValidationError("Control characters (other than tab and line breaks) are refused.")


def _not_blank(value: str) -> None:
    if not _WORDY.search(value):
        raise ValidationError("Must hold a letter or a digit.")


TITLE = dict(validate=[validate.Length(min=1, max=MAX_TITLE), _plain_text, _not_blank])
TEXT = dict(validate=[validate.Length(min=1, max=MAX_TEXT), _plain_text, _not_blank])


class LessonAppliesTo(Schema):
    """Where a lesson applies; an empty list applies everywhere."""

    class Meta:
        unknown = RAISE

    task_kinds = fields.List(
        fields.String(validate=validate.OneOf(TASK_KINDS)),
        load_default=list,
        validate=validate.Length(max=len(TASK_KINDS)),
        metadata={"description": "Task kinds it applies to (code, review, integration, general)"},
    )
    paths = fields.List(
        PATH,
        load_default=list,
        validate=validate.Length(max=MAX_PATHS),
        metadata={"description": "Paths or globs (src/auth/**) it applies to"},
    )
    tags = fields.List(
        TAG,
        load_default=list,
        validate=validate.Length(max=MAX_TAGS),
        metadata={"description": "Tags; a claim offers a lesson whose tag is a task label first"},
    )


class LessonSource(Schema):
    """Where a lesson came from: a record of this space, or a URL."""

    class Meta:
        unknown = RAISE

    type = fields.String(required=True, validate=validate.OneOf(SOURCE_TYPES))
    id = fields.String(validate=RECORD_ID, metadata={"description": "The record's id"})
    url = fields.String(
        validate=[validate.URL(schemes={"http", "https"}), validate.Length(max=2000)],
        metadata={"description": "For type url: an http(s) URL"},
    )

    @validates_schema
    def _one_reference(self, data: dict[str, Any], **_: Any) -> None:
        if data["type"] == "url":
            if "url" not in data or "id" in data:
                raise ValidationError("A url source gives url, not id.", "url")
        elif "id" not in data or "url" in data:
            raise ValidationError(f"A {data['type']} source gives its id, not url.", "id")


class LessonIn(Schema):
    """A new lesson."""

    class Meta:
        unknown = RAISE

    project = fields.String(
        load_default=None,
        allow_none=True,
        validate=validate.Length(min=1, max=200),
        metadata={"description": "A project (id or name); omit or null for the common collection"},
    )
    kind = fields.String(required=True, validate=validate.OneOf(KINDS))
    title = fields.String(required=True, **TITLE)  # type: ignore[arg-type]
    text = fields.String(required=True, **TEXT)  # type: ignore[arg-type]
    applies_to = fields.Nested(LessonAppliesTo, load_default=lambda: LessonAppliesTo().load({}))
    sources = fields.List(
        fields.Nested(LessonSource), load_default=list, validate=validate.Length(max=MAX_SOURCES)
    )


class CarriedLesson(LessonIn):
    """A lesson a submission carries: its project is the task's unless
    ``common`` puts it in the space's common collection. Its sources start
    with the task, the attempt and the submission, so it names at most
    :data:`CARRIED_SOURCES` more."""

    common = StrictBoolean(load_default=False)
    sources = fields.List(
        fields.Nested(LessonSource),
        load_default=list,
        validate=validate.Length(max=CARRIED_SOURCES),
    )

    @validates_schema(pass_original=True)
    def _no_project(self, data: dict[str, Any], original: Any, **_: Any) -> None:
        if isinstance(original, dict) and "project" in original:
            raise ValidationError(
                "A carried lesson is the task's project's (common: true for the space's).",
                "project",
            )


class LessonCorrection(Schema):
    """A correction: a new revision, made against the current one."""

    class Meta:
        unknown = RAISE

    revision = revision_number(
        required=True, metadata={"description": "The revision being corrected (the current one)"}
    )
    reason = fields.String(
        required=True, validate=[validate.Length(min=1, max=MAX_REASON), _plain_text, _not_blank]
    )
    kind = fields.String(validate=validate.OneOf(KINDS))
    title = fields.String(**TITLE)  # type: ignore[arg-type]
    text = fields.String(**TEXT)  # type: ignore[arg-type]
    applies_to = fields.Nested(LessonAppliesTo)
    sources = fields.List(fields.Nested(LessonSource), validate=validate.Length(max=MAX_SOURCES))


class LessonSupersession(Schema):
    """The lesson that replaces this one, and why."""

    class Meta:
        unknown = RAISE

    by = fields.String(required=True, validate=RECORD_ID)
    reason = fields.String(load_default="", validate=[validate.Length(max=MAX_REASON), _plain_text])


class LessonVoteIn(Schema):
    """A principal's usefulness vote on a lesson's current revision."""

    class Meta:
        unknown = RAISE

    vote = fields.String(required=True, validate=validate.OneOf(VOTES))
    revision = revision_number(
        load_default=None, metadata={"description": "The revision voted on (default: current)"}
    )
    note = fields.String(load_default="", validate=[validate.Length(max=MAX_REASON), _plain_text])


class LessonQuery(Schema):
    """The filters of the lesson list and search."""

    class Meta:
        unknown = EXCLUDE  # the page's limit and cursor are read on their own

    q = fields.String(
        validate=validate.Length(max=500),
        metadata={"description": 'Words and "phrases", all required (stemmed)'},
    )
    project = fields.String(
        validate=validate.Length(min=1, max=200),
        metadata={"description": "A project (id or name): its lessons and the common ones"},
    )
    common = fields.String(
        validate=validate.OneOf(("include", "exclude", "only")),
        metadata={"description": "The common collection: include (default), exclude or only"},
    )
    kind = fields.String(validate=validate.OneOf(KINDS))
    task_kind = fields.String(
        validate=validate.OneOf(TASK_KINDS),
        metadata={"description": "Lessons that apply to this kind of task"},
    )
    tag = fields.String(validate=TAG_PATTERN, metadata={"description": "Lessons with this tag"})
    path = fields.String(
        validate=validate.Length(min=1, max=500),
        metadata={"description": "Lessons that apply to this path (their globs match it)"},
    )
    superseded = fields.String(
        validate=validate.OneOf(("exclude", "include", "only")),
        metadata={"description": "Superseded lessons: exclude (default), include or only"},
    )


class LessonUsefulnessOut(Schema):
    helpful = fields.Integer()
    not_helpful = fields.Integer()
    wrong = fields.Integer()
    score = fields.Integer()


class LessonOut(Schema):
    """A lesson as it stands (its current revision)."""

    id = fields.String()
    space_id = fields.String()
    project_id = fields.String(allow_none=True)
    collection = fields.String(metadata={"description": "project or common"})
    kind = fields.String()
    title = fields.String()
    text = fields.String()
    applies_to = fields.Nested(LessonAppliesTo)
    sources = fields.List(fields.Nested(LessonSource))
    revision = fields.Integer()
    author_id = fields.String(allow_none=True)
    revised_by = fields.String(allow_none=True)
    correction_reason = fields.String()
    usefulness = fields.Nested(LessonUsefulnessOut)
    superseded_by = fields.String(allow_none=True)
    superseded_at = fields.String(allow_none=True)
    superseded_reason = fields.String(allow_none=True)
    supersedes = fields.List(fields.String())
    created_at = fields.String()
    updated_at = fields.String()
    match = fields.Dict(
        metadata={
            "description": "In a search: the snippet, matched words between U+0002 and U+0003"
        }
    )


class LessonPage(Schema):
    items = fields.List(fields.Nested(LessonOut))
    next_cursor = fields.String(allow_none=True)


class LessonRevisionOut(Schema):
    number = fields.Integer()
    kind = fields.String()
    title = fields.String()
    text = fields.String()
    applies_to = fields.Nested(LessonAppliesTo)
    sources = fields.List(fields.Nested(LessonSource))
    author_id = fields.String(allow_none=True)
    author_kind = fields.String()
    reason = fields.String()
    created_at = fields.String()


class LessonRevisionPage(Schema):
    items = fields.List(fields.Nested(LessonRevisionOut))
    next_cursor = fields.String(allow_none=True)


class LessonVoteOut(Schema):
    principal_id = fields.String()
    revision = fields.Integer()
    vote = fields.String()
    note = fields.String()
    created_at = fields.String()
    updated_at = fields.String()


class LessonVotePage(Schema):
    items = fields.List(fields.Nested(LessonVoteOut))
    next_cursor = fields.String(allow_none=True)
