"""What a service needs from a frontier engine: apply atomic batches, read exact frontiers.

:class:`FrontierEngine` is a structural :class:`~typing.Protocol`: anything with these members
is one, without inheriting from it. The reference :class:`tracker.reachability.Tracker`
satisfies it, and a compiled engine with the same interface (``tracker.compiled.CompiledTracker``)
and the service's Spark-backed engine are to satisfy it too. The semantics are
those of progress tracking in timely dataflow (Naiad, SOSP 2013; Abadi and Isard, "Timely
Dataflow: A Model", FORTE 2015): occurrence counts per pointstamp ``(location, time)``, and for
every location the antichain of minimal times that may still appear there.

Guarantees every engine gives:

* :meth:`~FrontierEngine.apply` is atomic: a batch that fails validation raises
  :class:`~tracker.graph.GraphError` and changes nothing;
* the returned changes are exactly the difference between the frontiers before and after the
  batch, consolidated (no time both enters and leaves one location);
* :meth:`~FrontierEngine.frontiers` covers every location of :attr:`~FrontierEngine.graph`.

>>> from tracker.graph import Edge, Graph, Location, Node
>>> from tracker.reachability import Tracker
>>> graph = Graph.build(1, [Node(0, 0, 1), Node(1, 1, 0)], [Edge(Location.source(0, 0), Location.target(1, 0))])
>>> engine: FrontierEngine = Tracker(graph)
>>> engine.apply([(Location.source(0, 0), (3,), 1)])
[FrontierChange(location=Location(node=0, port=0, kind='source'), time=(3,), diff=1), \
FrontierChange(location=Location(node=1, port=0, kind='target'), time=(3,), diff=1)]
>>> engine.frontier(Location.target(1, 0)), engine.can_notify(Location.target(1, 0), (2,))
([(3,)], True)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from tracker.graph import Graph, Location, Update
from tracker.reachability import FrontierChange
from tracker.scope import NestedGraph, ScopedChange, ScopedLocation
from tracker.timestamp import Timestamp


class FrontierEngine(Protocol):
    """Occurrence counts and frontiers of one dataflow graph, maintained batch by batch."""

    @property
    def graph(self) -> Graph:
        """The dataflow graph whose locations this engine tracks."""
        ...

    def apply(self, updates: Iterable[Update], *, validated: bool = False) -> list[FrontierChange]:
        """Apply one atomic batch of ``(location, time, delta)`` updates.

        Args:
            updates: the batch; counts may go transiently negative.
            validated: the caller already checked the batch against :attr:`graph`
                (:meth:`~tracker.graph.Graph.check_updates`), so the engine may skip it.

        Returns:
            The frontier changes the batch causes, consolidated.

        Raises:
            GraphError: an update names an unknown location, has the wrong arity or a bad
                value; nothing was applied.
        """
        ...

    def frontier(self, location: Location) -> list[Timestamp]:
        """The minimal times that may still appear at ``location``, sorted."""
        ...

    def frontiers(self) -> dict[Location, list[Timestamp]]:
        """Every location's frontier (an empty list where nothing can arrive any more)."""
        ...

    def pointstamps(self) -> dict[tuple[Location, Timestamp], int]:
        """Every non-zero occurrence count, keyed by ``(location, time)`` (a fresh dict)."""
        ...

    def can_notify(self, location: Location, time: Timestamp) -> bool:
        """True iff a notification for ``time`` at ``location`` is safe: no frontier element
        there is ``<= time``."""
        ...


class ScopedEngine(Protocol):
    """:class:`FrontierEngine`'s sibling for a dataflow with nested scopes: the same guarantees,
    with every location a :class:`~tracker.scope.ScopedLocation` and every time in its scope's
    arity. :class:`tracker.scoped.ScopedTracker` satisfies it (one flat engine per scope)."""

    @property
    def nested(self) -> NestedGraph:
        """The validated nested dataflow whose locations this engine tracks."""
        ...

    def apply(self, updates: Iterable[tuple[object, object, object]], *, validated: bool = False
              ) -> list[ScopedChange]:
        """Apply one atomic batch of ``(location, time, delta)`` updates (see
        :meth:`FrontierEngine.apply`; :meth:`~tracker.scope.NestedGraph.check_updates` validates)."""
        ...

    def frontier(self, location: ScopedLocation) -> list[Timestamp]:
        """The minimal times that may still appear at ``location``, in its scope's time, sorted."""
        ...

    def frontiers(self) -> dict[ScopedLocation, list[Timestamp]]:
        """Every location's frontier, in every scope."""
        ...

    def pointstamps(self) -> dict[tuple[ScopedLocation, Timestamp], int]:
        """Every non-zero occurrence count reported by workers."""
        ...

    def can_notify(self, location: ScopedLocation, time: Timestamp) -> bool:
        """True iff a notification for ``time`` at ``location`` is safe."""
        ...
