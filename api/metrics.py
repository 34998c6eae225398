"""Prometheus metrics (prometheus-client), served as text at ``/metrics``.

Each service gets its own :class:`CollectorRegistry` so that several apps in one process (tests,
benchmarks) never collide on metric names. ``/metrics`` needs no token, so by default no
series names a dataflow (nor, so, reveals its id): per-dataflow gauges are aggregated
(``tracker_frontier_lag_max_seconds``, one ``tracker_audit_ok``); with ``per_dataflow``
(``--metrics-per-dataflow``) the labelled series are exported too.

An audit's verdict is never guessed: ``tracker_audit_mismatched_dataflows`` counts the dataflows
whose last audit disagreed (0 before any audit, and with Spark off), ``tracker_audited_dataflows``
those with a concluded audit, ``tracker_spark_state`` says whether Spark is off, and
``tracker_audit_ok`` appears only once some audit concluded.

>>> metrics = Metrics(per_dataflow=False)
>>> fresh = metrics.render().decode()
>>> "tracker_audit_ok" in fresh, "tracker_audit_mismatched_dataflows 0.0" in fresh
(False, True)
>>> lags = lambda: [("d1", "op #1", "in 0", 3.5), ("d2", "op #1", "in 0", 7.0)]
>>> metrics.audit_result("d1", True); metrics.audit_result("d2", False)
>>> text = metrics.render(Scrape(lags, states={"violation": 1}, spark="disabled")).decode()
>>> "tracker_frontier_lag_max_seconds 7.0" in text, "tracker_audit_ok 0.0" in text, "d1" in text
(True, True, False)
>>> "tracker_audit_mismatched_dataflows 1.0" in text, 'tracker_spark_state{state="disabled"} 1.0' in text
(True, True)
>>> 'tracker_dataflows_in_state{state="violation"} 1.0' in text
True
>>> metrics = Metrics(per_dataflow=True)
>>> text = metrics.render(Scrape(lambda: [("d1", "op #1", "in 0", 3.5)], estimates=lambda: [("d1", "op #1", 2.0, 5.0)]))
>>> 'tracker_frontier_lag_seconds{dataflow="d1",operator="op #1",port="in 0"} 3.5' in text.decode()
True
>>> 'tracker_operator_eta_seconds{dataflow="d1",operator="op #1"} 5.0' in text.decode()
True

A program's statistics (``Attach::statistics``) follow the same rule: by default the busiest
operator's share and the records per second of every channel together; the labelled series only
``per_dataflow``.

>>> busy = lambda: [("d1", "busy_share", "Sleepy #2", 0.75), ("d1", "records_per_second", "a -> b", 40.0),
...                 ("d2", "records_per_second", "c -> d", 2.0)]
>>> text = Metrics().render(Scrape(activity=busy)).decode()
>>> "tracker_operator_busy_share_max 0.75" in text, "tracker_channels_records_per_second 42.0" in text, "d1" in text
(True, True, False)
>>> text = Metrics(per_dataflow=True).render(Scrape(activity=busy)).decode()
>>> 'tracker_operator_busy_share{dataflow="d1",operator="Sleepy #2"} 0.75' in text
True
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LagRow = tuple[str, str, str, float]
"""``(dataflow id, operator, port, lag seconds)`` of one operator input with a non-empty frontier."""
EstimateRow = tuple[str, str, float | None, float | None]
"""``(dataflow id, operator, epochs per second, expected seconds to done or None)`` of an operator
whose rate is known (:mod:`api.ops.estimate`)."""
ActivityRow = tuple[str, str, str, float]
"""``(dataflow id, "busy_share" or "records_per_second", operator or channel, value)`` of one
operator or channel of a program that sends statistics (:mod:`api.live.activity`)."""
STATES = ("running", "complete", "stalled", "violation", "deleted")
"""The lifecycle states ``tracker_dataflows_in_state`` counts (:mod:`api.live.lifecycle`)."""
SPARK_STATES = ("disabled", "starting", "ready", "unresponsive", "down")
"""The states ``tracker_spark_state`` reports."""


@dataclass(frozen=True)
class Scrape:
    """What one scrape reports beyond the counters, read from the dataflows by the caller."""

    lag_rows: Callable[[], Iterable[LagRow]] = lambda: ()
    oldest_age: float = 0.0
    states: Mapping[str, int] = field(default_factory=dict)
    """How many dataflows are in each lifecycle state."""
    estimates: Callable[[], Iterable[EstimateRow]] = lambda: ()
    spark: str = "disabled"
    """The Spark process's state (:meth:`api.background.spark.SparkLink.health`)."""
    activity: Callable[[], Iterable[ActivityRow]] = lambda: ()
    """The programs' statistics: operators' busy shares and channels' records per second."""

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    """Every metric the service exports."""

    def __init__(self, engine: str = "native (compiled)", *, per_dataflow: bool = False) -> None:
        self.registry = CollectorRegistry()
        self.per_dataflow = per_dataflow
        self.scrape_source: Callable[[], Scrape] = Scrape
        """Read at every scrape that is not given one (set by the service: the dataflows' lags,
        ages, states and estimates)."""
        self._audits: dict[str, bool] = {}
        self._scrape_lock = threading.Lock()
        self._scrape = Scrape()
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
        if per_dataflow:
            self.audit_ok = Gauge("tracker_audit_ok", "1 if Spark's from-scratch frontier equalled the live one at "
                                  "the dataflow's last audit, 0 if not", ["dataflow"], registry=r)
        r.register(_ScrapeCollector(self))
        self.audits = Counter("tracker_audits", "Spark audits by result", ["result"], registry=r)
        reports = Counter("tracker_statistics_reports", "Programs' statistics reports by outcome (refused: "
                          "naming an operator or channel the dataflow does not have)", ["outcome"], registry=r)
        self.activity_accepted, self.activity_refused = reports.labels("accepted"), reports.labels("refused")
        self.spark_checks = Counter("tracker_spark_registration_checks", "Spark registration checks by result",
                                    ["result"], registry=r)

    def audit_result(self, dataflow_id: str, ok: bool) -> None:
        """A dataflow's audit concluded (labelled by dataflow only with ``per_dataflow``)."""
        if self.per_dataflow:
            self.audit_ok.labels(dataflow_id).set(1 if ok else 0)
        self._audits[dataflow_id] = ok

    def on_sync(self, records: int, seconds: float) -> None:
        """Called by the write-ahead log after each group commit."""
        self.wal_sync.observe(seconds)
        self.wal_group.observe(records)

    def render(self, scrape: Scrape | None = None) -> bytes:
        """The Prometheus text exposition; ``scrape``, if given, instead of :attr:`scrape_source`'s
        (a caller that read the state on the event loop renders in a worker thread)."""
        with self._scrape_lock:
            self._scrape = self.scrape_source() if scrape is None else scrape
            return generate_latest(self.registry)


class _ScrapeCollector(Collector):
    """The gauges computed at scrape time from the scrape :meth:`Metrics.render` was given: lags,
    ages, states, estimates."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        metrics = self._metrics
        scrape = metrics._scrape  # set by render, under its lock
        rows = list(scrape.lag_rows())
        age = scrape.oldest_age
        yield GaugeMetricFamily("tracker_frontier_lag_max_seconds",
                                "The largest wall-clock time any operator input's non-empty frontier has gone "
                                "without changing, over all dataflows (0 if none waits)",
                                value=max((row[3] for row in rows), default=0.0))
        yield GaugeMetricFamily("tracker_pointstamp_age_max_seconds",
                                "The age of the oldest live pointstamp of any dataflow (0 if none)",
                                value=age)
        if metrics.per_dataflow:
            labelled = GaugeMetricFamily("tracker_frontier_lag_seconds",
                                         "Wall-clock seconds since an operator input's non-empty frontier last "
                                         "changed", labels=["dataflow", "operator", "port"])
            for dataflow_id, operator, port, seconds in rows:
                labelled.add_metric([dataflow_id, operator, port], seconds)
            yield labelled
        states = GaugeMetricFamily("tracker_dataflows_in_state", "Dataflows in each lifecycle state (running, "
                                   "complete, stalled, violation, deleted)", labels=["state"])
        for state in STATES:
            states.add_metric([state], scrape.states.get(state, 0))
        yield states
        audits = dict(metrics._audits)
        yield GaugeMetricFamily("tracker_audited_dataflows", "Dataflows with a concluded Spark audit (0: none yet, "
                                "or Spark off)", value=len(audits))
        yield GaugeMetricFamily("tracker_audit_mismatched_dataflows", "Dataflows whose last Spark audit found the "
                                "live frontier different from the from-scratch one", value=sum(not ok for ok in
                                                                                               audits.values()))
        if audits and not metrics.per_dataflow:
            yield GaugeMetricFamily("tracker_audit_ok", "1 if, for every audited dataflow, Spark's from-scratch "
                                    "frontier equalled the live one at its last audit, 0 if not (absent before the "
                                    "first audit concludes)", value=1 if all(audits.values()) else 0)
        spark = GaugeMetricFamily("tracker_spark_state", "1 for the Spark process's state (disabled: Spark is off; "
                                  "starting, ready, unresponsive, down), 0 for the others", labels=["state"])
        for state in SPARK_STATES:
            spark.add_metric([state], 1 if scrape.spark == state else 0)
        yield spark
        estimates = list(scrape.estimates())
        yield GaugeMetricFamily("tracker_progress_eta_max_seconds",
                                "The longest expected time until an operator is done, over every operator whose "
                                "rate and last epoch are known (0 if none)",
                                value=max((row[3] for row in estimates if row[3] is not None), default=0.0))
        if metrics.per_dataflow:
            rate = GaugeMetricFamily("tracker_operator_epochs_per_second", "Epochs an operator's inputs cleared per "
                                     "second over the last 10 s (operators with a known rate)",
                                     labels=["dataflow", "operator"])
            eta = GaugeMetricFamily("tracker_operator_eta_seconds", "Expected seconds until an operator's input "
                                    "frontiers are empty (known rate and last epoch)", labels=["dataflow", "operator"])
            for dataflow_id, operator, per_second, expected in estimates:
                if per_second is not None:
                    rate.add_metric([dataflow_id, operator], per_second)
                if expected is not None:
                    eta.add_metric([dataflow_id, operator], expected)
            yield rate
            yield eta
        yield from _activity(list(scrape.activity()), metrics.per_dataflow)

    def describe(self) -> Iterator[Metric]:
        return iter(())


def _activity(rows: list[ActivityRow], per_dataflow: bool) -> Iterator[Metric]:
    """The statistics' gauges: aggregated always, labelled by dataflow only ``per_dataflow``."""
    shares = [row for row in rows if row[1] == "busy_share"]
    rates = [row for row in rows if row[1] == "records_per_second"]
    yield GaugeMetricFamily("tracker_operator_busy_share_max", "The largest share of its workers' time any operator "
                            "spent busy over the last 10 s of its program's statistics, over all dataflows (0 if "
                            "none sends statistics)", value=max((row[3] for row in shares), default=0.0))
    yield GaugeMetricFamily("tracker_channels_records_per_second", "Records per second sent on every channel of "
                            "every dataflow that sends statistics, together (last 10 s)",
                            value=sum(row[3] for row in rates))
    if per_dataflow:
        busy = GaugeMetricFamily("tracker_operator_busy_share", "Share of its workers' time an operator spent busy "
                                 "(last 10 s of statistics)", labels=["dataflow", "operator"])
        for dataflow_id, _, operator, value in shares:
            busy.add_metric([dataflow_id, operator], value)
        yield busy
        sent = GaugeMetricFamily("tracker_channel_records_per_second", "Records per second sent on a channel (last "
                                 "10 s of statistics)", labels=["dataflow", "channel"])
        for dataflow_id, _, channel, value in rates:
            sent.add_metric([dataflow_id, channel], value)
        yield sent
