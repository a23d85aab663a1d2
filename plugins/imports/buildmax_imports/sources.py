"""The importers every plugin offers, and a file read through one of them.

:func:`importers` gathers the ``buildmax_importers`` of every plugin by
name (a name offered twice is an error naming both plugins); :func:`read`
reads a file with one, keeping every record and every problem, and adds
the problems no single record shows: an id a file holds twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import BinaryIO

from buildmax_hookspecs import Importer, SourceProblem, SourceRecord, SourceRefused

from buildmax.hooks import Hooks


class ImporterDeclarationError(RuntimeError):
    """A plugin offered something that is not an importer, or a name taken."""


def importers(hooks: Hooks) -> dict[str, Importer]:
    """Every importer the loaded plugins offer, by name."""
    found: dict[str, tuple[str, Importer]] = {}
    for plugin, offered in hooks.importers():
        for importer in offered:
            if not isinstance(importer, Importer) or not isinstance(importer.name, str):
                raise ImporterDeclarationError(
                    f"plugin {plugin!r} offered {importer!r}, not an importer"
                )
            if importer.name in found:
                raise ImporterDeclarationError(
                    f"importer {importer.name!r} is offered by plugins "
                    f"{found[importer.name][0]!r} and {plugin!r}"
                )
            found[importer.name] = (plugin, importer)
    return {name: importer for name, (_, importer) in sorted(found.items())}


@dataclass
class Reading:
    """What a file held: its records, in file order, each id once, and
    every problem, by line; ``refused`` when the file could not be read as
    a whole (it says where and why), and then ``records`` hold what was read
    before."""

    records: list[SourceRecord] = field(default_factory=list)
    problems: list[SourceProblem] = field(default_factory=list)
    refused: SourceRefused | None = None


def read(importer: Importer, source: BinaryIO) -> Reading:
    """``source`` read with ``importer``; a record whose id came before
    is a problem (the first is kept)."""
    reading = Reading()
    first: dict[str, int] = {}
    try:
        for item in importer.read(source):
            if isinstance(item, SourceProblem):
                reading.problems.append(item)
            elif item.source_id in first:
                reading.problems.append(
                    SourceProblem(
                        item.line,
                        f"id {item.source_id!r} again (first on line {first[item.source_id]}): "
                        "left out",
                        item.source_id,
                    )
                )
            else:
                first[item.source_id] = item.line
                reading.records.append(item)
    except SourceRefused as refused:
        reading.refused = refused
    reading.problems.sort(key=lambda problem: problem.line)
    return reading
