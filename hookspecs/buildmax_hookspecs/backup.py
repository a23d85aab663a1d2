"""Hooks for backups and restores (``buildmax backup``).

A backup reads one consistent snapshot of the database; the hooks that read
take that snapshot's connection (``conn``), never a write transaction, and
must read only through it so that what they report matches the snapshot the
backup copies.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from typing import Any

from .kernel import App
from .markers import hookspec
from .protocols import Transaction
from .records import AuditEvent, BlobRef, Restoration


@hookspec
def buildmax_backup_blobs(conn: Transaction) -> AsyncIterator[BlobRef] | None:
    """The blobs this plugin's rows reference, read in the backup's snapshot.

    Yield a :class:`BlobRef` (key, size, sha256) for every blob a row that
    is not tombstoned names (an artifact's bytes, a release's package); the
    same key twice is copied once. The backup copies each from the blob
    store into the backup, and a restore tombstones through
    ``buildmax_restored`` whatever it could not put back.
    """


@hookspec
def buildmax_backup_facts(conn: Transaction) -> Awaitable[Mapping[str, Any]] | None:
    """Facts of the snapshot this plugin wants in the backup's manifest.

    Return (an awaitable of) a JSON-able mapping, stored under the plugin's
    name (the audit plugin records its chain heads). ``buildmax backup
    verify`` hands it back to ``buildmax_backup_check``.
    """


@hookspec
def buildmax_backup_check(app: App, facts: Mapping[str, Any]) -> Awaitable[Sequence[str]] | None:
    """Check a backup's database against the ``facts`` this plugin recorded
    in its manifest (an empty mapping when it recorded none). ``app`` is
    opened on a scratch copy of the backup's database (``backup verify``) or
    on the restored one before anything is changed in it (``backup
    restore``); read it, never write.

    Return (an awaitable of) the problems found, one line each, or an empty
    sequence; the audit plugin verifies each chain up to its recorded head.
    """


@hookspec
def buildmax_restored(
    app: App, tx: Transaction, restoration: Restoration
) -> Awaitable[Sequence[str]] | None:
    """A backup was restored: bring this plugin's rows into the new epoch.

    Called once, inside the restore's write transaction, after the kernel
    revoked its credentials. End the leases this plugin granted (their work
    is recovered by the next claim), raise any fencing generation by
    ``restoration.generation_stride``, tombstone (audited, quota given back)
    every row whose blob is in ``restoration.lost_blobs``. Return (an
    awaitable of) report lines naming what was changed, for the operator.
    """


@hookspec
def buildmax_restore_replay(path: str, facts: Mapping[str, Any]) -> Sequence[AuditEvent] | None:
    """The audit events recorded after a backup, read from an audit export.

    Called by ``buildmax backup restore --audit-export PATH`` before anything
    is restored; ``facts`` is what this plugin recorded in the backup's
    manifest. The plugin that owns the audit trail reads the export, checks
    that it verifies and that it continues the backup's chains (it names
    each chain's recorded head), and returns the events after them, oldest
    first; other plugins return ``None``. Raise ``ValueError`` with a
    one-line reason to refuse the file: the restore then changes nothing.
    The restore re-applies what these events undid (see
    :class:`Restoration`).
    """
