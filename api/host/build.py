"""How a hosted dataflow is made: its frontier engine of the kind the service runs (compiled,
reference, counts only for ``--engine spark``, or one per scope for a nested dataflow) holding
its initial or recovered counts, and the tenant around it, for registration and recovery alike.

Guarantees: registration and recovery build a dataflow the same way, so a recovered dataflow's
engine, publication and ages are those a registration would have made from the same counts.
"""

from __future__ import annotations

import time
import weakref
from datetime import datetime

from api.background.state import too_large
from api.config import Settings
from api.delta.sync import DeltaLag
from api.durability.records import Register
from api.host.tenant import Tenant
from api.live.ages import Ages
from api.live.cost import Cost, reach_bounds
from api.live.counts import CountsOnly
from api.live.lifecycle import Rules
from api.live.scopes import Hosting, NestedEngine
from api.live.state import LiveState
from api.schema.registration import build_nested
from api.schema.spec import Spec
from api.streams.publish import Publication
from tracker.engine import FrontierEngine
from tracker.graph import Graph, Location, Update
from tracker.reachability import Tracker
from tracker.scoped import ScopedTracker

COSTS_KEPT = 64
"""Graph shapes whose reach bounds are kept (:meth:`Builder.cost`)."""


class Builder:
    """Makes the engines and tenants of one service (its settings; ``delta``: whether Delta
    tables are kept, so that published changes are queued for them)."""

    def __init__(self, settings: Settings, delta: bool) -> None:
        self.settings = settings
        self.delta = delta
        self._costs: dict[int, tuple[weakref.ref[Graph], dict[Location, int]]] = {}

    @property
    def checks_in_spark(self) -> bool:
        """Whether registrations are checked by Spark."""
        return self.settings.spark and self.settings.spark_check

    def tenant(self, record: Register, graph: Graph, tracker: FrontierEngine, initial: list[Update],
               hosting: Hosting | None = None, *, at_registration: bool = True,
               created: float | None = None) -> Tenant:
        """A tenant whose tracker holds ``initial`` (``at_registration``: version 0's state, whose
        frontier is queued as version 0's changes for ``frontier_changes``) or a snapshot's counts.
        ``created``: when its frontiers count as last moved if they never moved (default now)."""
        lag = DeltaLag()
        live = LiveState(tracker, lane_seconds=self.settings.lane_ms / 1e3, lane_backlog=self.settings.lane_backlog)
        ages = Ages(time.time() if created is None else created)
        if live.native is not None:  # the compiled engine's order: CompiledTracker.locations
            ages.births_in_engine(live.native.index, tracker.locations, graph.arity)  # type: ignore[attr-defined]
        # A nested dataflow is tracked natively even under `--engine spark` (Spark still checks
        # and audits it, scope by scope).
        mode = "native" if hosting is not None and self.settings.engine == "spark" else self.settings.engine
        tenant = Tenant(registration=record, graph=graph, live=live,
                        # Without Delta nothing would ever drain what changes_published queues.
                        publication=Publication(graph, self.settings.history,
                                                lag.changes_published if self.delta else None, hosting,
                                                native=live.native,
                                                copy_at=None if live.native is None else live.frontier_copy_at,
                                                moved=ages.frontier_moved),
                        lag=lag, engine_mode=mode, hosting=hosting, ages=ages,
                        rules=Rules(self.settings.stall_seconds))
        ages.counts = tenant.counts
        tenant.cost = self.cost(graph, tracker, hosting)
        if live.native is not None:
            tenant.publication.row_indices()  # O(graph), once: here, off the loop
        tenant.publication.last_change_at = datetime.fromisoformat(record.created_at).timestamp()
        tenant.reset_published()
        if at_registration and mode != "spark":  # Spark's first micro-batch publishes version 0 itself
            tenant.publication.record_initial(datetime.fromisoformat(record.created_at).timestamp())
        lag.batch_durable(0, "_initial", 0, initial, time.time())
        ages.batch_durable(ages.created, None, initial)
        if not self.checks_in_spark:
            tenant.spark.check = "skipped"
        if mode != "spark" and (too_large_by := too_large(graph if hosting is None else hosting,
                                                          self.settings.spark_max_locations)) is not None:
            # Not sent to Spark at all: neither checked nor audited (the Spark engine has no choice).
            tenant.spark.audited = False
            if self.checks_in_spark:
                tenant.spark.check, tenant.spark.detail = "skipped", too_large_by
        return tenant

    def cost(self, graph: Graph, tracker: FrontierEngine, hosting: Hosting | None) -> Cost:
        """The batch-cost estimate of a dataflow (:mod:`api.live.cost`): its reach bounds are
        computed once per graph shape (equal graphs share one :class:`Graph`, see
        :func:`~api.schema.registration.build_graph`; a restart of thousands of dataflows of
        a few shapes computes a few), a nested dataflow's over its flattened stand-ins."""
        order = getattr(tracker, "locations", None) if getattr(tracker, "engine", None) is not None else None
        if hosting is not None:
            steps = [(hosting.flat(step.src), hosting.flat(step.dst)) for moves in hosting.steps.values()
                     for step in moves]
            return Cost(reach_bounds([hosting.flat(loc) for loc in hosting.nested.locations()], steps), order)
        known = self._costs.get(id(graph))
        if known is not None and known[0]() is graph:
            return Cost(known[1], order)
        reach = reach_bounds(graph.locations(), [(t.src, t.dst) for t in graph.transitions()])
        self._costs[id(graph)] = (weakref.ref(graph), reach)
        while len(self._costs) > COSTS_KEPT:
            self._costs.pop(next(iter(self._costs)))
        return Cost(reach, order)

    def engine(self, graph: Graph, initial: list[Update], hosting: Hosting | None = None) -> FrontierEngine:
        """A frontier engine of ``graph`` (which :func:`build_graph` checked for cycles) holding
        ``initial``; for a nested dataflow (``hosting``), one over its stand-ins, with one flat
        engine per scope of the kind the service runs."""
        tracker: FrontierEngine
        if hosting is not None:
            tracker = NestedEngine(hosting, ScopedTracker(hosting.nested, flat=self.scope_engine))
        elif self.settings.engine == "spark":
            tracker = CountsOnly(graph)
        else:
            tracker = self.scope_engine(graph)
        native = getattr(tracker, "engine", None)
        if native is not None:  # no Python list of the changes, which nobody reads (100,000 for a big graph)
            native.apply(initial)
        else:
            tracker.apply(initial, validated=True)
        return tracker

    def scope_engine(self, graph: Graph) -> FrontierEngine:
        """The flat engine of one graph whose cycles were checked (a flat dataflow's, or one
        scope's of a nested dataflow): the Python reference under ``--engine reference``, else
        the compiled engine (the settings checked that it imports)."""
        if self.settings.engine == "reference":
            return Tracker(graph, cycles_checked=True)
        from tracker.compiled import CompiledTracker

        return CompiledTracker(graph, cycles_checked=True)

    def nested(self, record: Register | Spec, new: bool, *, empty: bool = False
               ) -> tuple[Hosting, FrontierEngine, list[Update]]:
        """Validate a nested registration (:func:`build_nested`, off the event loop): its
        hosting, an engine holding its initial pointstamps (none if ``empty``) and those, on the
        stand-ins."""
        nested, scoped = build_nested(record, new=new)
        hosting = Hosting(nested)
        initial = [(hosting.flat(loc), t, d) for loc, t, d in scoped]
        return hosting, self.engine(hosting.root, [] if empty else initial, hosting), initial
