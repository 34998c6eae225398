"""Structure of a dataflow graph: non-incrementing cycles and minimal path summaries ``Psi``.

:func:`find_cycles` answers the cycle check of ``docs/core.md`` (does some cycle fail to
advance timestamps, and along which transitions?); :func:`path_summaries` computes Naiad's
``Psi[l1, l2]``, the antichain of minimal summaries over all paths from ``l1`` to ``l2``;
:func:`widest_summaries` refuses graphs whose antichains would be too costly to track.

Guarantees: :func:`find_cycles` is empty iff every cycle strictly advances some coordinate, and
otherwise names exactly the transitions on non-advancing cycles; ``Psi`` holds exactly the
minimal summaries (the same as the brute-force :mod:`tracker.oracle`).

>>> from tracker.graph import Connection, Edge, Node
>>> ring = [Edge(Location.source(0, 0), Location.target(1, 0)), Edge(Location.source(1, 0), Location.target(0, 0))]
>>> [str(t) for t in find_cycles(Graph.build(1, [Node(0, 1, 1), Node(1, 1, 1)], ring))][:1]
['(0,0,source) -> (1,0,target) +[0]']
>>> plus_one = (Connection(0, 0, (PathSummary((1,)),)),)
>>> loop = Graph.build(1, [Node(0, 1, 1), Node(1, 1, 1, connections=plus_one)], ring)
>>> find_cycles(loop), path_summaries(loop)[(Location.target(1, 0), Location.target(1, 0))]
([], Antichain([(0,)]))
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from tracker.antichain import Antichain
from tracker.graph import Graph, Location, Transition
from tracker.timestamp import PathSummary

Summaries = dict[tuple[Location, Location], Antichain[PathSummary]]
"""``Psi``: for each connected pair ``(from, to)``, the minimal path summaries."""


def find_cycles(graph: Graph) -> list[Transition]:
    """Every transition lying on a cycle made only of edges and zero-summary connections.

    A graph is acceptable iff this is empty. The answer is exact: a zero-summary transition
    ``a -> b`` is returned iff ``b`` leads back to ``a`` through zero-summary transitions (both
    ends in one strongly connected component of the zero-summary subgraph), so transitions that
    merely lead into or out of a cycle are not blamed. Sorted, for stable messages.

    >>> from tracker.graph import Edge, Node
    >>> g = Graph.build(1, [Node(0, 1, 1)], [Edge(Location.source(0, 0), Location.target(0, 0))])
    >>> [str(t) for t in find_cycles(g)]
    ['(0,0,source) -> (0,0,target) +[0]', '(0,0,target) -> (0,0,source) +[0]']
    """
    zero = [t for t in graph.transitions() if t.summary.is_zero()]
    component = strong_components(graph.locations(), zero)
    return sorted({t for t in zero if component[t.src] == component[t.dst]}, key=_transition_key)


def path_summaries(graph: Graph, origins: Iterable[Location] | None = None) -> Summaries:
    """``Psi`` for every pair ``(l1, l2)`` such that ``l2`` is reachable from ``l1``.

    ``origins`` restricts ``l1`` (one search per origin, so one origin costs linear work while
    the whole of ``Psi`` is quadratic in the number of locations).

    Includes ``(l, l)`` with the zero summary (the empty path), since a time at ``l`` is
    itself a time that may appear at ``l``. Requires a graph without non-incrementing cycles
    (otherwise minimal summaries still exist but the search may revisit locations needlessly).

    >>> from tracker.graph import Edge, Node
    >>> g = Graph.build(1, [Node(0, 1, 1, connections=None)], [])
    >>> psi = path_summaries(g)
    >>> psi[(Location.target(0, 0), Location.source(0, 0))]
    Antichain([(0,)])
    """
    result: Summaries = {}
    for origin, reached in summaries_by_origin(graph, origins):
        for dest, antichain in reached.items():
            result[(origin, dest)] = antichain
    return result


def summaries_by_origin(graph: Graph, origins: Iterable[Location] | None = None
                        ) -> Iterator[tuple[Location, dict[Location, Antichain[PathSummary]]]]:
    """``Psi`` one origin at a time: ``(l1, {l2: Psi[l1, l2]})`` for each origin in turn, so a
    caller can stream the quadratic whole without holding it.

    >>> from tracker.graph import Node
    >>> g = Graph.build(1, [Node(0, 1, 1)], [])
    >>> [(str(o), len(r)) for o, r in summaries_by_origin(g)]
    [('(0,0,target)', 2), ('(0,0,source)', 1)]
    """
    outgoing = _outgoing(graph)
    zero = PathSummary.zero(graph.arity)
    for origin in graph.locations() if origins is None else origins:
        yield origin, _search(origin, outgoing, zero)
    release(outgoing)


def release(*containers: dict[Any, Any] | list[Any]) -> None:
    """Empty each of ``containers`` (dicts or lists) an item at a time. Released at once (one C
    call), the structures of a search over 100,000 locations held the GIL ~30 ms, and a
    50,000-node registration's request ~75 ms; a worker thread emptying them this way lets the
    event loop in between.

    >>> found, nodes = {1: [2], 3: [4]}, [5, 6]
    >>> release(found, nodes); found, nodes
    ({}, [])
    """
    for container in containers:
        take = container.popitem if isinstance(container, dict) else container.pop
        while container:
            take()


class SummaryOverflow(NamedTuple):
    """Why a graph's path summaries are too many to track: from ``origin``, either one
    antichain (at ``dest``) holds more than the allowed ``size``, or the tracking ``cost`` of
    one pointstamp at ``origin`` (see :func:`widest_summaries`) exceeds its budget; or
    (``exhausted``) the search itself ran out of its steps there, nothing found yet."""

    origin: Location
    dest: Location
    size: int
    cost: int = 0
    exhausted: bool = False


SUMMARY_COST_BASE = 50_000
"""The cost budget of :func:`widest_summaries`: about 25 ms of ``Tracker.apply`` for one
pointstamp (0.5 us per unit, measured on chains of two-summary connections)."""


def summary_cost(width: int) -> int:
    """What an antichain of ``width`` path summaries costs a pointstamp's propagation beyond
    the ordinary: ``width ** 3 - 8``, nothing for widths up to 2. Non-decreasing in ``width``,
    so a search can add it up as antichains grow.

    >>> [summary_cost(w) for w in range(5)]
    [0, 0, 0, 19, 56]
    """
    return max(0, width ** 3 - 8)


def widest_summaries(graph: Graph, limit: int, cost_base: int = SUMMARY_COST_BASE,
                     steps: int | None = None) -> SummaryOverflow | None:
    """The first origin whose path summaries are too many to track, or ``None``; with
    ``steps``, the search does at most that much work over all origins (a step per summary
    settled and per comparison with an antichain's elements), and says it ran out
    (``exhausted``) rather than answer without having looked everywhere.

    From an origin ``o``, the tracker's work for one pointstamp change grows with the cube of
    the antichain widths ``w = |Psi[o, d]|`` (``w`` frontier changes at each ``d``, each
    rescanning up to ``w`` counts against ``w`` frontier elements), so this refuses an
    antichain of more than ``limit`` elements and a cost :func:`summary_cost` above
    ``cost_base`` (widths of 1 and 2 cost nothing, so they fit whatever the graph's size).
    Widths multiply combinatorially with several multi-summary connections in a row or diamonds
    of different summaries (arity 2 and more; with arity 1 every antichain has one element).
    The search stops at the first overflow, so such a graph is answered quickly.

    >>> from tracker.graph import Connection, Edge, Node
    >>> units = (PathSummary((1, 0)), PathSummary((0, 1)))
    >>> g = Graph.build(2, [Node(i, 1, 1, connections=(Connection(0, 0, units),)) for i in range(3)],
    ...                 [Edge(Location.source(i, 0), Location.target(i + 1, 0)) for i in range(2)])
    >>> widest_summaries(g, 3).size, widest_summaries(g, 4)
    (4, None)
    >>> widest_summaries(g, 4, cost_base=50)[2:4]  # three antichains of width 3 by then: 3 x 19 > 50
    (3, 57)
    >>> widest_summaries(g, 4, steps=3).exhausted
    True

    The search starts from the :func:`branching_locations` only: from any other origin an
    antichain is at most one element wider than from the branching location its chain leads
    to, so a graph this accepts has antichains of at most ``limit + 1`` elements. When every
    non-zero summary of the graph points the same way (``(0, 1)`` and ``(0, 2)``, say, as in
    loops that count iterations), all path summaries are totally ordered and nothing is searched.
    """
    if graph.arity == 1 or one_direction(graph):
        return None
    outgoing = _outgoing(graph)
    zero = PathSummary.zero(graph.arity)
    left = [steps if steps is not None else math.inf]
    for origin in branching_locations(graph, outgoing):
        overflow = _widest_from(origin, outgoing, zero, limit, cost_base, left)
        if overflow is not None:
            return overflow
    return None


def _widest_from(origin: Location, outgoing: dict[Location, list[Transition]], zero: PathSummary,
                 limit: int, cost_base: int, left: list[float]) -> SummaryOverflow | None:
    """The first antichain from ``origin`` to grow beyond ``limit``, or the cost beyond its
    budget, or ``None``.

    Candidates are settled in order of their coordinate sum (Dijkstra's order), so a summary
    enters an antichain only once nothing smaller can still arrive: anything strictly smaller
    in the product order has a smaller sum and was settled before. Antichains therefore only
    ever hold final elements and the early exit is exact; a first-come order would overflow on
    transient elements that a later, smaller summary evicts.
    """
    settled: dict[Location, Antichain[PathSummary]] = {}
    heap: list[tuple[int, int, Location, PathSummary]] = [(0, 0, origin, zero)]
    pushed = 1  # a tie-breaker, so the heap never compares locations or summaries
    cost = 0
    while heap:
        _, _, here, summary = heapq.heappop(heap)
        antichain = settled.setdefault(here, Antichain())
        left[0] -= 1 + len(antichain)  # an insertion compares with every element
        if left[0] < 0:
            return SummaryOverflow(origin, here, len(antichain), cost, exhausted=True)
        if not antichain.insert(summary):
            continue
        width = len(antichain)
        cost += summary_cost(width) - summary_cost(width - 1)
        if width > limit or cost > cost_base:
            return SummaryOverflow(origin, here, width, cost)
        for step in outgoing[here]:
            combined = summary.followed_by(step.summary)
            if combined is not None:
                heapq.heappush(heap, (sum(combined), pushed, step.dst, combined))
                pushed += 1
    return None


def one_direction(graph: Graph) -> bool:
    """True iff every non-zero transition summary is a multiple of one vector: then every path
    summary is too, and any two of them are comparable (every antichain has one element)."""
    directions = set()
    for step in graph.transitions():
        if not step.summary.is_zero():
            divisor = math.gcd(*step.summary)
            directions.add(tuple(x // divisor for x in step.summary))
            if len(directions) > 1:
                return False
    return True


def branching_locations(graph: Graph, outgoing: dict[Location, list[Transition]] | None = None) -> list[Location]:
    """The locations with two or more outgoing transitions: the only origins
    :func:`widest_summaries` needs to search.

    From any other location ``o`` a single transition (summary ``s``) leads on, so every path
    from ``o`` follows a chain of such locations up to the first branching one ``b`` (or goes
    round a cycle without one). Adding a fixed summary preserves the order, so ``Psi[o, d]`` is
    ``s_chain + Psi[b, d]`` plus at most the chain's own summary: one element more at most.
    A typical graph (chains of operators, few fan-outs) thus has few origins to search.
    """
    outgoing = outgoing if outgoing is not None else _outgoing(graph)
    return [loc for loc in graph.locations() if len(outgoing.get(loc, ())) >= 2]


def _outgoing(graph: Graph) -> dict[Location, list[Transition]]:
    outgoing: dict[Location, list[Transition]] = defaultdict(list)
    for t in graph.transitions():
        outgoing[t.src].append(t)
    return outgoing


def _search(origin: Location, outgoing: dict[Location, list[Transition]], zero: PathSummary
            ) -> dict[Location, Antichain[PathSummary]]:
    """Minimal summaries from ``origin`` to every location it reaches."""
    reached: dict[Location, Antichain[PathSummary]] = {origin: Antichain([zero])}
    # Label-correcting search: a location is re-expanded only with summaries that entered
    # its antichain, and strictly advancing cycles stop entering, so this terminates.
    queue: deque[tuple[Location, PathSummary]] = deque([(origin, zero)])
    while queue:
        here, summary = queue.popleft()
        if summary not in reached[here]:
            continue  # evicted by a better summary found since it was queued
        for step in outgoing[here]:
            combined = summary.followed_by(step.summary)
            if combined is None:
                continue
            if reached.setdefault(step.dst, Antichain()).insert(combined):
                queue.append((step.dst, combined))
    return reached


def strong_components(locations: list[Location], transitions: list[Transition]) -> dict[Location, int]:
    """Each location's strongly connected component (an id shared by its members): Tarjan's
    algorithm, iterative so deep graphs do not hit the recursion limit."""
    successors: dict[Location, list[Location]] = defaultdict(list)
    for t in transitions:
        successors[t.src].append(t.dst)
    index: dict[Location, int] = {}
    low: dict[Location, int] = {}
    component: dict[Location, int] = {}
    stack: list[Location] = []
    on_stack: set[Location] = set()
    counter = 0
    for root in locations:
        if root in index:
            continue
        work: list[tuple[Location, int]] = [(root, 0)]
        while work:
            node, child = work.pop()
            if child == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            children = successors[node]
            if child < len(children):
                work.append((node, child + 1))
                nxt = children[child]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if low[node] == index[node]:
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component[member] = index[node]
                    if member == node:
                        break
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return component


def _transition_key(t: Transition) -> tuple[int, str, int, int, str, int, tuple[int, ...]]:
    return (t.src.node, t.src.kind, t.src.port, t.dst.node, t.dst.kind, t.dst.port, tuple(t.summary))
