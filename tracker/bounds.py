"""A cheap, sound bound on the widths of ``Psi``: how many incomparable minimal path summaries
can lead from any location to each location, without computing ``Psi``.

Guarantees: for every pair of locations ``o, d`` with ``d`` reachable from ``o``,
``|Psi[o, d]| <= summary_bound(graph).widths[d]``; the bound costs ``O(arity * E log V)``
whatever the graph's antichains, so it can judge every graph, the largest included.

Why it holds. Pairwise incomparable summaries differ in every coordinate (two summaries equal
in one coordinate of an arity-2 time are comparable; in general, two equal in all coordinates
but one), so an antichain has at most as many elements as there are distinct values of any
``arity - 1`` of its coordinates. A minimal summary follows a path without a cycle (a cycle
only adds a non-negative summary), so its coordinate ``c`` lies between the shortest and the
longest acyclic path from ``o`` to ``d`` in that coordinate, and is a multiple of ``g_c``, the
gcd of the transitions' coordinates ``c``. Both ends are bounded through potentials from the
graph's sources (the locations of strongly connected components nothing enters): ``mu(v)`` the
shortest distance from a source, ``lam_in(v)`` and ``lam_out(v)`` the longest acyclic distance to
entering and to leaving ``v``'s component (inside a component, counted as the sum of its
transitions' coordinates). Then ``shortest(o, d) >= mu(d) - mu(o)`` and
``longest(o, d) <= lam_out(d) - lam_in(o)``, so the spread is at most
``lam_out(d) - mu(d) - min over the ancestors o of d of (lam_in(o) - mu(o))``.

It is exact on a chain of diamonds whose branches carry ``[1, 0]`` and ``[0, 1]`` (``j + 1`` at
the ``j``-th join) and on any graph without two directions; it over-estimates where paths of
different lengths from different sources meet, or where a cycle holds several directions.

>>> from tracker.graph import Connection, Edge, Node
>>> from tracker.timestamp import PathSummary
>>> units = (PathSummary((1, 0)), PathSummary((0, 1)))
>>> g = Graph.build(2, [Node(i, 1, 1, connections=(Connection(0, 0, units),)) for i in range(3)],
...                 [Edge(Location.source(i, 0), Location.target(i + 1, 0)) for i in range(2)])
>>> bound = summary_bound(g)
>>> bound.widest, str(bound.at), bound.entries, bound.cost
(4, '(2,0,source)', 15, 94)
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from typing import NamedTuple

from tracker.graph import Graph, Location, Transition
from tracker.structure import one_direction, strong_components, summary_cost


class SummaryBound(NamedTuple):
    """Upper bounds on ``Psi``'s widths: ``widths[d]`` over every origin, the ``widest`` of
    them (``at`` that location), and what one pointstamp at the worst origin can cost at most:
    ``entries`` frontier entries (the sum of the widths) and ``cost`` in the units of
    :func:`tracker.structure.summary_cost` (the sum of its values)."""

    widths: dict[Location, int]
    widest: int
    at: Location
    entries: int
    cost: int


def summary_bound(graph: Graph) -> SummaryBound:
    """The bound of the module docstring, for every location of ``graph``."""
    locations = graph.locations()
    transitions = graph.transitions()
    if graph.arity == 1 or one_direction(graph) or not locations:
        widths = dict.fromkeys(locations, 1)
    else:
        factors = [_factors(locations, transitions, c) for c in range(graph.arity)]
        widths = {}
        for d in locations:
            per = [f[d] for f in factors]
            widths[d] = max(1, math.prod(per) // max(per))  # drop the coordinate with the most values
    at = max(locations, key=lambda d: widths[d]) if locations else Location.source(0, 0)
    return SummaryBound(widths, widths.get(at, 1), at, sum(widths.values()),
                        sum(summary_cost(w) for w in widths.values()))


def _factors(locations: list[Location], transitions: tuple[Transition, ...], c: int) -> dict[Location, int]:
    """For each location ``d``: at most how many values coordinate ``c`` takes over the minimal
    summaries from any origin to ``d`` (1 + the spread bound over ``g_c``)."""
    g = 0
    for t in transitions:
        g = math.gcd(g, t.summary[c])
    if g == 0:  # the coordinate never moves: one value
        return dict.fromkeys(locations, 1)
    component = strong_components(locations, list(transitions))
    inside: dict[int, int] = defaultdict(int)  # a component's longest acyclic path, bounded by its sum
    successors: dict[int, list[tuple[int, int]]] = defaultdict(list)
    indegree: dict[int, int] = dict.fromkeys(set(component.values()), 0)
    for t in transitions:
        a, b = component[t.src], component[t.dst]
        if a == b:
            inside[a] += t.summary[c]
        else:
            successors[a].append((b, t.summary[c]))
            indegree[b] += 1
    order = [k for k, n in indegree.items() if n == 0]
    sources = set(order)
    lam_in = dict.fromkeys(indegree, 0)
    for k in order:  # Kahn's order over the components, grown while it is read
        for b, step in successors[k]:
            lam_in[b] = max(lam_in[b], lam_in[k] + inside[k] + step)
            indegree[b] -= 1
            if indegree[b] == 0:
                order.append(b)
    mu = _shortest([v for v in locations if component[v] in sources], transitions, c)
    lowest: dict[int, float] = {k: math.inf for k in lam_in}  # min of lam_in - mu over ancestors
    for v in locations:
        lowest[component[v]] = min(lowest[component[v]], lam_in[component[v]] - mu[v])
    for k in order:
        for b, _ in successors[k]:
            lowest[b] = min(lowest[b], lowest[k])
    return {d: 1 + int(lam_in[component[d]] + inside[component[d]] - mu[d] - lowest[component[d]]) // g
            for d in locations}


def _shortest(sources: list[Location], transitions: tuple[Transition, ...], c: int) -> dict[Location, int]:
    """Dijkstra in coordinate ``c`` from every one of ``sources`` at once."""
    outgoing: dict[Location, list[tuple[Location, int]]] = defaultdict(list)
    for t in transitions:
        outgoing[t.src].append((t.dst, t.summary[c]))
    distance = dict.fromkeys(sources, 0)
    heap = [(0, i, v) for i, v in enumerate(sources)]
    pushed = len(heap)
    settled: set[Location] = set()
    while heap:
        here_distance, _, here = heapq.heappop(heap)
        if here in settled:
            continue
        settled.add(here)
        for there, step in outgoing[here]:
            if here_distance + step < distance.get(there, math.inf):
                distance[there] = here_distance + step
                heapq.heappush(heap, (here_distance + step, pushed, there))
                pushed += 1
    return distance
