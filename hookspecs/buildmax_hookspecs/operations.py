"""Hooks for running a server: the facts an operator watches.

What a plugin reports here reaches ``/metrics`` (Prometheus), ``GET
/v1/diagnostics``, ``buildmax status`` and each space's attention list
(``GET /v1/spaces/{space}/attention``). Both hooks are read when someone
looks (a scrape, a page), never on a request's path: keep each to a few
indexed, aggregate queries on ``conn``, a read connection.
"""

from __future__ import annotations

from collections.abc import Awaitable, Iterable

from .kernel import App
from .markers import hookspec
from .protocols import Transaction
from .records import Attention, Gauge


@hookspec
def buildmax_gauges(app: App, conn: Transaction) -> Awaitable[Iterable[Gauge]] | None:
    """The plugin's state as numbers, read now (leases by state, the ready
    queue's depth per space, bytes stored).

    Return (an awaitable of) :class:`Gauge` values. A gauge's name starts
    with ``buildmax_`` and says its unit (``_bytes``, ``_seconds``); its
    label values come from fixed sets or are space slugs, never a credential,
    task text or the id of a task, attempt or principal, so that the number
    of series stays bounded. Gauges of one name share their help text and
    label names.
    """


@hookspec
def buildmax_attention(
    app: App, conn: Transaction, now: int, space_pk: int | None
) -> Awaitable[Iterable[Attention]] | None:
    """What a person should look at now, in the space ``space_pk`` (in every
    space when it is ``None``): a lease that lapsed
    and waits for recovery, a question nobody answered, a review waiting
    longer than its threshold, a failed materialization.

    Return (an awaitable of) :class:`Attention` items. Each names its space
    (``space_pk``; ``None`` for the whole server, which only system admins
    and operators see) and the least space role that may see it; the kernel
    filters by the caller's role and renders the list. Bound each kind's
    list (the oldest first) so a backlog cannot make a page unbounded.
    """
