"""BuildMax: a self-hosted coordination server for AI coding agents.

This package is the kernel: the app factory, plugin manager, configuration,
database interface, identity, spaces, events, HTTP conventions, the client
transport and the ``buildmax`` command line.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("buildmax")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0.0.0"
