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

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from api.schema.parsing import Indexed
from tracker.graph import Location, Update

LANE_UNITS = 50_000.0
"""A batch estimated over this many units propagates in its dataflow's lane, whatever came before."""
WIDTH_UNITS = 64.0
"""``k`` updates at one location cost ``k * (1 + k / WIDTH_UNITS)`` times its reach."""


def reach_bounds(locations: Sequence[Location], steps: Iterable[tuple[Location, Location]]) -> dict[Location, int]:
    """For each location, an upper bound of the locations reachable from it (itself included):
    the strongly connected components of the steps (Tarjan's, without recursion), then, from
    the sinks back, each component's size plus its successors' bounds, at most every location.
    Linear in the graph.
    """
    index = {loc: i for i, loc in enumerate(locations)}
    successors: list[list[int]] = [[] for _ in locations]
    for src, dst in steps:
        successors[index[src]].append(index[dst])
    n = len(locations)
    order, low, on_stack, stack, component = [-1] * n, [0] * n, [False] * n, [], [-1] * n
    components: list[list[int]] = []
    counter = 0
    for root in range(n):
        if order[root] >= 0:
            continue
        work = [(root, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                order[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack[node] = True
            if child < len(successors[node]):
                work.append((node, child + 1))
                nxt = successors[node][child]
                if order[nxt] < 0:
                    work.append((nxt, 0))
                elif on_stack[nxt]:
                    low[node] = min(low[node], order[nxt])
                continue
            if low[node] == order[node]:
                members = []
                while True:
                    top = stack.pop()
                    on_stack[top] = False
                    component[top] = len(components)
                    members.append(top)
                    if top == node:
                        break
                components.append(members)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    # Tarjan's components come out sinks first: each one's successors are already bounded.
    bound = [0] * len(components)
    for c, members in enumerate(components):
        reached = {component[s] for m in members for s in successors[m]} - {c}
        bound[c] = min(n, len(members) + sum(bound[d] for d in reached))
    return {loc: bound[component[i]] for loc, i in index.items()}


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
