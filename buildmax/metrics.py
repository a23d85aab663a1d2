"""The server's Prometheus metrics (``prometheus-client``).

Counters and histograms are kept in the process as requests and
transactions happen; the state of the data (leases, queues, bytes stored,
the last backup, free disk) is read only when ``/metrics`` is scraped, from
:mod:`buildmax.diagnostics` and the plugins' ``buildmax_gauges``.

Several server processes (``buildmax serve --workers N`` on PostgreSQL) share
one listening socket, so a scrape reaches one of them at random: they use
``prometheus-client``'s multiprocess mode (``buildmax serve`` gives them a
private directory in ``PROMETHEUS_MULTIPROC_DIR``), and whichever answers
sums every process's counters and histograms. A per-process label instead
would make each scrape see one process's series, a different one each time.

No label holds a credential, task text or the id of a record: a request is
counted by its route *template* (``/v1/spaces/<space>/tasks``), its method
and its status class; a gauge's labels are fixed sets or space slugs.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

#: The Prometheus text exposition format's content type.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: The environment variable that switches ``prometheus-client`` to files
#: shared by the server's processes.
MULTIPROCESS_DIR = "PROMETHEUS_MULTIPROC_DIR"

#: Methods counted by name; any other is counted as ``other``.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

#: The route label of a request no route matched (a 404 or 405).
UNMATCHED_ROUTE = "(unmatched)"

#: Request latency buckets, seconds: a read answers in milliseconds, an
#: upload may take a minute.
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

#: Transaction buckets, seconds: the writer's wait and hold.
TRANSACTION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class Metrics:
    """The metrics of one server process (``app.metrics``)."""

    def __init__(self, *, enabled: bool = True) -> None:
        #: ``metrics = false`` in the settings: nothing is counted and
        #: ``/metrics`` is not served.
        self.enabled = enabled
        self.registry = CollectorRegistry(auto_describe=False)
        self._counters: dict[str, Counter] = {}
        self.requests = Counter(
            "buildmax_http_requests",
            "HTTP requests answered, by method, route template and status class",
            ["method", "route", "status_class"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "buildmax_http_request_duration_seconds",
            "Time to the response's headers, by method and route template",
            ["method", "route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.authentication_failures = Counter(
            "buildmax_authentication_failures",
            "Refused credentials: an unknown, revoked or expired token, or a failed sign-in",
            ["kind"],
            registry=self.registry,
        )
        self.write_wait = Histogram(
            "buildmax_db_write_wait_seconds",
            "Time a write transaction waited for the writer (SQLite's write lock, "
            "a pooled PostgreSQL connection)",
            ["engine"],
            buckets=TRANSACTION_BUCKETS,
            registry=self.registry,
        )
        self.write_time = Histogram(
            "buildmax_db_write_seconds",
            "Time from BEGIN to COMMIT or ROLLBACK of a write transaction",
            ["engine"],
            buckets=TRANSACTION_BUCKETS,
            registry=self.registry,
        )
        self.stream_subscribers = Gauge(
            "buildmax_event_stream_subscribers",
            "Open event streams (GET /v1/spaces/{space}/events)",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        #: When this process last saw the blob store fail (epoch ms).
        self.blob_store_failed_at: int | None = None
        self.blob_store_errors = Counter(
            "buildmax_blob_store_errors",
            "Requests that failed because the blob store did not answer",
            registry=self.registry,
        )

    def counter(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> Counter:
        """The counter ``name`` of this process, created on first use (a
        plugin counts its events with it: claims, recoveries)."""
        found = self._counters.get(name)
        if found is None:
            found = Counter(name, documentation, list(labelnames), registry=self.registry)
            self._counters[name] = found
        return found

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        """Count one answered request."""
        if not self.enabled:
            return
        method = method if method in METHODS else "other"
        self.requests.labels(method, route, f"{status // 100}xx").inc()
        self.latency.labels(method, route).observe(seconds)

    def observe_write(self, engine: str, waited: float, held: float) -> None:
        """Record one write transaction's wait for the writer and its length."""
        if not self.enabled:
            return
        self.write_wait.labels(engine).observe(waited)
        self.write_time.labels(engine).observe(held)

    def exposition(self, gauges: Iterable[Metric]) -> bytes:
        """The text a scrape receives: every process's counters and
        histograms, then ``gauges`` (read now by the caller)."""
        registry = CollectorRegistry(auto_describe=False)
        if os.environ.get(MULTIPROCESS_DIR):
            MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        else:
            registry.register(_Collected(list(self.registry.collect())))
        registry.register(_Collected(list(gauges)))
        return generate_latest(registry)


class _Collected:
    """A collector that answers metrics already read."""

    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> list[Metric]:
        return self._metrics


def gauge_families(
    values: Iterable[tuple[str, str, float, Sequence[tuple[str, str]]]],
) -> list[Any]:
    """Prometheus gauge families from ``(name, help, value, labels)``
    tuples; values of one name become one family (the first help wins)."""
    families: dict[str, GaugeMetricFamily] = {}
    for name, documentation, value, labels in values:
        family = families.get(name)
        if family is None:
            family = GaugeMetricFamily(name, documentation, labels=[k for k, _ in labels])
            families[name] = family
        family.add_metric([v for _, v in labels], value)
    return list(families.values())
