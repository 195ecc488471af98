"""The server's Prometheus metrics: requests, errors, latency, in-flight, batch sizes, queue time.

Written with ``prometheus_client`` rather than by hand: it is Prometheus's own maintained client,
and the exposition format has details (label escaping, cumulative ``le`` buckets with ``+Inf``,
``_count``/``_sum``/``_created`` series, content type and version) that a hand-written encoder
would have to get right and keep right. Each app gets its own ``CollectorRegistry`` instead of the
process-global default, so several apps in one process (tests, a library user) never collide and
``/metrics`` shows only the server's series, not the Python process collectors.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from bertforge.serve.batching import BatchStats

# Seconds: from a tiny model on a CPU (a millisecond) to a long summary (tens of seconds).
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    30.0, 60.0)
_QUEUE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_BATCH_ITEM_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_BATCH_TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536)

CONTENT_TYPE = CONTENT_TYPE_LATEST

# The per-replica series: (field of a replica's row, metric name, kind, help).
_REPLICA_SERIES = (
    ("batches", "bertforge_replica_batches", "counter", "Batches a replica answered."),
    ("items", "bertforge_replica_items", "counter",
     "Request items in the batches a replica answered."),
    ("busy_seconds", "bertforge_replica_busy_seconds", "counter",
     ("Seconds a replica spent on batches, from sending one to receiving its answer "
      "(busy_seconds / wall time = use).")),
    ("errors", "bertforge_replica_errors", "counter",
     "Batches a replica failed (an exception, or the replica died while running it)."),
    ("timeouts", "bertforge_replica_timeouts", "counter",
     "Batches a replica did not answer within its deadline (it was killed for each)."),
    ("restarts", "bertforge_replica_restarts", "counter",
     "Times a replica was started again after it died or missed a deadline."),
    ("up", "bertforge_replica_up", "gauge",
     "1 while a replica is ready (idle or busy), 0 while it restarts or once it is left down."),
)
_READY = ("idle", "busy")


class _ReplicaCollector:
    """The per-replica series, read from the pool when scraped (the pool keeps the counts)."""

    def __init__(self, snapshot: Callable[[], Sequence[Mapping[str, Any]]]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        rows = self.snapshot()
        for key, name, kind, text in _REPLICA_SERIES:
            family_type = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = family_type(name, text, labels=["replica", "device"])
            for row in rows:
                value = (row["state"] in _READY) if key == "up" else row.get(key, 0)
                family.add_metric([str(row["replica"]), row["device"]], float(value))
            yield family


class _AdmissionCollector:
    """The admission queue's series, read from it when scraped (it keeps the counts)."""

    def __init__(self, admission: Any) -> None:
        self.admission = admission

    def collect(self) -> Iterator[Any]:
        a = self.admission
        yield GaugeMetricFamily("bertforge_queue_items", "Request items held: admitted and not "
                                "answered yet (being tokenized, queued or in a model call).",
                                value=a.admitted)
        yield GaugeMetricFamily("bertforge_queue_limit", "The most request items held at once "
                                "(--max-queue).", value=a.limit)
        rejected = CounterMetricFamily("bertforge_rejected_requests", "Requests answered 503 "
                                       "before any work: the queue was full, or the server was "
                                       "shutting down.", labels=["reason"])
        for reason, count in a.rejected.items():
            rejected.add_metric([reason], float(count))
        yield rejected
        yield CounterMetricFamily("bertforge_dropped_items", "Request items never computed "
                                  "because their client went away while they waited.",
                                  value=a.dropped)


class ServerMetrics:
    """The series one server exposes at ``/metrics`` (all names start with ``bertforge_``).

    ``endpoint`` labels are route paths (``/v1/question-answering``), never raw URLs, so a client
    probing random paths cannot grow the number of series; unknown paths count as ``other``.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter("bertforge_requests", "HTTP requests answered, by endpoint and "
                                "status code.", ["endpoint", "status"], registry=r)
        self.errors = Counter("bertforge_errors", "Requests answered with an error, by endpoint "
                              "and kind (client: 4xx, internal: 5xx).", ["endpoint", "kind"],
                              registry=r)
        self.latency = Histogram("bertforge_request_latency_seconds", "Time from receiving a "
                                 "request to sending its response.", ["endpoint"],
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.in_flight = Gauge("bertforge_requests_in_flight", "Requests received and not yet "
                               "answered.", registry=r)
        self.batch_items = Histogram("bertforge_batch_size", "Requests per model call (dynamic "
                                     "batching; retries of a failed batch count as batches of 1).",
                                     ["task"], buckets=_BATCH_ITEM_BUCKETS, registry=r)
        self.batch_tokens = Histogram("bertforge_batch_tokens", "Real tokens per model call.",
                                      ["task"], buckets=_BATCH_TOKEN_BUCKETS, registry=r)
        self.batch_padded = Histogram("bertforge_batch_padded_tokens", "Padded tokens per "
                                      "model call: rows x the longest row, what a padded "
                                      "forward pass computes.", ["task"],
                                      buckets=_BATCH_TOKEN_BUCKETS, registry=r)
        self.queue_time = Histogram("bertforge_queue_seconds", "Time a request item waited in "
                                    "the batching queue before its model call started.", ["task"],
                                    buckets=_QUEUE_BUCKETS, registry=r)
        self.model_time = Histogram("bertforge_batch_seconds", "Duration of one model call.",
                                    ["task"], buckets=_LATENCY_BUCKETS, registry=r)

    def observe_batch(self, task: str, stats: BatchStats) -> None:
        """Record one model call of the batcher serving ``task``."""
        self.batch_items.labels(task).observe(stats.items)
        self.batch_tokens.labels(task).observe(stats.tokens)
        self.batch_padded.labels(task).observe(stats.padded_tokens)
        self.model_time.labels(task).observe(stats.run_seconds)
        for seconds in stats.queue_seconds:
            self.queue_time.labels(task).observe(seconds)

    def add_replicas(self, snapshot: Callable[[], Sequence[Mapping[str, Any]]]) -> None:
        """Expose per-replica series (``bertforge_replica_*``, labels ``replica`` and
        ``device``) read from ``snapshot()``: one mapping per replica with ``replica``,
        ``device``, ``state`` (ready when "idle" or "busy"), ``batches``, ``items``,
        ``busy_seconds``, ``errors``, ``timeouts`` and ``restarts``
        (:meth:`bertforge.serve.replica_pool.ReplicaPool.snapshot`).
        """
        self.registry.register(_ReplicaCollector(snapshot))

    def add_admission(self, admission: Any) -> None:
        """Expose the admission queue's series (``bertforge_queue_items``,
        ``bertforge_queue_limit``, ``bertforge_rejected_requests_total`` by ``reason`` and
        ``bertforge_dropped_items_total``) read from ``admission``
        (:class:`bertforge.serve.admission.Admission`)."""
        self.registry.register(_AdmissionCollector(admission))

    def observe_request(self, endpoint: str, status: int, seconds: float) -> None:
        """Record one answered HTTP request."""
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)
        if status >= 400:
            self.errors.labels(endpoint, "internal" if status >= 500 else "client").inc()

    def exposition(self) -> bytes:
        """The Prometheus text format of every series (serve with :data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)


__all__ = ["CONTENT_TYPE", "ServerMetrics"]
