"""The frontier engine of ``--engine spark`` on the request path: occurrence counts only.

With the Spark engine, frontiers come from Spark micro-batches (:mod:`api.background.spark`); the
request path still keeps every occurrence count in Python, so that pointstamps, ``explain`` and
the compacted snapshot are exact at the durable version. :class:`CountsOnly` satisfies
:class:`tracker.engine.FrontierEngine` with no frontier of its own.

>>> from tracker.graph import Edge, Graph, Node
>>> graph = Graph.build(1, [Node(0, 0, 1), Node(1, 1, 0)], [Edge(Location.source(0, 0), Location.target(1, 0))])
>>> engine = CountsOnly(graph)
>>> engine.apply([(Location.target(1, 0), (2,), 1)])
[]
>>> engine.pointstamps()
{(Location(node=1, port=0, kind='target'), (2,)): 1}
"""

from __future__ import annotations

from collections.abc import Iterable

from tracker.graph import Graph, Location, Update
from tracker.reachability import FrontierChange
from tracker.timestamp import Timestamp


class CountsOnly:
    """Occurrence counts of one graph; frontier changes come from Spark later."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self._counts: dict[tuple[Location, Timestamp], int] = {}

    def apply(self, updates: Iterable[Update], *, validated: bool = False) -> list[FrontierChange]:
        """Fold a batch into the counts; returns no changes (Spark computes them).

        Raises:
            GraphError: an update does not fit the graph (unless ``validated``).
        """
        batch = list(updates) if validated else self.graph.check_updates(updates)
        counts = self._counts
        for location, time_, delta in batch:
            key = (location, time_)
            value = counts.get(key, 0) + delta
            if value:
                counts[key] = value
            else:
                counts.pop(key, None)
        return []

    def pointstamps(self) -> dict[tuple[Location, Timestamp], int]:
        """Every non-zero count."""
        return dict(self._counts)

    def frontiers(self) -> dict[Location, list[Timestamp]]:
        """Unknown here: every location's frontier is reported empty (Spark publishes them)."""
        return {loc: [] for loc in self.graph.locations()}

    def frontier(self, location: Location) -> list[Timestamp]:
        """Unknown here: reported empty, like :meth:`frontiers`."""
        return []

    def can_notify(self, location: Location, time: Timestamp) -> bool:
        """Not answerable from counts alone.

        Raises:
            NotImplementedError: always; ask the published frontier instead.
        """
        raise NotImplementedError("with --engine spark the frontier is Spark's; read the published frontier")
