"""One registered dataflow as the service hosts it: its registration and the small objects
that own each part of its state.

Guarantees: each part has one owner that changes it: :class:`~api.live.state.LiveState` (tracker,
versions, workers) is changed by the ingest path and recovery, :class:`~api.streams.publish.Publication`
(published frontier, history, subscribers) by the publish step, :class:`~api.delta.sync.DeltaLag`
by the Delta sync, :class:`~api.background.state.SparkState` by the Spark link
(:mod:`api.background`), :class:`~api.live.ages.Ages` by the publish step (frontier moves) and
the ingest path (durable batches). A tenant satisfies the small protocols the lower layers read
it through (:class:`api.delta.sync.Synced`, :class:`api.background.state.Hosted`,
:class:`api.delta.graphs.Described`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from api.background.state import SparkState
from api.delta.sync import DeltaLag
from api.durability.records import Register
from api.live.activity import Activity
from api.live.ages import Ages
from api.live.cost import Cost
from api.live.lifecycle import Rules, assess, frontier_explains
from api.live.rate import Throughput
from api.live.scopes import Hosting
from api.live.state import Counts, LiveState
from api.schema.models import location_json
from api.schema.parsing import parse_progress
from api.streams.publish import Publication
from tracker.graph import Graph, Update


@dataclass(eq=False)
class Tenant:
    """A registered dataflow and everything the service keeps about it in memory."""

    registration: Register
    graph: Graph
    live: LiveState
    publication: Publication
    lag: DeltaLag = field(default_factory=DeltaLag)
    spark: SparkState = field(default_factory=SparkState)
    engine_mode: str = "native"
    """``spark``: frontiers come from Spark micro-batches (:mod:`api.background.spark`)."""
    ready: bool = False
    """Registered durably (or recovered): visible to requests."""
    hosting: Hosting | None = None
    """A dataflow with nested scopes: its scopes and its locations' flat stand-ins
    (:mod:`api.live.scopes`); ``None`` for a flat dataflow."""
    ages: Ages = field(default_factory=lambda: Ages(time.time()))
    """When its frontiers last moved and its live pointstamps appeared (lag and blame)."""
    throughput: Throughput = field(default_factory=lambda: Throughput(time.time()))
    """Its durable batches per second since this process hosts it (the dashboard's plot)."""
    rules: Rules = field(default_factory=Rules)
    """When its state turns ``stalled`` or ``violation`` (:mod:`api.live.lifecycle`)."""
    activity: Activity | None = None
    """Its program's statistics (busy time per operator, records per channel), from the first
    report on (:mod:`api.live.activity`); ``None`` while none came."""
    deleted_at: float | None = None
    """When ``DELETE`` was answered (POSIX seconds); progress is refused from then on."""
    cost: Cost | None = None
    """The estimate of its batches' cost (:mod:`api.live.cost`): a costly one never runs on the
    event loop."""
    framed_registration: bytes | None = None
    """The registration as this process logged it (:func:`~api.durability.wal.framed`), kept for
    the log's new segments, whose headers repeat every registration: encoding them again there
    held every dataflow's acknowledgements (they wait for the new segment) ~0.25 s per 80 MB of
    registrations. A recovered dataflow's is read back from the log."""

    graph_json: list[bytes] | None = None
    """Its ``nodes`` and ``edges`` as ``GET /dataflows/{id}`` writes them
    (:func:`~api.schema.bodies.graph_json`), made on the first read and kept: the graph never
    changes, and validating and encoding a 50,000-node graph took ~0.3 s of the GIL per read."""

    @property
    def id(self) -> str:
        """The dataflow id."""
        return self.registration.df

    @property
    def name(self) -> str:
        """The name it was registered with."""
        return self.registration.name

    @property
    def token_hash(self) -> str:
        """The SHA-256 of its token."""
        return self.registration.token

    @property
    def created_at(self) -> str:
        """When it was registered (ISO 8601)."""
        return self.registration.created_at

    def parse(self, data: bytes | str) -> tuple[str, int, list[Update]]:
        """A progress body's ``(worker, seq, updates)``, validated against this dataflow."""
        return parse_progress(data, self.graph) if self.hosting is None else self.hosting.parse(data)

    def counts(self) -> Counts:
        """Occurrence counts as of the published frontier's version: in-flight batches (not
        durable yet) and, with the Spark engine, batches Spark has not folded in yet, undone."""
        return self.live.counts(updates for _, updates in self.spark.queue)

    def reset_published(self) -> None:
        """Publish the tracker's frontier as of the current version (after registration or
        recovery); with the Spark engine, queue the current counts as Spark's first
        micro-batch instead."""
        live = self.live
        live.durable_version = live.version
        if self.engine_mode == "spark":
            self.publication.reset({loc: () for loc in self.graph.locations()}, -1, floor=live.version)
            self.spark.queue = [(live.version, [(loc, t, c) for (loc, t), c in live.tracker.pointstamps().items()])]
            return
        self.publication.reset(live.tracker.frontiers, live.version)

    def lifecycle(self) -> dict[str, Any]:
        """The lifecycle fields of the status (``state`` first; :func:`api.live.lifecycle.assess`):
        the counts and the frontier that explains their negative ones are both as of the
        published version."""
        publication = self.publication
        return assess(self.rules, self.counts(),
                      last_change=publication.last_change_at, last_batch=self.live.last_batch_at,
                      now=time.time(), deleted_at=self.deleted_at,
                      location_json=location_json if self.hosting is None else self.hosting.location_json,
                      regressions=self.live.regressions, regression_count=self.live.regression_count,
                      explained=frontier_explains(lambda location: publication.frontier_of(location)[1]))

    def status(self) -> dict[str, Any]:
        """The ``status`` object of ``GET /v1/dataflows/{id}``."""
        return {
            **self.lifecycle(),
            "spark_check": self.spark.check,
            "spark_detail": self.spark.detail,
            "audit": self.spark.audit,
            "durable_version": self.live.durable_version,
            "frontier_version": self.publication.frontier_version,
            "engine": self.engine_mode,
            "graph_stored": self.lag.graph_stored,
            "delta_version": self.lag.delta_version,
            "workers": {w: s for w, (s, _) in sorted(self.live.durable_workers.items())},
            "lane": {"in_lane": self.live.in_lane, "queued": self.live.busy(), "batches": self.live.lane_batches},
        }

    def summary(self, state: str | None = None) -> dict[str, Any]:
        """The listing entry of ``GET /v1/dataflows`` (``state``: already assessed, else now)."""
        return {"id": self.id, "name": self.name, "timestamp_arity": self.graph.arity,
                "version": self.live.durable_version, "created_at": self.created_at,
                "state": state or self.lifecycle()["state"]}
