"""What the imports routes take and answer."""

from __future__ import annotations

from marshmallow import EXCLUDE, Schema, fields, validate

from buildmax.schemas import BoundedInteger, Pattern, Timestamp

from .plan import ACTIONS, CHUNK_SIZE
from .tables import STATES

#: The most records a chunk holds (one short transaction each).
MAX_CHUNK = 500


class PreviewQuery(Schema):
    """What a preview names in its query; the body is the file."""

    class Meta:
        unknown = EXCLUDE

    format = fields.String(
        required=True,
        validate=Pattern(r"^[a-z][a-z0-9-]{0,31}$"),
        metadata={"description": "The importer: beads, csv, github, or a plugin's"},
    )
    project = fields.String(
        required=True,
        validate=validate.Length(min=1, max=200),
        metadata={"description": "The project (id or name) the tasks go into"},
    )
    chunk_size = BoundedInteger(
        1,
        MAX_CHUNK,
        load_default=CHUNK_SIZE,
        text=True,
        metadata={"description": "Records per chunk (each chunk is one transaction)"},
    )
    name = fields.String(
        validate=Pattern(r"^[^\x00-\x1f\x7f]{1,255}$"),
        metadata={"description": "The file's name, as the person knows it"},
    )


class ApplyIn(Schema):
    identity = fields.String(
        required=True,
        validate=Pattern(r"^[0-9a-f]{64}$"),
        metadata={"description": "The identity of the preview being applied"},
    )


class ImportQuery(Schema):
    class Meta:
        unknown = EXCLUDE

    items = fields.String(
        load_default="include",
        validate=validate.OneOf(("include", "exclude")),
        metadata={"description": "Each record's item: include (the default) or exclude"},
    )


class FileOut(Schema):
    name = fields.String(allow_none=True)
    sha256 = fields.String()
    size = fields.Integer()


class CountsOut(Schema):
    records = fields.Integer()
    create = fields.Integer()
    update = fields.Integer()
    unchanged = fields.Integer()
    conflict = fields.Integer()
    problems = fields.Integer()
    refused = fields.Integer()


class ChunkOut(Schema):
    number = fields.Integer()
    first = fields.String()
    last = fields.String()
    records = fields.Integer()
    applied = fields.Boolean()


class ProblemOut(Schema):
    line = fields.Integer()
    reason = fields.String()
    source_id = fields.String(allow_none=True)


class EdgeOut(Schema):
    source_id = fields.String()
    kind = fields.String()
    target = fields.String()
    reason = fields.String()


class LinkOut(Schema):
    kind = fields.String()
    target = fields.String()


class ItemOut(Schema):
    source_id = fields.String()
    line = fields.Integer()
    title = fields.String()
    action = fields.String(validate=validate.OneOf(ACTIONS))
    chunk = fields.Integer()
    task_id = fields.String(allow_none=True)
    state = fields.String()
    source_state = fields.String()
    state_reason = fields.String()
    prerequisites = fields.List(fields.String())
    links = fields.List(fields.Nested(LinkOut))
    notes = fields.List(fields.String())
    warnings = fields.List(fields.String())


class ImportOut(Schema):
    id = fields.String()
    space_id = fields.String()
    project_id = fields.String()
    format = fields.String()
    file = fields.Nested(FileOut)
    identity = fields.String()
    service_revision = fields.String()
    state = fields.String(validate=validate.OneOf(STATES))
    chunk_size = fields.Integer()
    chunks_applied = fields.Integer()
    counts = fields.Nested(CountsOut)
    chunks = fields.List(fields.Nested(ChunkOut))
    problems = fields.List(fields.Nested(ProblemOut))
    refused = fields.List(fields.Nested(EdgeOut))
    items = fields.List(fields.Nested(ItemOut))
    created_at = Timestamp()
    updated_at = Timestamp()


class ImportPage(Schema):
    items = fields.List(fields.Nested(ImportOut))
    next_cursor = fields.String(allow_none=True)


class AppliedItemOut(Schema):
    source_id = fields.String()
    action = fields.String(validate=validate.OneOf(ACTIONS))
    task_id = fields.String(allow_none=True)
    state = fields.String()
    changes = fields.List(fields.String())
    notes = fields.List(fields.String())


class ChunkCountsOut(Schema):
    create = fields.Integer()
    update = fields.Integer()
    unchanged = fields.Integer()
    conflict = fields.Integer()


class ChunkReportOut(Schema):
    import_id = fields.String()
    number = fields.Integer()
    of = fields.Integer()
    applied_at = Timestamp()
    counts = fields.Nested(ChunkCountsOut)
    items = fields.List(fields.Nested(AppliedItemOut))
    relinked = fields.List(fields.String())
    replayed = fields.Boolean(
        dump_default=False,
        metadata={"description": "True when the chunk was applied before: its report, again"},
    )
