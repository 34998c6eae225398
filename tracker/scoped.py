"""Exact frontiers of a dataflow with nested scopes: one flat tracker per scope, wired like
timely's subgraphs.

Each scope has a flat incremental tracker over its own graph, in its own time, in which a
nested scope is an operator carrying its computed summaries. Two flows connect a scope to its
parent, and together they give exactly the frontiers of could-result-in over the flattened
graph (every path decomposes at its last entry into the scope):

* **up** (the scope's *internal capabilities*): the pointstamps inside a scope, moved along the
  minimal inner paths to each scope output and carried out (egress), are kept per output as a
  :class:`~tracker.antichain.MutableAntichain` in the parent's time; its frontier's changes are
  counted in the parent tracker at the scope node's output. Only inner pointstamps count here,
  not what entered from outside, which the parent already sees through the scope's summaries.
* **down** (the scope's *external frontier*): the parent's frontier changes at the scope node's
  inputs, carried in (ingress), are counted at the boundary's outputs of the inner tracker.

A batch is applied in two passes: bottom-up, every scope's updates are projected to its
outputs and join its parent's batch; top-down, each tracker applies its batch once (so its
changes are consolidated) and hands the frontier changes at scope inputs to the child below.
Why not one flattened tracker: ingress and egress change a time's arity, so no single order of
times lets propagation settle a time before the times it leads to; per scope, the flat
algorithm and its engines (the Python reference, the compiled one) are reused unchanged.

>>> from tracker.scope import NestedGraph
>>> loop = {"nodes": [
...     {"id": 0, "inputs": 0, "outputs": 1},
...     {"id": 1, "inputs": 1, "outputs": 1, "scope": {"kind": "iterative",
...         "nodes": [{"id": 1, "inputs": 1, "outputs": 1}],
...         "edges": [{"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 0}},
...                   {"source": {"node": 1, "port": 0}, "target": {"node": 0, "port": 0}}]}},
...     {"id": 2, "inputs": 1, "outputs": 0}],
...   "edges": [{"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 0}},
...             {"source": {"node": 1, "port": 0}, "target": {"node": 2, "port": 0}}]}
>>> tracker = ScopedTracker(NestedGraph.from_json(1, loop))
>>> inside = ScopedLocation((1,), 1, 0, "source")
>>> _ = tracker.apply([(inside, (5, 3), 1)])
>>> tracker.frontier(ScopedLocation((), 2, 0, "target"))
[(5,)]
>>> _ = tracker.apply([(inside, (5, 3), -1)])
>>> tracker.frontier(ScopedLocation((), 2, 0, "target"))
[]
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

from tracker.antichain import MutableAntichain
from tracker.engine import FrontierEngine
from tracker.graph import Graph, Location
from tracker.reachability import FrontierChange, Tracker
from tracker.scope import BOUNDARY, NestedGraph, Scope, ScopedChange, ScopedLocation, ScopedUpdate, ScopePath
from tracker.structure import path_summaries
from tracker.timestamp import PathSummary, Timestamp

FlatTracker = Callable[[Graph], FrontierEngine]
"""Builds the flat tracker of one scope (the Python reference by default; any
:class:`~tracker.engine.FrontierEngine`, e.g. the compiled one)."""

__all__ = ["FlatTracker", "ScopedChange", "ScopedTracker", "flat_changes"]


class _Projection:
    """A nested scope's internal capabilities at its outputs, in the parent's time."""

    def __init__(self, scope: Scope, outputs: int) -> None:
        self._scope = scope
        origins = [loc for loc in scope.graph.locations() if not (loc.node == BOUNDARY and loc.kind == "source")]
        psi = path_summaries(scope.graph, origins)
        self._paths: dict[Location, list[tuple[int, PathSummary]]] = defaultdict(list)
        for q in range(outputs):
            exit_ = Location.target(BOUNDARY, q)
            for origin in origins:
                for summary in psi.get((origin, exit_), ()):
                    self._paths[origin].append((q, summary))
        # Each location's own counts: only its frontier (times with a positive count) is moved
        # out, as the flat tracker does, so that a transiently negative count at one location (a
        # receiver's -1 applied before the sender's +1) cannot cancel a positive one at another.
        self._counts: dict[Location, MutableAntichain[Timestamp]] = defaultdict(MutableAntichain)
        self._outputs = [MutableAntichain[Timestamp]() for _ in range(outputs)]

    def update(self, updates: Iterable[tuple[Location, Timestamp, int]]) -> list[tuple[int, Timestamp, int]]:
        """Fold inner count changes in; return the changes of each output's frontier."""
        per_location: dict[Location, list[tuple[Timestamp, int]]] = defaultdict(list)
        for location, time, delta in updates:
            if location in self._paths:
                per_location[location].append((time, delta))
        per_output: dict[int, list[tuple[Timestamp, int]]] = defaultdict(list)
        for location, changes in per_location.items():
            for time, diff in self._counts[location].update_iter(changes):
                for q, summary in self._paths[location]:
                    moved = summary.results_in(time)
                    if moved is not None:
                        per_output[q].append((self._scope.egress(moved), diff))
        return [(q, t, d) for q, changes in sorted(per_output.items())
                for t, d in self._outputs[q].update_iter(changes)]


class ScopedTracker:
    """Occurrence counts and exact, incrementally maintained frontiers of a nested dataflow.

    Args:
        nested: the validated dataflow (:meth:`NestedGraph.build` checked every scope's cycles).
        flat: builds each scope's flat tracker; any engine with the reference's interface.
    """

    def __init__(self, nested: NestedGraph, flat: FlatTracker | None = None) -> None:
        make = flat or (lambda graph: Tracker(graph, cycles_checked=True))
        self.nested = nested
        self._trackers = {path: make(scope.graph) for path, scope in nested.scopes.items()}
        self._projections: dict[ScopePath, _Projection] = {}
        for path, scope in nested.scopes.items():
            if path:
                parent = nested.scopes[path[:-1]]
                node = next(n for n in parent.graph.nodes if n.id == path[-1])
                self._projections[path] = _Projection(scope, node.outputs)
        # Deepest first for the upward pass, root first for the downward one.
        self._bottom_up = sorted(nested.scopes, key=len, reverse=True)
        self._top_down = sorted(nested.scopes, key=len)

    def apply(self, updates: Iterable[tuple[object, object, object]], *, validated: bool = False
              ) -> list[ScopedChange]:
        """Apply one atomic batch and return the frontier changes it causes, consolidated, scope
        by scope (root first), each scope's sorted as the flat tracker sorts them.

        Raises:
            GraphError: a bad update (see :meth:`NestedGraph.check_updates`); nothing changes.
        """
        batch: list[ScopedUpdate] = (list(updates) if validated  # type: ignore[arg-type]
                                     else self.nested.check_updates(list(updates)))
        per_scope: dict[ScopePath, list[tuple[Location, Timestamp, int]]] = defaultdict(list)
        for location, time, delta in batch:
            per_scope[location.scope].append((location.local, time, delta))
        for path in self._bottom_up:
            if path and per_scope.get(path):
                for q, time, diff in self._projections[path].update(per_scope[path]):
                    per_scope[path[:-1]].append((Location.source(path[-1], q), time, diff))
        changes: list[ScopedChange] = []
        for path in self._top_down:
            local = per_scope.get(path)
            if not local:
                continue
            scope = self.nested.scopes[path]
            for change in self._trackers[path].apply(local, validated=True):
                changes.append(ScopedChange(ScopedLocation(path, *change.location), change.time, change.diff))
                loc = change.location
                if loc.kind == "target" and loc.node in scope.children:
                    child = (*path, loc.node)
                    entered = self.nested.scopes[child].ingress(change.time)
                    per_scope[child].append((Location.source(BOUNDARY, loc.port), entered, change.diff))
        return changes

    def frontier(self, location: ScopedLocation) -> list[Timestamp]:
        """The minimal times that may still appear at ``location``, in its scope's time, sorted."""
        return self._trackers[location.scope].frontier(location.local)

    def frontiers(self) -> dict[ScopedLocation, list[Timestamp]]:
        """Every location's frontier (empty where nothing can arrive any more)."""
        return {ScopedLocation(path, *loc): times for path, tracker in self._trackers.items()
                for loc, times in tracker.frontiers().items()}

    def pointstamps(self) -> dict[tuple[ScopedLocation, Timestamp], int]:
        """Every non-zero occurrence count reported by workers (not the scopes' bookkeeping)."""
        found = {}
        for path, tracker in self._trackers.items():
            for (loc, time), count in tracker.pointstamps().items():
                scoped = ScopedLocation(path, *loc)
                if self.nested.holds_pointstamps(scoped):
                    found[(scoped, time)] = count
        return found

    def can_notify(self, location: ScopedLocation, time: Timestamp) -> bool:
        """True iff a notification for ``time`` at ``location`` is safe."""
        return self._trackers[location.scope].can_notify(location.local, time)


def flat_changes(changes: Iterable[FrontierChange], path: ScopePath = ()) -> list[ScopedChange]:
    """Flat tracker changes as changes of scope ``path``.

    >>> flat_changes([FrontierChange(Location.target(1, 0), (3,), 1)])
    [ScopedChange(location=ScopedLocation(scope=(), node=1, port=0, kind='target'), time=(3,), diff=1)]
    """
    return [ScopedChange(ScopedLocation(path, *c.location), c.time, c.diff) for c in changes]
