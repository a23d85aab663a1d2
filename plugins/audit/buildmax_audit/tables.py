"""The audit plugin's tables (every name starts with ``audit_``).

``audit_chains`` holds one row per chain: the head (last sequence number and
its hash), which every append locks, and the anchor left by retention (the
sequence number and hash of the last event removed). ``audit_events`` holds
the events themselves; ``(chain, seq)`` is unique and, above the anchor,
gap-free. Spaces are named by public id: the trail outlives any numeric key.
"""

from __future__ import annotations

import sqlalchemy as sa

from buildmax.tables import Id, Millis

metadata = sa.MetaData()

#: The chain of events with no space.
SYSTEM_CHAIN = "system"
#: The action a retention sweep appends to the chain it trimmed.
RETENTION_ACTION = "audit.retention.applied"

chains = sa.Table(
    "audit_chains",
    metadata,
    sa.Column("chain", sa.Text, primary_key=True),
    # Sequence number and hash of the newest event (0 and the genesis hash
    # before the first one).
    sa.Column("seq", sa.BigInteger, nullable=False),
    sa.Column("head_hash", sa.Text, nullable=False),
    # The last event removed by retention (0 and the genesis hash if none).
    sa.Column("anchor_seq", sa.BigInteger, nullable=False),
    sa.Column("anchor_hash", sa.Text, nullable=False),
)

events = sa.Table(
    "audit_events",
    metadata,
    sa.Column("id", Id, primary_key=True, autoincrement=True),
    sa.Column("chain", sa.Text, nullable=False),
    sa.Column("seq", sa.BigInteger, nullable=False),
    sa.Column("time", Millis, nullable=False),
    sa.Column("actor_id", sa.Text, nullable=True),
    sa.Column("actor_kind", sa.Text, nullable=False),
    sa.Column("acting_through", sa.Text, nullable=True),
    sa.Column("space_id", sa.Text, nullable=True),
    sa.Column("action", sa.Text, nullable=False),
    sa.Column("target_type", sa.Text, nullable=True),
    sa.Column("target_id", sa.Text, nullable=True),
    # Canonical JSON of the declared detail keys (at most 8 KiB).
    sa.Column("details", sa.Text, nullable=False),
    sa.Column("request_id", sa.Text, nullable=True),
    sa.Column("admin_override", sa.Integer, nullable=False),
    # sha256(previous hash || canonical JSON of this event), hex.
    sa.Column("hash", sa.Text, nullable=False),
    sa.UniqueConstraint("chain", "seq", name="audit_event_chain_seq"),
    sa.Index("audit_event_chain_time", "chain", "time"),
    sa.Index("audit_event_time", "time"),
    sa.Index("audit_event_target", "target_id"),
)

TABLES = (chains, events)
