"""The imports plugin's problem types (``urn:buildmax:problem:<slug>``)."""

from __future__ import annotations

from buildmax.problems import Conflict, ValidationFailed


class FileRefused(ValidationFailed):
    """422: the file cannot be read as a whole with the format named
    (another format, an encoding error throughout, past a limit); ``line``
    says where."""

    slug, title = "import-file-refused", "The file cannot be read as this format"


class ImportStale(Conflict):
    """409: what the preview assumed changed (the file's records were
    imported or their tasks edited since, or the server's importers
    changed): preview the file again."""

    slug, title = "import-stale", "The preview is stale: preview the file again"


class ChunkOutOfOrder(Conflict):
    """409: a chunk is applied only after every chunk before it."""

    slug, title = "import-chunk-out-of-order", "Apply the chunks in order"
