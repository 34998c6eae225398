"""How the core's objects become rows of the Delta tables.

Each function gives the rows of one dataflow for one table, as dicts that
:func:`spark_jobs.tables.to_arrow` converts; writers concatenate the rows of many dataflows to
replace all their partitions in one commit.

>>> from tracker.graph import Location
>>> frontier_rows("d", {Location.target(1, 0): [(3,)]})
[{'dataflow_id': 'd', 'node': 1, 'port': 0, 'kind': 'target', 'time': [3]}]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from tracker.antichain import Antichain
from tracker.graph import Graph, Location
from tracker.timestamp import Timestamp

Row = dict[str, Any]


def graph_rows(dataflow_id: str, graph: Graph) -> dict[str, list[Row]]:
    """The ``nodes``, ``connections`` (implicit zero ones spelled out, one row per summary) and
    ``edges`` rows of a graph, by table name."""
    nodes, connections, edges = [], [], []
    for node in graph.nodes:
        nodes.append({"dataflow_id": dataflow_id, "node": node.id, "name": node.name, "inputs": node.inputs,
                      "outputs": node.outputs})
        for conn in graph.connections(node):
            for summary in conn.summaries:
                connections.append({"dataflow_id": dataflow_id, "node": node.id, "input_port": conn.input,
                                    "output_port": conn.output, "summary": list(summary)})
    for edge in graph.edges:
        edges.append({"dataflow_id": dataflow_id, "src_node": edge.source.node, "src_port": edge.source.port,
                      "dst_node": edge.target.node, "dst_port": edge.target.port})
    return {"nodes": nodes, "connections": connections, "edges": edges}


def dataflow_row(dataflow_id: str, name: str, graph: Graph, graph_version: int, created_at: datetime,
                 deleted_at: datetime | None = None) -> Row:
    """The one ``dataflows`` row of a dataflow (``deleted_at``: null while it is not deleted)."""
    return {"dataflow_id": dataflow_id, "name": name, "timestamp_arity": graph.arity, "graph_version": graph_version,
            "created_at": created_at, "deleted_at": deleted_at}


def summary_rows(dataflow_id: str, psi: Mapping[tuple[Location, Location], Antichain]) -> list[Row]:
    """``summaries``: one row per minimal summary of each pair of ``Psi``."""
    return [
        {"dataflow_id": dataflow_id, "from_node": a.node, "from_port": a.port, "from_kind": a.kind,
         "to_node": b.node, "to_port": b.port, "to_kind": b.kind, "summary": list(s)}
        for (a, b), chain in psi.items()
        for s in chain
    ]


def pointstamp_rows(dataflow_id: str, counts: Mapping[tuple[Location, Timestamp], int]) -> list[Row]:
    """``pointstamps``: the non-zero occurrence counts."""
    return [
        {"dataflow_id": dataflow_id, "node": loc.node, "port": loc.port, "kind": loc.kind, "time": list(t), "count": c}
        for (loc, t), c in counts.items()
        if c != 0
    ]


def frontier_rows(dataflow_id: str, frontiers: Mapping[Location, Iterable[Timestamp]]) -> list[Row]:
    """``frontiers``: one row per frontier element of each location."""
    return [
        {"dataflow_id": dataflow_id, "node": loc.node, "port": loc.port, "kind": loc.kind, "time": list(t)}
        for loc, times in frontiers.items()
        for t in times
    ]
