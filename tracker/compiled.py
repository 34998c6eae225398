"""The compiled tracker: :class:`~tracker.reachability.Tracker`'s interface on the Rust engine.

:class:`CompiledTracker` is a drop-in replacement for :class:`tracker.reachability.Tracker`:
same constructor, same methods, same results. For every graph and every sequence of batches
(counts may go transiently negative) it returns, batch by batch, exactly the reference's
frontier changes — consolidated, one ``+1`` or ``-1`` per (location, time) whose frontier
membership changed, as :class:`~tracker.reachability.FrontierChange` tuples sorted by
(time, location) — and the same ``frontier``, ``frontiers``, ``pointstamps`` and
``can_notify`` answers. Bad batches raise the same :class:`~tracker.graph.GraphError` and change
nothing; graphs with non-incrementing cycles raise the same ``ValueError``.

The work is done by the compiled module ``progress_engine`` (built from ``engine/``), whose
low-level API (:attr:`CompiledTracker.engine`: flat integer batches in, a compiled
``ChangeBatch`` out that encodes its JSON payload itself) avoids Python objects per update and
per change; this class builds them, for callers that want the reference's types.

>>> from tracker.graph import Connection, Edge, Node
>>> from tracker.timestamp import PathSummary
>>> g = Graph.build(1, [Node(0, 1, 1), Node(1, 1, 1), Node(2, 1, 1,
...     connections=(Connection(0, 0, (PathSummary((1,)),)),))],
...     [Edge(Location.source(a, 0), Location.target(b, 0)) for a, b in [(0, 1), (1, 2), (2, 0)]])
>>> tracker = CompiledTracker(g)
>>> changes = tracker.apply([(Location.source(0, 0), (17,), 1)])
>>> len(changes), changes[0]
(6, FrontierChange(location=Location(node=0, port=0, kind='source'), time=(17,), diff=1))
>>> from tracker.reachability import Tracker
>>> changes == Tracker(g).apply([(Location.source(0, 0), (17,), 1)])
True
>>> tracker.frontier(Location.target(0, 0)), tracker.can_notify(Location.target(1, 0), (16,))
([(18,)], True)
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Iterable
from typing import Any

from progress_engine import Engine

from tracker.graph import Graph, Location, Update
from tracker.reachability import FrontierChange
from tracker.structure import find_cycles
from tracker.timestamp import Timestamp

__all__ = ["CompiledTracker", "FrontierChange", "engine_for", "pointstamp_cost"]


def location_json(location: Location) -> str:
    """The JSON text of a location as the service's payloads spell it (``json.dumps`` layout).

    >>> location_json(Location.target(3, 0))
    '{"node": 3, "port": 0, "kind": "target"}'
    """
    return f'{{"node": {location.node}, "port": {location.port}, "kind": "{location.kind}"}}'


def engine_for(graph: Graph, locations: list[Location] | None = None, *, pairwise: bool = False
               ) -> tuple[Engine, list[Location]]:
    """A fresh engine for ``graph`` (assumed free of non-incrementing cycles) and its location
    order: index ``i`` of the engine is ``locations[i]``.

    ``locations`` defaults to the locations sorted as tuples, ``(node, port, kind)``, so that
    the engine's (time, index) order of changes is the reference's (time, location) order. The
    engine carries the locations as labels and their :func:`location_json` fragments.
    ``pairwise=True`` builds the engine's earlier algorithm (pairwise antichains, one time per
    propagation round; the same results), for comparisons.
    """
    if locations is None:
        with _LAYOUTS_LOCK:
            layout = _LAYOUTS.get(id(graph))
            if layout is not None and layout[0] is graph:
                _LAYOUTS.move_to_end(id(graph))
        if layout is None or layout[0] is not graph:
            layout = (graph, *_layout(graph, graph.sorted_locations()))
            with _LAYOUTS_LOCK:
                _LAYOUTS[id(graph)] = layout
                if len(_LAYOUTS) > LAYOUTS_KEPT:
                    _LAYOUTS.popitem(last=False)
        _, order, index, transitions, fragments = layout
    else:
        order, index, transitions, fragments = _layout(graph, list(locations))
    options = {"pairwise": True} if pairwise else {}  # an engine built before the option still serves
    engine = Engine(graph.arity, len(order), transitions, labels=order, json=fragments, index=index, **options)
    return engine, order


LAYOUTS_KEPT = 16
"""Graphs (by identity: registrations of one shape share one, :func:`api.schema.registration.build_graph`)
whose engine inputs :func:`engine_for` keeps: a restart building 2,500 engines of one 100-operator
ring spent ~0.9 ms each making them again."""
_LAYOUTS: OrderedDict[int, tuple[Graph, list[Location], dict[Location, int], list[Any], str]] = OrderedDict()
_LAYOUTS_LOCK = threading.Lock()


def _layout(graph: Graph, order: list[Location]) -> tuple[list[Location], dict[Location, int], list[Any], str]:
    """What an engine of ``graph`` is built from, its locations in ``order``: the order, the index
    of each location, the transitions on indices and the locations' JSON fragments."""
    index = {loc: i for i, loc in enumerate(order)}
    transitions = [
        (index[step.src], index[step.dst], None if step.summary.is_zero() else tuple(step.summary))
        for step in graph.transitions()
    ]
    # Joined: the engine reads one string in place, where copying out a list of 100,000 held the
    # GIL ~2.5 ms.
    fragments = "\n".join([location_json(loc) for loc in order])
    return order, index, transitions, fragments


class CompiledTracker:
    """Occurrence counts and exact, incrementally maintained frontiers of one dataflow,
    computed by the compiled engine; interchangeable with :class:`tracker.reachability.Tracker`.
    """

    def __init__(self, graph: Graph, *, cycles_checked: bool = False) -> None:
        """``cycles_checked=True`` skips the cycle check when the caller has just run
        :func:`~tracker.structure.find_cycles` on this very graph and found none."""
        cycles = [] if cycles_checked else find_cycles(graph)
        if cycles:
            raise ValueError("graph has non-incrementing cycles: " + ", ".join(map(str, cycles)))
        self.graph = graph
        self.engine, self._locations = engine_for(graph)
        self._index = self.engine.index  # the engine's own label index (engine_for built it)

    def apply(self, updates: Iterable[Update], *, validated: bool = False) -> list[FrontierChange]:
        """Apply one atomic batch and return the frontier changes it causes, consolidated.

        The batch is validated first (unknown locations, wrong arity, non-integer deltas raise
        :class:`~tracker.graph.GraphError` and change nothing) unless ``validated`` says the
        caller already did. Changes are sorted by (time, location).
        """
        batch = updates if validated else self.graph.check_updates(updates)
        return self.engine.apply(batch).to_list(labels=True, cls=FrontierChange)

    @property
    def locations(self) -> list[Location]:
        """Every location in the engine's index order: index ``i`` of the engine (of its
        ``ChangeBatch`` es) is ``locations[i]``."""
        return self._locations

    def frontier(self, location: Location) -> list[Timestamp]:
        """The minimal times that may still appear at ``location``, sorted."""
        return self.engine.frontier(self._index(location))

    def frontiers(self) -> dict[Location, list[Timestamp]]:
        """Every location's frontier (empty list where nothing can arrive any more)."""
        every = self.engine.frontiers()
        index = self._index
        return {loc: every[index(loc)] for loc in self.graph.locations()}

    def pointstamps(self) -> dict[tuple[Location, Timestamp], int]:
        """Every non-zero occurrence count, keyed by ``(location, time)``."""
        locations = self._locations
        return {(locations[i], time): count for i, time, count in self.engine.pointstamps()}

    def can_notify(self, location: Location, time: Timestamp) -> bool:
        """True iff a notification for ``time`` at ``location`` is safe: no frontier element
        is ``<= time``."""
        return self.engine.can_notify(self._index(location), time)


def pointstamp_cost(graph: Graph, origins: Iterable[Location]) -> tuple[float, int]:
    """What one pointstamp costs the compiled engine: the slowest batch (CPU seconds of this
    thread, so that a busy machine does not inflate it; the least of three tries) placing one
    pointstamp at the zero time at any of ``origins``, or retracting it, and the widest frontier
    it makes at any location (the widest antichain of minimal path summaries from ``origins``).

    Measured on a fresh engine, so graphs whose antichains multiply are judged by what the
    engine really spends on them (:data:`tracker.structure.COMPILED_SUMMARY_COST_BASE`).

    >>> from tracker.graph import Connection, Edge, Node
    >>> from tracker.timestamp import PathSummary
    >>> units = (PathSummary((1, 0)), PathSummary((0, 1)))
    >>> g = Graph.build(2, [Node(i, 1, 1, connections=(Connection(0, 0, units),)) for i in range(3)],
    ...                 [Edge(Location.source(i, 0), Location.target(i + 1, 0)) for i in range(2)])
    >>> seconds, widest = pointstamp_cost(g, [Location.target(0, 0)])
    >>> widest, seconds < 1
    (4, True)
    """
    engine, order = engine_for(graph)
    index = {loc: i for i, loc in enumerate(order)}
    zero = [0] * graph.arity
    slowest, widest = 0.0, 0
    for origin in origins:
        at = index[origin]
        best = [float("inf"), float("inf")]  # the least of three tries: the engine's cost, not the scheduler's
        for _ in range(3):
            for k, delta in enumerate((1, -1)):
                started = time.thread_time()
                batch = engine.apply_indexed([at], zero, [delta])
                best[k] = min(best[k], time.thread_time() - started)
                if delta > 0 and len(batch):
                    widest = max(widest, max(Counter(batch.locations()).values()))
        slowest = max(slowest, *best)
    return slowest, widest
