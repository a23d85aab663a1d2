"""The lessons plugin's problem types (``urn:buildmax:problem:<slug>``)."""

from __future__ import annotations

from buildmax.problems import Conflict, ValidationFailed


class LessonChanged(Conflict):
    slug, title = "lesson-changed", "The lesson has a newer revision than the one named"


class LessonSuperseded(Conflict):
    slug, title = "lesson-superseded", "The lesson was superseded: correct its replacement"


class BadSource(ValidationFailed):
    slug, title = "invalid-lesson-source", "A source of the lesson is not a record of this space"
