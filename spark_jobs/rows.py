"""How the core's objects become rows of the Delta tables.

Each function gives the rows of one dataflow for one table, as dicts that
:func:`spark_jobs.tables.to_arrow` converts; writers concatenate the rows of many dataflows to
replace all their partitions in one commit. A location is a :class:`~tracker.graph.Location`
(the root scope) or a :class:`~tracker.scope.ScopedLocation` (any scope): either way it becomes
the columns ``scope, node, port, kind``.

>>> from tracker.graph import Location
>>> frontier_rows("d", {Location.target(1, 0): [(3,)]})
[{'dataflow_id': 'd', 'scope': [], 'node': 1, 'port': 0, 'kind': 'target', 'time': [3]}]
>>> frontier_rows("d", {ScopedLocation((2,), 1, 0, "target"): [(3, 0)]})[0]["scope"]
[2]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, TypeAlias, TypeVar

from tracker.antichain import Antichain
from tracker.graph import Graph, Location
from tracker.scope import NestedGraph, ScopedLocation, ScopePath
from tracker.timestamp import Timestamp

Row = dict[str, Any]
AnyLocation: TypeAlias = Location | ScopedLocation
"""A location of the root (``Location``) or of any scope (``ScopedLocation``)."""
Loc = TypeVar("Loc", Location, ScopedLocation)


def location_columns(location: AnyLocation) -> Row:
    """``scope, node, port, kind`` of a location (``scope`` ``[]`` for a root ``Location``)."""
    if isinstance(location, ScopedLocation):
        return {"scope": list(location.scope), "node": location.node, "port": location.port, "kind": location.kind}
    return {"scope": [], "node": location.node, "port": location.port, "kind": location.kind}


def read_location(row: Mapping[str, Any], scoped: bool, prefix: str = "") -> AnyLocation:
    """The location of a row's ``scope, node, port, kind`` columns (names prefixed): a
    ``ScopedLocation`` if ``scoped``, else a root ``Location`` (``ValueError`` for a row of a
    nested scope, which a ``Location`` cannot name)."""
    scope = tuple(row.get("scope") or ())
    node, port, kind = row[prefix + "node"], row[prefix + "port"], row[prefix + "kind"]
    if scoped:
        return ScopedLocation(scope, node, port, kind)
    if scope:
        raise ValueError(f"a row of scope {list(scope)}: read this dataflow with scoped=True")
    return Location(node, port, kind)


def _scopes_of(graph: Graph | NestedGraph) -> list[tuple[ScopePath, str, Graph, frozenset[int]]]:
    if isinstance(graph, Graph):
        return [((), "root", graph, frozenset())]
    return [(path, scope.kind, scope.graph, scope.children)
            for path, scope in sorted(graph.scopes.items(), key=lambda item: (len(item[0]), item[0]))]


def graph_rows(dataflow_id: str, graph: Graph | NestedGraph) -> dict[str, list[Row]]:
    """The ``scopes``, ``nodes``, ``connections`` (implicit zero ones spelled out, one row per
    summary) and ``edges`` rows of a graph, by table name. A nested dataflow's scopes each give
    their own rows: a nested scope's boundary is its node ``0`` (named ``boundary``), and a scope
    node has ``is_scope`` true and no connections (its summaries are computed from its inside)."""
    tables: dict[str, list[Row]] = {"scopes": [], "nodes": [], "connections": [], "edges": []}
    for path, kind, flat, children in _scopes_of(graph):
        scope = list(path)
        tables["scopes"].append({"dataflow_id": dataflow_id, "scope": scope, "kind": kind, "arity": flat.arity})
        for node in flat.nodes:
            is_scope = node.id in children
            tables["nodes"].append({"dataflow_id": dataflow_id, "scope": scope, "node": node.id, "name": node.name,
                                    "inputs": node.inputs, "outputs": node.outputs, "is_scope": is_scope})
            if is_scope:
                continue
            for conn in flat.connections(node):
                for summary in conn.summaries:
                    tables["connections"].append({"dataflow_id": dataflow_id, "scope": scope, "node": node.id,
                                                  "input_port": conn.input, "output_port": conn.output,
                                                  "summary": list(summary)})
        for edge in flat.edges:
            tables["edges"].append({"dataflow_id": dataflow_id, "scope": scope, "src_node": edge.source.node,
                                    "src_port": edge.source.port, "dst_node": edge.target.node,
                                    "dst_port": edge.target.port})
    return tables


def dataflow_row(dataflow_id: str, name: str, graph: Graph | NestedGraph, graph_version: int,
                 created_at: datetime, deleted_at: datetime | None = None) -> Row:
    """The one ``dataflows`` row of a dataflow (``deleted_at``: null while it is not deleted)."""
    arity = graph.arity if isinstance(graph, Graph) else graph.root.arity
    return {"dataflow_id": dataflow_id, "name": name, "timestamp_arity": arity, "graph_version": graph_version,
            "created_at": created_at, "deleted_at": deleted_at}


Psi: TypeAlias = Mapping[tuple[Location, Location], Antichain]


def pointstamp_rows(dataflow_id: str, counts: Mapping[tuple[Loc, Timestamp], int]) -> list[Row]:
    """``pointstamps``: the non-zero occurrence counts."""
    return [
        {"dataflow_id": dataflow_id, **location_columns(loc), "time": list(t), "count": c}
        for (loc, t), c in counts.items()
        if c != 0
    ]


Columns: TypeAlias = dict[str, list[Any]]
"""A table's rows as one list per column (what ``pyarrow.table`` takes)."""


Birth: TypeAlias = tuple[float, "str | None"]
"""When a live pointstamp was first seen (POSIX seconds) and the worker that last reported it."""


def _micros(at: float | None) -> int | None:
    return None if at is None else round(at * 1_000_000)


def pointstamp_columns(counts: Mapping[str, Mapping[tuple[Loc, Timestamp], int]],
                       births: Mapping[str, Mapping[tuple[Loc, Timestamp], Birth]] | None = None) -> Columns:
    """``pointstamps`` of many dataflows (``dataflow_id -> counts``) as columns: the rows of
    :func:`pointstamp_rows`, built about five times faster, which matters on the Delta thread
    (it holds the GIL the event loop needs) when a compaction writes thousands of dataflows.
    ``births`` (by dataflow, then pointstamp) fill ``born_at`` (microseconds) and ``worker``;
    a pointstamp without one has both null.

    >>> at = (Location.target(1, 0), (3,))
    >>> columns = pointstamp_columns({"d": {at: 2, (Location.source(1, 0), (4,)): 0}}, {"d": {at: (1.5, "w")}})
    >>> columns["count"], columns["born_at"], columns["worker"]
    ([2], [1500000], ['w'])
    """
    names = ("dataflow_id", "scope", "node", "port", "kind", "time", "count", "born_at", "worker")
    columns: Columns = {n: [] for n in names}
    ids, scopes, nodes, ports, kinds, times, values, born, workers = columns.values()
    for dataflow_id, by_location in counts.items():
        known = (births or {}).get(dataflow_id, {})
        for key, c in by_location.items():
            if c != 0:
                loc, t = key
                ids.append(dataflow_id)
                scopes.append(list(loc.scope) if isinstance(loc, ScopedLocation) else [])
                nodes.append(loc.node)
                ports.append(loc.port)
                kinds.append(loc.kind)
                times.append(list(t))
                values.append(c)
                birth = known.get(key)
                born.append(None if birth is None else _micros(birth[0]))
                workers.append(None if birth is None else birth[1])
    return columns


def frontier_columns(frontiers: Mapping[str, Mapping[Loc, Iterable[Timestamp]]],
                     since: Mapping[str, Mapping[Loc, float]] | None = None) -> Columns:
    """``frontiers`` of many dataflows (``dataflow_id -> frontiers``) as columns: the rows of
    :func:`frontier_rows` (see :func:`pointstamp_columns` for why); ``since`` (by dataflow, then
    location: when its frontier last changed, POSIX seconds) fills ``since`` (microseconds).

    >>> at = ScopedLocation((2,), 1, 0, "target")
    >>> columns = frontier_columns({"d": {at: [(3, 0), (2, 1)]}}, {"d": {at: 2.0}})
    >>> columns["time"], columns["since"]
    ([[3, 0], [2, 1]], [2000000, 2000000])
    """
    columns: Columns = {n: [] for n in ("dataflow_id", "scope", "node", "port", "kind", "time", "since")}
    ids, scopes, nodes, ports, kinds, times, moved = columns.values()
    for dataflow_id, by_location in frontiers.items():
        known = (since or {}).get(dataflow_id, {})
        for loc, ts in by_location.items():
            scope: list[int] = list(loc.scope) if isinstance(loc, ScopedLocation) else []
            at = _micros(known.get(loc))
            for t in ts:
                ids.append(dataflow_id)
                scopes.append(scope)
                nodes.append(loc.node)
                ports.append(loc.port)
                kinds.append(loc.kind)
                times.append(list(t))
                moved.append(at)
    return columns


def frontier_rows(dataflow_id: str, frontiers: Mapping[Loc, Iterable[Timestamp]]) -> list[Row]:
    """``frontiers``: one row per frontier element of each location."""
    return [
        {"dataflow_id": dataflow_id, **location_columns(loc), "time": list(t)}
        for loc, times in frontiers.items()
        for t in times
    ]
