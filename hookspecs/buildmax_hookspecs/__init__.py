"""The BuildMax plugin contract.

Everything a plugin needs to talk to the kernel and to other plugins:
the pluggy markers, the hookspec modules, the records hooks pass and the
Protocols services implement. This package imports nothing of BuildMax.
"""

from . import app, audit, auth, storage
from .markers import PROJECT_NAME, hookimpl, hookspec
from .protocols import BlobNotFound, BlobStore, BlobTooLarge, Row, Transaction
from .records import (
    SYSTEM_ACTOR,
    Actor,
    AuditAction,
    AuditEvent,
    BlobRef,
    Migration,
    ResourceRef,
    Verdict,
)

#: The modules holding hookspecs, in the order the kernel registers them.
HOOKSPEC_MODULES = (app, storage, audit, auth)

__all__ = [
    "HOOKSPEC_MODULES",
    "PROJECT_NAME",
    "SYSTEM_ACTOR",
    "Actor",
    "AuditAction",
    "AuditEvent",
    "BlobNotFound",
    "BlobRef",
    "BlobStore",
    "BlobTooLarge",
    "Migration",
    "ResourceRef",
    "Row",
    "Transaction",
    "Verdict",
    "hookimpl",
    "hookspec",
]
