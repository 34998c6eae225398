"""A brute-force oracle for nested dataflows, straight from the definitions, for tests only.

Could-result-in is evaluated over the *flattened* graph: every port of every scope, with steps
that keep a time (edges), add a summary (a real operator's connection), append a zero
coordinate (ingress: a scope node's input to the boundary's output inside an iterative scope)
or drop the last one (egress: the boundary's input to the scope node's output). Scope nodes'
computed summaries are not used: paths go through the scopes' insides. From each positive
pointstamp a search visits ``(location, time)`` states, skipping a state whose time is ``>=``
one already seen at that location (every step is monotone, so it cannot lead anywhere lower);
the times seen at a location never form an increasing pair, so by Dickson's lemma the search
ends, on any graph. The frontier of a location is the minimal elements of what reached it.

>>> from tracker.scope import NestedGraph
>>> body = {"nodes": [{"id": 0, "inputs": 0, "outputs": 1},
...     {"id": 1, "inputs": 1, "outputs": 1, "scope": {"kind": "iterative", "nodes": [],
...      "edges": [{"source": {"node": 0, "port": 0}, "target": {"node": 0, "port": 0}}]}}],
...   "edges": [{"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 0}}]}
>>> found = frontiers(NestedGraph.from_json(1, body), {(ScopedLocation((), 0, 0, "source"), (4,)): 1})
>>> found[ScopedLocation((1,), 0, 0, "target")], found[ScopedLocation((), 1, 0, "source")]
([(4, 0)], [(4,)])
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

from tracker.antichain import Antichain
from tracker.scope import BOUNDARY, NestedGraph, ScopedLocation
from tracker.timestamp import Timestamp, less_equal

Step = tuple[ScopedLocation, Callable[[Timestamp], Timestamp]]


def flattened_steps(nested: NestedGraph) -> dict[ScopedLocation, list[Step]]:
    """Every one-step move of the flattened graph, as ``(destination, what it does to a time)``."""
    steps: dict[ScopedLocation, list[Step]] = defaultdict(list)
    for path, scope in nested.scopes.items():
        for t in scope.graph.transitions():
            if t.src.kind == "target" and t.src.node in scope.children:
                continue  # a scope node's computed summaries: the flattened paths go inside instead
            steps[ScopedLocation(path, *t.src)].append((ScopedLocation(path, *t.dst), _adding(t.summary)))
        for child in scope.children:
            inner = nested.scopes[(*path, child)]
            node = next(n for n in scope.graph.nodes if n.id == child)
            for p in range(node.inputs):
                steps[ScopedLocation(path, child, p, "target")].append(
                    (ScopedLocation(inner.path, BOUNDARY, p, "source"), inner.ingress))
            for q in range(node.outputs):
                steps[ScopedLocation(inner.path, BOUNDARY, q, "target")].append(
                    (ScopedLocation(path, child, q, "source"), inner.egress))
    return steps


def _adding(summary: tuple[int, ...]) -> Callable[[Timestamp], Timestamp]:
    return lambda time: tuple(a + b for a, b in zip(time, summary, strict=True))


def reach(steps: Mapping[ScopedLocation, list[Step]], origin: ScopedLocation, time: Timestamp
          ) -> dict[ScopedLocation, list[Timestamp]]:
    """The minimal times ``(origin, time)`` could-result-in at every location it reaches."""
    seen: dict[ScopedLocation, list[Timestamp]] = defaultdict(list)
    todo = [(origin, time)]
    while todo:
        here, t = todo.pop()
        if any(less_equal(old, t) for old in seen[here]):
            continue
        seen[here].append(t)
        for dest, move in steps.get(here, ()):
            todo.append((dest, move(t)))
    result = {}
    for loc, times in seen.items():
        antichain: Antichain[Timestamp] = Antichain()
        for t in times:
            antichain.insert(t)
        result[loc] = sorted(antichain.elements())
    return result


def frontiers(nested: NestedGraph, counts: Mapping[tuple[ScopedLocation, Timestamp], int]
              ) -> dict[ScopedLocation, list[Timestamp]]:
    """Every location's frontier, given the occurrence counts (only positive ones count)."""
    steps = flattened_steps(nested)
    found: dict[ScopedLocation, Antichain[Timestamp]] = {loc: Antichain() for loc in nested.locations()}
    for (loc, time), count in counts.items():
        if count > 0:
            for dest, times in reach(steps, loc, time).items():
                for t in times:
                    found[dest].insert(t)
    return {loc: sorted(a.elements()) for loc, a in found.items()}


def scope_summaries(nested: NestedGraph) -> dict[tuple[int, ...], dict[tuple[int, int], list[tuple[int, ...]]]]:
    """Each nested scope's summaries as an operator, by searching the flattened graph from the
    zero time at each scope input (paths transform times additively, so the minimal times
    reached at an output are the minimal summaries)."""
    every = flattened_steps(nested)
    result: dict[tuple[int, ...], dict[tuple[int, int], list[tuple[int, ...]]]] = {}
    for path in nested.scopes:
        if not path:
            continue
        # A scope's summary is about paths inside it: leaving it (and coming back) is not one.
        steps = {src: [(dst, move) for dst, move in moves if dst.scope[:len(path)] == path]
                 for src, moves in every.items() if src.scope[:len(path)] == path}
        parent = nested.scopes[path[:-1]]
        node = next(n for n in parent.graph.nodes if n.id == path[-1])
        zero = (0,) * parent.arity
        found: dict[tuple[int, int], list[tuple[int, ...]]] = {}
        for p in range(node.inputs):
            start = ScopedLocation(path, BOUNDARY, p, "source")
            reached = reach(steps, start, nested.scopes[path].ingress(zero))
            for q in range(node.outputs):
                exit_ = ScopedLocation(path, BOUNDARY, q, "target")
                if exit_ in reached:
                    outer: Antichain[Timestamp] = Antichain()
                    for t in reached[exit_]:
                        outer.insert(nested.scopes[path].egress(t))
                    found[(p, q)] = sorted(outer.elements())
        result[path] = found
    return result


def accumulate(batches: Iterable[Iterable[tuple[ScopedLocation, Timestamp, int]]]
               ) -> dict[tuple[ScopedLocation, Timestamp], int]:
    """The occurrence counts after applying every batch."""
    counts: dict[tuple[ScopedLocation, Timestamp], int] = defaultdict(int)
    for batch in batches:
        for loc, time, delta in batch:
            counts[(loc, time)] += delta
    return {key: c for key, c in counts.items() if c}
