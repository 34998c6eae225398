"""What the Spark process knows of a dataflow: its graph (from the hot path's desired state),
the connection of the hot-path process that hosts it, and, with ``--engine spark``, the engine
running its micro-batches.

>>> from tracker.graph import Graph, Node
>>> Known("d1", Graph.build(1, [Node(0, 0, 1)], []), None).engine is None
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.channel.link import Peer
from tracker.graph import Graph


@dataclass(eq=False)
class Known:
    """One dataflow the Spark process was told of (a :class:`~api.channel.messages.Know`)."""

    id: str
    graph: Graph
    peer: Peer | None
    """The hot-path process's connection: where this dataflow's results go."""
    engine: Any = None
    """``spark_jobs.incremental.SparkFrontierEngine``, made on the spark thread at the first
    micro-batch (or a reset)."""
