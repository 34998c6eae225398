"""A batch's cost, known before it runs: where it may propagate (the event loop, or the
dataflow's own lane) is decided from the batch and the graph, not from what its predecessor
cost.

The estimate is in *units*, about one location reached by one update: for each location a
batch touches, the number of locations reachable from it (an upper bound, computed once per
graph: :func:`reach_bounds`) times the updates there, times a factor for the width they make
(``1 + k / 64`` for ``k`` updates at one location: many incomparable times at once widen every
antichain downstream, and maintaining a wide antichain costs more per element). It is a few
dictionary look-ups per distinct location of the batch (a ``Counter`` built in C).
:data:`LANE_UNITS` is about a millisecond of the compiled engine's work: a batch estimated over
it never runs on the event loop.

>>> from tracker.graph import Location
>>> a, b, c = Location.source(0, 0), Location.target(1, 0), Location.source(1, 0)
>>> bounds = reach_bounds([a, b, c], [(a, b), (b, c)])
>>> [bounds[x] for x in (a, b, c)]
[3, 2, 1]
>>> cost = Cost(bounds)
>>> cost.of([(a, (0,), 1), (a, (1,), -1)])
6.1875
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from api.schema.parsing import Indexed
from tracker.graph import Location, Update
from tracker.structure import strong_components

LANE_UNITS = 50_000.0
"""A batch estimated over this many units propagates in its dataflow's lane, whatever came before."""
WIDTH_UNITS = 64.0
"""``k`` updates at one location cost ``k * (1 + k / WIDTH_UNITS)`` times its reach."""


class Arc(NamedTuple):
    """One step of a graph, as :func:`reach_bounds` takes it."""

    src: Location
    dst: Location


def reach_bounds(locations: Sequence[Location], steps: Iterable[tuple[Location, Location]]) -> dict[Location, int]:
    """For each location, an upper bound of the locations reachable from it (itself included):
    the strongly connected components of the steps (:func:`tracker.structure.strong_components`),
    then, from the sinks back, each component's size plus its successors' bounds, at most every
    location. Linear in the graph.
    """
    arcs = [Arc(src, dst) for src, dst in steps]
    component = strong_components(list(locations), arcs)  # type: ignore[arg-type]  # Transition's src and dst
    size = Counter(component.values())
    successors: dict[int, set[int]] = defaultdict(set)
    indegree = dict.fromkeys(size, 0)
    for arc in arcs:
        a, b = component[arc.src], component[arc.dst]
        if a != b and b not in successors[a]:
            successors[a].add(b)
            indegree[b] += 1
    order = [k for k, n in indegree.items() if n == 0]
    for k in order:  # Kahn's order over the components, grown while it is read
        for b in successors[k]:
            indegree[b] -= 1
            if indegree[b] == 0:
                order.append(b)
    n = len(locations)
    bound: dict[int, int] = {}
    for k in reversed(order):  # the sinks first
        bound[k] = min(n, size[k] + sum(bound[b] for b in successors[k]))
    return {loc: bound[component[loc]] for loc in locations}


class Cost:
    """The estimate of a dataflow's batches: ``reach`` is :func:`reach_bounds` of its tracker's
    locations; ``order`` its compiled engine's locations by index (for :class:`Indexed` batches)."""

    def __init__(self, reach: Mapping[Location, int], order: Sequence[Location] | None = None) -> None:
        self.reach = reach
        self.by_index = [reach.get(loc, 1) for loc in order] if order is not None else None

    def of(self, updates: Indexed | list[Update]) -> float:
        """The estimated units of one batch."""
        if isinstance(updates, Indexed) and self.by_index is not None:
            by_index = self.by_index
            return sum(by_index[i] * k * (1 + k / WIDTH_UNITS) for i, k in Counter(updates.locations).items())
        reach = self.reach
        at: Counter[Any] = Counter(loc for loc, _, _ in updates)
        return sum(reach.get(loc, 1) * k * (1 + k / WIDTH_UNITS) for loc, k in at.items())
