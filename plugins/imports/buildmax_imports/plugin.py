"""The imports plugin's hook implementations (entry point ``imports``)."""

from __future__ import annotations

from buildmax_hookspecs import Importer, hookimpl

from buildmax.app import BuildMax

from . import beads, csvfile, github
from .sources import importers


@hookimpl
def buildmax_importers() -> list[Importer]:
    return [beads.IMPORTER, csvfile.IMPORTER, github.IMPORTER]


@hookimpl
def buildmax_startup(app: BuildMax) -> None:
    # Two plugins offering one importer name stop the server here.
    importers(app.hooks)
