"""A typed client of the imports routes, over :class:`buildmax.client.Client`.

What a server answers is checked before it is used: an answer that is not
an import or a chunk's report as the API documents them raises
:class:`MalformedAnswer`, never a ``KeyError`` or a wrong number deep in a
command.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buildmax.client import BuildMaxError, OverClient, space_path
from buildmax.client import Conflict as ClientConflict

from . import problems

#: How much of the file is sent at a time.
PIECE = 1 << 20
_IDENTITY = re.compile(r"[0-9a-f]{64}")


class MalformedAnswer(ValueError):
    """The server's answer is not what the imports API documents."""


class ImportStale(ClientConflict, answers=problems.ImportStale):
    """409: what the preview assumed moved; preview the file again."""


class ChunkOutOfOrder(ClientConflict, answers=problems.ChunkOutOfOrder):
    """409: an earlier chunk is not applied yet."""


#: The imports plugin's exceptions, each raised for its problem.
ERRORS: tuple[type[BuildMaxError], ...] = (ImportStale, ChunkOutOfOrder)


def _field(body: Any, name: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(body, dict) or not isinstance(body.get(name), kind):
        raise MalformedAnswer(f"the server's answer has no valid {name!r}")
    value = body[name]
    if isinstance(value, bool) and kind is int:
        raise MalformedAnswer(f"the server's answer has no valid {name!r}")
    return value


@dataclass(frozen=True)
class Import:
    """An import as the client uses it, checked; ``body`` is the answer as sent."""

    id: str
    identity: str
    state: str
    chunk_count: int
    chunks_applied: int
    counts: dict[str, int]
    body: dict[str, Any]

    @classmethod
    def of(cls, body: Any) -> Import:
        identity = _field(body, "identity", str)
        if not _IDENTITY.fullmatch(identity):
            raise MalformedAnswer("the server's answer has no valid 'identity'")
        counts = _field(body, "counts", dict)
        if not all(isinstance(v, int) and v >= 0 for v in counts.values()):
            raise MalformedAnswer("the server's answer has no valid 'counts'")
        applied = _field(body, "chunks_applied", int)
        chunks = body.get("chunks")
        count = len(chunks) if isinstance(chunks, list) else None
        if count is None or not 0 <= applied <= count:
            raise MalformedAnswer("the server's answer has no valid 'chunks'")
        return cls(
            _field(body, "id", str),
            identity,
            _field(body, "state", str),
            count,
            applied,
            counts,
            body,
        )


@dataclass(frozen=True)
class ChunkReport:
    """What applying a chunk did, checked."""

    number: int
    counts: dict[str, int]
    body: dict[str, Any]

    @property
    def replayed(self) -> bool:
        """Whether the chunk had been applied before (this is its report again)."""
        return self.body.get("replayed") is True

    @classmethod
    def of(cls, body: Any, number: int) -> ChunkReport:
        if _field(body, "number", int) != number:
            raise MalformedAnswer(f"the server answered for another chunk than {number}")
        counts = _field(body, "counts", dict)
        if not all(isinstance(v, int) and v >= 0 for v in counts.values()):
            raise MalformedAnswer("the server's answer has no valid 'counts'")
        _field(body, "items", list)
        return cls(number, counts, body)


def _pieces(path: Path) -> Iterator[bytes]:
    with path.open("rb") as file:
        while piece := file.read(PIECE):
            yield piece


class ImportsClient(OverClient):
    """The imports routes of one server."""

    ERRORS = ERRORS

    def preview(
        self, space: str, path: Path, *, format: str, project: str, chunk_size: int | None = None
    ) -> Import:
        """Send the file at ``path`` (streamed) to be previewed; the preview,
        with each record's item."""
        params: dict[str, Any] = {"format": format, "project": project, "name": path.name}
        if chunk_size is not None:
            params["chunk_size"] = chunk_size
        with self.client.stream(
            "POST",
            space_path(space, "imports"),
            params=params,
            content=_pieces(path),
            headers={"Content-Type": "application/octet-stream"},
        ) as response:
            response.read()
            made = Import.of(response.json())
        return self.show(space, made.id)

    def show(self, space: str, import_id: str, *, items: bool = True) -> Import:
        """The import ``import_id``, with its preview."""
        params = None if items else {"items": "exclude"}
        return Import.of(
            self.client.request("GET", space_path(space, "imports", import_id), params=params)
        )

    def apply_chunk(self, space: str, import_id: str, number: int, identity: str) -> ChunkReport:
        """Apply chunk ``number`` (retried safely: an applied chunk answers its report)."""
        body = self.client.request(
            "POST",
            space_path(space, "imports", import_id, "chunks", str(number)),
            json={"identity": identity},
        )
        return ChunkReport.of(body, number)
