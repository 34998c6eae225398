"""The native incremental progress tracker, modelled on timely's ``reachability::Tracker``.

It keeps the occurrence count of every pointstamp and, for every location, the frontier: the
minimal times that may still appear there. Applying an atomic batch of ``(location, time,
delta)`` returns exactly the frontier changes the batch causes.

How: each location has a :class:`MutableAntichain` of *implications*, counting one for every
frontier element of its own pointstamps and one for every frontier element of each
predecessor pushed along the connecting transition. A change to a frontier propagates one hop
along the outgoing transitions, and so on. Changes are processed in increasing time order
(lexicographic, a linear extension of the product order) so that every change at a time is
settled before any later time is looked at; because every cycle strictly advances times,
transient support around a loop cancels out and the process ends.

Guarantee: after every batch, each location's frontier equals the definition of
``docs/core.md`` (the minimal times that positive pointstamps could-result-in there; the
property tests compare it with :mod:`tracker.oracle`), and :meth:`Tracker.apply` returns
exactly the net changes of the frontiers.

>>> from tracker.graph import Edge, Node
>>> pipeline = Graph.build(1, [Node(0, 0, 1), Node(1, 1, 0)], [Edge(Location.source(0, 0), Location.target(1, 0))])
>>> tracker = Tracker(pipeline)
>>> [(str(c.location), c.time, c.diff) for c in tracker.apply(pipeline.default_initial())]
[('(0,0,source)', (0,), 1), ('(1,0,target)', (0,), 1)]
>>> tracker.can_notify(Location.target(1, 0), (0,))
False
>>> changes = tracker.apply([(Location.source(0, 0), (1,), 1), (Location.source(0, 0), (0,), -1)])
>>> tracker.can_notify(Location.target(1, 0), (0,)), tracker.frontier(Location.target(1, 0))
(True, [(1,)])
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable
from operator import itemgetter
from typing import NamedTuple

from tracker.antichain import MutableAntichain
from tracker.graph import Graph, Location, Update
from tracker.structure import find_cycles
from tracker.timestamp import PathSummary, Timestamp


class FrontierChange(NamedTuple):
    """A time entering (``diff=+1``) or leaving (``diff=-1``) a location's frontier."""

    location: Location
    time: Timestamp
    diff: int


_BY_TIME = itemgetter(1, 0, 2)  # (time, location, diff)


class Tracker:
    """Occurrence counts and exact, incrementally maintained frontiers of one dataflow.

    The graph must be free of non-incrementing cycles (checked at construction). Counts may go
    transiently negative; only positive counts hold times back.

    >>> from tracker.graph import Connection, Edge, Node
    >>> g = Graph.build(1, [Node(0, 1, 1), Node(1, 1, 1), Node(2, 1, 1,
    ...     connections=(Connection(0, 0, (PathSummary((1,)),)),))],
    ...     [Edge(Location.source(a, 0), Location.target(b, 0)) for a, b in [(0, 1), (1, 2), (2, 0)]])
    >>> tracker = Tracker(g)
    >>> changes = tracker.apply([(Location.source(0, 0), (17,), 1)])
    >>> tracker.frontier(Location.target(0, 0)), tracker.frontier(Location.target(1, 0))
    ([(18,)], [(17,)])
    """

    def __init__(self, graph: Graph, *, cycles_checked: bool = False) -> None:
        """Start with every count zero (every frontier empty).

        Args:
            graph: the validated graph.
            cycles_checked: skip the cycle check (linear, but a large share of building a
                tracker for a big graph) because the caller has just run :func:`find_cycles` on
                this very graph and found none.

        Raises:
            ValueError: the graph has a cycle that does not advance timestamps (the message
                names its transitions).
        """
        cycles = [] if cycles_checked else find_cycles(graph)
        if cycles:
            raise ValueError("graph has non-incrementing cycles: " + ", ".join(map(str, cycles)))
        self.graph = graph
        # Zero summaries are stored as None: most transitions are edges, and skipping
        # results_in for them is a large share of the hot path.
        self._outgoing: dict[Location, list[tuple[Location, PathSummary | None]]] = {
            loc: [] for loc in graph.locations()
        }
        for step in graph.transitions():
            self._outgoing[step.src].append((step.dst, None if step.summary.is_zero() else step.summary))
        self._pointstamps: dict[Location, MutableAntichain[Timestamp]] = {
            loc: MutableAntichain() for loc in graph.locations()
        }
        self._implications: dict[Location, MutableAntichain[Timestamp]] = {
            loc: MutableAntichain() for loc in graph.locations()
        }

    def apply(self, updates: Iterable[Update], *, validated: bool = False) -> list[FrontierChange]:
        """Apply one atomic batch and return the frontier changes it causes, consolidated.

        The batch is validated first unless ``validated`` says the caller already did (with
        :meth:`~tracker.graph.Graph.check_updates`). Changes are sorted by (time, location), at
        most one per pair.

        Raises:
            tracker.graph.GraphError: an unknown location, a wrong arity, a non-integer delta;
                nothing changed.
        """
        batch = list(updates) if validated else self.graph.check_updates(updates)
        per_location: dict[Location, list[tuple[Timestamp, int]]] = defaultdict(list)
        for location, time, delta in batch:
            per_location[location].append((time, delta))
        worklist: list[tuple[Timestamp, Location, int]] = []
        for location, time_deltas in per_location.items():
            for time, diff in self._pointstamps[location].update_iter(time_deltas):
                worklist.append((time, location, diff))
        return self._propagate(worklist)

    def _propagate(self, worklist: list[tuple[Timestamp, Location, int]]) -> list[FrontierChange]:
        # Work is grouped by time: a heap of distinct times, and per time a dict location -> diff
        # that merges repeated pushes. Times are settled in lexicographic order (a linear
        # extension of the product order); within one time only zero-summary transitions lead
        # back to the same time, and those form no cycle, so the order inside a bucket is free.
        buckets: dict[Timestamp, dict[Location, int]] = {}
        times: list[Timestamp] = []
        for time, location, diff in worklist:
            bucket = buckets.get(time)
            if bucket is None:
                bucket = buckets[time] = {}
                heapq.heappush(times, time)
            bucket[location] = bucket.get(location, 0) + diff
        pushed: dict[tuple[Location, Timestamp], int] = {}
        implications = self._implications
        outgoing = self._outgoing
        while times:
            time = heapq.heappop(times)
            bucket = buckets[time]
            while bucket:
                location, diff = bucket.popitem()
                if diff == 0:
                    continue
                for changed, change in implications[location].update(time, diff):
                    key = (location, changed)
                    pushed[key] = pushed.get(key, 0) + change
                    for dest, summary in outgoing[location]:
                        moved = changed if summary is None else summary.results_in(changed)
                        if moved is None:
                            continue
                        target = buckets.get(moved)
                        if target is None:
                            target = buckets[moved] = {}
                            heapq.heappush(times, moved)
                        target[dest] = target.get(dest, 0) + change
            del buckets[time]
        # tuple.__new__ and itemgetter skip NamedTuple's Python-level constructor and a lambda
        # per change: with hundreds of changes per batch, those cost a tenth of the service's time.
        new = tuple.__new__
        changes = [new(FrontierChange, (loc, t, d)) for (loc, t), d in pushed.items() if d != 0]
        changes.sort(key=_BY_TIME)
        return changes

    def frontier(self, location: Location) -> list[Timestamp]:
        """The minimal times that may still appear at ``location``, sorted."""
        return self._implications[location].frontier()

    def frontiers(self) -> dict[Location, list[Timestamp]]:
        """Every location's frontier (empty list where nothing can arrive any more)."""
        return {loc: self._implications[loc].frontier() for loc in self.graph.locations()}

    def pointstamps(self) -> dict[tuple[Location, Timestamp], int]:
        """Every non-zero occurrence count, keyed by ``(location, time)``."""
        return {
            (loc, time): count
            for loc, counts in self._pointstamps.items()
            for time, count in counts.counts().items()
        }

    def can_notify(self, location: Location, time: Timestamp) -> bool:
        """True iff a notification for ``time`` at ``location`` is safe: no frontier element
        is ``<= time``."""
        return not self._implications[location].less_equal(time)
