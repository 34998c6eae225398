"""What the Spark process knows of a dataflow: its graph (from the hot path's desired state),
the connection of the hot-path process that hosts it, and, with ``--engine spark``, the engine
running its micro-batches.

>>> from tracker.graph import Graph, Node
>>> known = Known("d1", Graph.build(1, [Node(0, 0, 1)], []), None)
>>> known.engine is None, known.nested is None, known.size
(True, True, 1)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.channel.link import Peer
from api.schema.registration import build_graph, build_nested, is_nested
from api.schema.spec import Spec
from tracker.graph import Graph
from tracker.scope import NestedGraph


@dataclass(eq=False)
class Known:
    """One dataflow the Spark process was told of (a :class:`~api.channel.messages.Know`)."""

    id: str
    graph: Graph
    """Its graph; for a dataflow with nested scopes, the root scope's (scope nodes carrying
    their summaries as connections)."""
    peer: Peer | None
    """The hot-path process's connection: where this dataflow's results go."""
    engine: Any = None
    """``spark_jobs.incremental.SparkFrontierEngine``, made on the spark thread at the first
    micro-batch (or a reset)."""
    nested: NestedGraph | None = None
    """Every scope of a dataflow with nested scopes; ``None`` for a flat one."""

    @classmethod
    def of(cls, dataflow_id: str, spec: Spec, peer: Peer | None) -> Known:
        """The dataflow ``spec`` registers (already accepted by the hot path: not checked
        again for the summary-antichain limit)."""
        if is_nested(spec):
            nested, _ = build_nested(spec, new=False)
            return cls(dataflow_id, nested.root.graph, peer, nested=nested)
        graph, _ = build_graph(spec, new=False)
        return cls(dataflow_id, graph, peer)

    @property
    def size(self) -> int:
        """Its locations, over every scope."""
        if self.nested is None:
            return len(self.graph.locations())
        return sum(len(scope.graph.locations()) for scope in self.nested.scopes.values())
