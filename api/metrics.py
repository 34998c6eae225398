"""Prometheus metrics (prometheus-client), served as text at ``/metrics``.

Each service gets its own :class:`CollectorRegistry` so that several apps in one process (tests,
benchmarks) never collide on metric names.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """Every metric the service exports."""

    def __init__(self, engine: str = "native (compiled)") -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # tracker_engine_info{engine="native (compiled)"} 1.0: which engine keeps the frontiers.
        Info("tracker_engine", "The frontier engine on the hot path", registry=r).info({"engine": engine})
        self.batches = Counter("tracker_batches", "Progress batches by outcome", ["outcome"], registry=r)
        # The hot path's children, looked up once (``labels()`` hashes and locks on every call).
        self.applied, self.duplicates, self.rejected, self.gaps = (
            self.batches.labels(outcome) for outcome in ("applied", "duplicate", "rejected", "gap"))
        self.updates = Counter("tracker_updates", "Pointstamp updates applied", registry=r)
        self.frontier_changes = Counter("tracker_frontier_changes", "Frontier changes published", registry=r)
        self.subscribers = Gauge("tracker_subscribers", "Open frontier streams", ["transport"], registry=r)
        self.resyncs = Counter("tracker_subscriber_resyncs", "Subscribers that fell behind and were resynced",
                               registry=r)
        self.apply_latency = Histogram("tracker_apply_latency_seconds",
                                       "From a parsed batch to its durable acknowledgement",
                                       buckets=_LATENCY_BUCKETS, registry=r)
        self.wal_sync = Histogram("tracker_wal_sync_seconds", "One group commit: write + fdatasync",
                                  buckets=_LATENCY_BUCKETS, registry=r)
        self.wal_group = Histogram("tracker_wal_group_records", "Records per group commit",
                                   buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), registry=r)
        self.dataflows = Gauge("tracker_dataflows", "Registered dataflows", registry=r)
        self.damaged = Gauge("tracker_dataflows_damaged",
                             "Dataflows recovery refused (a damaged log record or lost Delta state)", registry=r)
        self.flush_lag = Gauge("tracker_delta_lag_versions", "Durable versions not yet in the Delta progress table",
                               registry=r)
        self.delta_errors = Counter("tracker_delta_errors", "Failed Delta flushes or compactions", registry=r)
        self.audit_ok = Gauge("tracker_audit_ok",
                              "1 if Spark's from-scratch frontier equalled the live one at the last audit, 0 if not",
                              ["dataflow"], registry=r)
        self.audits = Counter("tracker_audits", "Spark audits by result", ["result"], registry=r)
        self.spark_checks = Counter("tracker_spark_registration_checks", "Spark registration checks by result",
                                    ["result"], registry=r)

    def on_sync(self, records: int, seconds: float) -> None:
        """Called by the write-ahead log after each group commit."""
        self.wal_sync.observe(seconds)
        self.wal_group.observe(records)

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
