"""Concrete paths across scope boundaries, for explaining a frontier of a nested dataflow.

A path of the *flattened* graph (every port of every scope) moves a time step by step: an edge
keeps it, a real operator's connection adds a summary, **ingress** (a scope node's input to the
boundary's output inside an iterative scope) appends a ``0`` coordinate, **egress** (the
boundary's input to the scope node's output) drops the last one; a region keeps times on both.
Scope nodes' computed summaries are not steps: paths go through the scopes' insides, so every
ingress and egress is listed. :func:`search` visits ``(location, time)`` states from one
pointstamp, skipping a state whose time is ``>=`` one already seen at its location (every step
is monotone), remembering how each state was first reached; by Dickson's lemma it ends on any
graph (as :mod:`tracker.scoped_oracle`'s search, which it follows). :func:`route` reads back
the steps that bring the pointstamp to a location as the earliest time reached there that is
``<=`` a bound.

>>> from tracker.scope import NestedGraph
>>> body = {"nodes": [{"id": 0, "inputs": 0, "outputs": 1},
...     {"id": 1, "inputs": 1, "outputs": 1, "scope": {"kind": "iterative", "nodes": [],
...      "edges": [{"source": {"node": 0, "port": 0}, "target": {"node": 0, "port": 0}}]}}],
...   "edges": [{"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 0}}]}
>>> nested = NestedGraph.from_json(1, body)
>>> arrives, path = route(flattened_steps(nested), ScopedLocation((), 0, 0, "source"), (4,),
...                       ScopedLocation((), 1, 0, "source"), (9,))
>>> arrives, [(step.via, str(step.dst), time) for step, time in path]
((4,), [('edge', '[](1,0,target)', (4,)), ('ingress', '[1](0,0,source)', (4, 0)), \
('edge', '[1](0,0,target)', (4, 0)), ('egress', '[](1,0,source)', (4,))])
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Mapping
from typing import Literal, NamedTuple

from tracker.scope import BOUNDARY, NestedGraph, ScopedLocation
from tracker.timestamp import Timestamp, less_equal

Via = Literal["edge", "operator", "ingress", "egress"]


class Step(NamedTuple):
    """One move of the flattened graph; ``summary`` is what an edge (zeros) or an operator adds,
    ``()`` for ingress and egress, which change the time's arity instead."""

    src: ScopedLocation
    dst: ScopedLocation
    via: Via
    summary: tuple[int, ...]
    iterative: bool = False
    """Ingress or egress of an iterative scope (a region's keep times as they are)."""

    def move(self, time: Timestamp) -> Timestamp:
        """The time after this step, for a record at ``time`` before it."""
        if self.via == "ingress":
            return (*time, 0) if self.iterative else time
        if self.via == "egress":
            return time[:-1] if self.iterative else time
        return tuple(a + b for a, b in zip(time, self.summary, strict=True))


def flattened_steps(nested: NestedGraph) -> dict[ScopedLocation, list[Step]]:
    """Every one-step move of the flattened graph, by origin."""
    steps: dict[ScopedLocation, list[Step]] = defaultdict(list)
    for path, scope in nested.scopes.items():
        for t in scope.graph.transitions():
            if t.src.kind == "target" and t.src.node in scope.children:
                continue  # a scope node's computed summaries: paths go inside instead
            src, dst = ScopedLocation(path, *t.src), ScopedLocation(path, *t.dst)
            steps[src].append(Step(src, dst, "edge" if t.src.kind == "source" else "operator", tuple(t.summary)))
        for child in scope.children:
            inner = nested.scopes[(*path, child)]
            loop = inner.kind == "iterative"
            node = next(n for n in scope.graph.nodes if n.id == child)
            for p in range(node.inputs):
                src, dst = ScopedLocation(path, child, p, "target"), ScopedLocation(inner.path, BOUNDARY, p, "source")
                steps[src].append(Step(src, dst, "ingress", (), loop))
            for q in range(node.outputs):
                src, dst = ScopedLocation(inner.path, BOUNDARY, q, "target"), ScopedLocation(path, child, q, "source")
                steps[src].append(Step(src, dst, "egress", (), loop))
    return steps


Parents = dict[tuple[ScopedLocation, Timestamp], tuple[Step, Timestamp] | None]


def search(steps: Mapping[ScopedLocation, list[Step]], origin: ScopedLocation, time: Timestamp
           ) -> tuple[dict[ScopedLocation, list[Timestamp]], Parents]:
    """Every ``(location, time)`` state ``(origin, time)`` reaches (undominated when visited),
    and for each how it was first reached: ``(step, time before it)``, ``None`` at the origin."""
    seen: dict[ScopedLocation, list[Timestamp]] = defaultdict(list)
    parent: Parents = {(origin, time): None}
    queue: deque[tuple[ScopedLocation, Timestamp]] = deque([(origin, time)])
    while queue:
        here, t = queue.popleft()
        if any(less_equal(old, t) for old in seen[here]):
            continue
        seen[here].append(t)
        for step in steps.get(here, ()):
            moved = step.move(t)
            if (step.dst, moved) not in parent:
                parent[(step.dst, moved)] = (step, t)
            queue.append((step.dst, moved))
    return dict(seen), parent


Searched = dict[tuple[ScopedLocation, Timestamp], tuple[dict[ScopedLocation, list[Timestamp]], Parents]]
""":func:`search` results by ``(origin, time)``, kept by a caller routing to several locations."""


def route(steps: Mapping[ScopedLocation, list[Step]], origin: ScopedLocation, time: Timestamp,
          location: ScopedLocation, bound: Timestamp, searched: Searched | None = None
          ) -> tuple[Timestamp, list[tuple[Step, Timestamp]]] | None:
    """The earliest time (in ``location``'s scope) at which ``(origin, time)`` can reach
    ``location`` that is ``<= bound``, and the steps of one such path with the time after each;
    ``None`` if it cannot reach ``location`` at a time ``<= bound``. ``searched``: earlier
    calls' searches, reused (and this one's kept there)."""
    found = None if searched is None else searched.get((origin, time))
    if found is None:
        found = search(steps, origin, time)
        if searched is not None:
            searched[(origin, time)] = found
    seen, parent = found
    candidates = sorted(t for t in seen.get(location, ()) if less_equal(t, bound))
    if not candidates:
        return None
    arrives = candidates[0]
    path: list[tuple[Step, Timestamp]] = []
    here, t = location, arrives
    while (entry := parent.get((here, t))) is not None:
        step, before = entry
        path.append((step, t))
        here, t = step.src, before
    path.reverse()
    return arrives, path
