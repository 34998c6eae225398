"""A brute-force oracle straight from the definitions, for tests only.

Nothing here is incremental or clever: could-result-in (``docs/core.md``) is evaluated by
enumerating every simple path, so the oracle is exponential and meant for small graphs.
Simple paths suffice: summaries add non-negative increments, so cutting a cycle out of a path
never yields a larger summary, and every minimal summary is that of a simple path. Engines are
checked against it (the exactness invariant); :func:`fixpoint_frontiers` is also the
benchmarks' from-scratch baseline.

>>> from tracker.graph import Edge, Location, Node
>>> g = Graph.build(1, [Node(0, 0, 1), Node(1, 1, 0)], [Edge(Location.source(0, 0), Location.target(1, 0))])
>>> frontiers(g, {(Location.source(0, 0), (3,)): 1})[Location.target(1, 0)]
[(3,)]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator

from tracker.antichain import Antichain
from tracker.graph import Graph, Location, Transition, Update
from tracker.timestamp import PathSummary, Timestamp, less_equal


def simple_paths(graph: Graph, origin: Location) -> Iterator[tuple[Location, list[Transition]]]:
    """Every simple path from ``origin`` (the empty one included): ``(end, transitions)``."""
    outgoing: dict[Location, list[Transition]] = defaultdict(list)
    for t in graph.transitions():
        outgoing[t.src].append(t)

    def walk(here: Location, visited: set[Location], path: list[Transition]
             ) -> Iterator[tuple[Location, list[Transition]]]:
        yield here, list(path)
        for step in outgoing[here]:
            if step.dst not in visited:
                visited.add(step.dst)
                path.append(step)
                yield from walk(step.dst, visited, path)
                path.pop()
                visited.discard(step.dst)

    yield from walk(origin, {origin}, [])


def path_summaries(graph: Graph) -> dict[tuple[Location, Location], Antichain[PathSummary]]:
    """``Psi``: minimal summaries over all simple paths, for every connected pair."""
    result: dict[tuple[Location, Location], Antichain[PathSummary]] = {}
    zero = PathSummary.zero(graph.arity)
    for origin in graph.locations():
        for end, path in simple_paths(graph, origin):
            summary = zero
            for step in path:
                summary = PathSummary(a + b for a, b in zip(summary, step.summary, strict=True))
            result.setdefault((origin, end), Antichain()).insert(summary)
    return result


def cycle_transitions(graph: Graph) -> set[Transition]:
    """Zero-summary transitions ``a -> b`` such that some zero-summary path leads ``b`` back to ``a``."""
    zero_steps = [t for t in graph.transitions() if t.summary.is_zero()]
    successors: dict[Location, set[Location]] = defaultdict(set)
    for t in zero_steps:
        successors[t.src].add(t.dst)

    def reaches(start: Location, goal: Location) -> bool:
        seen, stack = {start}, [start]
        while stack:
            here = stack.pop()
            if here == goal:
                return True
            for nxt in successors[here] - seen:
                seen.add(nxt)
                stack.append(nxt)
        return False

    return {t for t in zero_steps if reaches(t.dst, t.src)}


def accumulate(batches: Iterable[Iterable[Update]]) -> dict[tuple[Location, Timestamp], int]:
    """Occurrence counts after applying every update, zero counts dropped."""
    counts: dict[tuple[Location, Timestamp], int] = defaultdict(int)
    for batch in batches:
        for location, time, delta in batch:
            counts[(location, tuple(time))] += delta
    return {key: count for key, count in counts.items() if count != 0}


def frontiers(
    graph: Graph,
    counts: dict[tuple[Location, Timestamp], int],
    psi: dict[tuple[Location, Location], Antichain[PathSummary]] | None = None,
) -> dict[Location, list[Timestamp]]:
    """Every location's frontier: the minimal ``s(t)`` over positive ``(l, t)`` and ``s`` in ``Psi[l, L]``.

    Pass ``psi`` (from :func:`path_summaries` of this oracle) to avoid recomputing it."""
    psi = path_summaries(graph) if psi is None else psi
    result: dict[Location, list[Timestamp]] = {}
    active = [(loc, time) for (loc, time), count in counts.items() if count > 0]
    for target in graph.locations():
        reached = [
            tuple(a + b for a, b in zip(time, summary, strict=True))
            for loc, time in active
            for summary in psi.get((loc, target), ())
        ]
        result[target] = sorted(t for t in set(reached) if not any(less_equal(o, t) and o != t for o in reached))
    return result


def fixpoint_frontiers(graph: Graph, counts: dict[tuple[Location, Timestamp], int]) -> dict[Location, list[Timestamp]]:
    """Every location's frontier by iterating the upward closure to a fixed point from scratch.

    The frontier of ``docs/core.md`` without any incremental trick: start from the active pointstamps,
    push every time along every transition each round, keep the lower envelope, stop when a
    round changes nothing. Polynomial, so it also serves as the naive baseline of benchmarks.
    """
    reach: dict[Location, Antichain[Timestamp]] = {loc: Antichain() for loc in graph.locations()}
    for (loc, time), count in counts.items():
        if count > 0:
            reach[loc].insert(tuple(time))
    changed = True
    while changed:
        changed = False
        for step in graph.transitions():
            for time in list(reach[step.src]):
                moved = step.summary.results_in(time)
                if moved is not None and reach[step.dst].insert(moved):
                    changed = True
    return {loc: antichain.elements() for loc, antichain in reach.items()}
