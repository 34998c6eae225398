"""What the hot path keeps of one dataflow's Spark work, and what it reads of the dataflow.

>>> state = SparkState()
>>> state.check, state.audit
('pending', None)
>>> from tracker.graph import Graph, Node
>>> too_large(Graph.build(1, [Node(0, 1, 1)], []), 1)
'too large: 2 locations, over the limit of 1 (TRACKER_SPARK_MAX_LOCATIONS); not sent to Spark'
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from api.live.scopes import Hosting
from api.live.state import Counts, LiveState
from api.schema.spec import Spec
from api.streams.publish import Publication
from tracker.graph import Graph, Update


@dataclass(eq=False)
class SparkState:
    """What Spark concluded of one dataflow: its registration check and its last audit; with
    ``--engine spark``, the durable batches whose changes Spark has not answered yet."""

    check: str = "pending"
    """pending | running | agreed | disagreed | skipped | timed_out | error"""
    detail: str | None = None
    audit: dict[str, Any] | None = None
    queue: list[tuple[int, list[Update]]] = field(default_factory=list)
    audited: bool = True
    """False for a dataflow Spark does not audit: a graph over the size limit, or one whose
    audit ran over the time limit."""


class Hosted(Protocol):
    """What the background work reads of a dataflow."""

    @property
    def id(self) -> str: ...
    @property
    def graph(self) -> Graph: ...
    @property
    def registration(self) -> Spec: ...
    @property
    def ready(self) -> bool: ...
    @property
    def spark(self) -> SparkState: ...
    @property
    def publication(self) -> Publication: ...
    @property
    def live(self) -> LiveState: ...
    @property
    def engine_mode(self) -> str: ...
    @property
    def deleted_at(self) -> float | None: ...
    @property
    def hosting(self) -> Hosting | None:
        """A dataflow with nested scopes: its scopes and its locations' stand-ins."""
        ...

    def counts(self) -> Counts:
        """Occurrence counts as of the published frontier's version."""
        ...


def too_large(graph: Graph | Hosting, max_locations: int) -> str | None:
    """Why ``graph`` (a nested dataflow's: every scope's locations) is not sent to Spark (over
    ``max_locations``; 0: no limit), or ``None``."""
    size = len(graph.locations()) if isinstance(graph, Graph) else len(graph.locations)
    if max_locations and size > max_locations:
        return (f"too large: {size} locations, over the limit of {max_locations} "
                "(TRACKER_SPARK_MAX_LOCATIONS); not sent to Spark")
    return None
