"""Nested scopes: dataflows that hold dataflows, each scope a flat graph of its own.

Timely dataflow is hierarchical. A node of a graph may be a *scope*: it holds its own nodes and
edges. Inside a scope, node ``0`` is the boundary and not an operator: its output port ``p`` is
the scope's input ``p``, its input port ``q`` the scope's output ``q``. Two kinds:

* ``iterative``: inner times have one more coordinate than the parent's, the loop counter.
  Entering (ingress) maps ``t`` to ``(t, 0)``; leaving (egress) maps ``(t, c)`` to ``t``.
* ``region``: inner times are the parent's times.

A scope presents itself to its parent as an operator whose summaries are computed from its
inside: the minimal path summaries from each scope input to each scope output, in the parent's
time ("Tracking progress in timely dataflow", its sections on summarizing structure and on
nested dataflows). :meth:`NestedGraph.build` validates every scope, computes those summaries
bottom-up, checks each scope for cycles that do not advance time (scope nodes carrying their
computed summaries), and keeps one flat :class:`~tracker.graph.Graph` per scope, in which a
scope node is an ordinary node with those summaries as its connections.

A location is a :class:`ScopedLocation`: the scope path (the scope-node ids from the root,
``()`` for the root) and a port of that scope's graph.

>>> body = {"nodes": [
...     {"id": 0, "inputs": 0, "outputs": 1},
...     {"id": 1, "inputs": 1, "outputs": 1, "scope": {"kind": "iterative",
...         "nodes": [{"id": 1, "inputs": 2, "outputs": 1},
...                   {"id": 2, "inputs": 1, "outputs": 1,
...                    "connections": [{"input": 0, "output": 0, "summaries": [[0, 1]]}]}],
...         "edges": [{"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 0}},
...                   {"source": {"node": 1, "port": 0}, "target": {"node": 2, "port": 0}},
...                   {"source": {"node": 2, "port": 0}, "target": {"node": 1, "port": 1}},
...                   {"source": {"node": 1, "port": 0}, "target": {"node": 0, "port": 0}}]}},
...     {"id": 2, "inputs": 1, "outputs": 0}],
...   "edges": [{"source": {"node": 0, "port": 0}, "target": {"node": 1, "port": 0}},
...             {"source": {"node": 1, "port": 0}, "target": {"node": 2, "port": 0}}]}
>>> nested = NestedGraph.from_json(1, body)
>>> nested.scopes[(1,)].kind, nested.scopes[(1,)].arity
('iterative', 2)
>>> nested.scope_summaries[(1,)]
{(0, 0): ((0,),)}
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from tracker.antichain import Antichain
from tracker.graph import Connection, Edge, Graph, GraphError, Kind, Location, Node, Transition
from tracker.structure import find_cycles, path_summaries
from tracker.timestamp import PathSummary, Timestamp

ScopePath = tuple[int, ...]
"""The ids of the scope nodes from the root down to a scope; ``()`` is the root."""
ScopeKind = Literal["root", "iterative", "region"]
MAX_DEPTH = 16
"""How deeply scopes may nest (at least 8 is promised)."""
BOUNDARY = 0
"""Inside a scope, the node id of the boundary."""


class ScopedLocation(NamedTuple):
    """A port of one scope's graph: ``scope`` is the path of scope-node ids from the root.

    >>> str(ScopedLocation((3, 1), 2, 0, "target"))
    '[3,1](2,0,target)'
    """

    scope: ScopePath
    node: int
    port: int
    kind: Kind

    @property
    def local(self) -> Location:
        """The location within its own scope's graph."""
        return Location(self.node, self.port, self.kind)

    def __str__(self) -> str:
        return f"[{','.join(map(str, self.scope))}]{self.local}"


ScopedUpdate = tuple[ScopedLocation, Timestamp, int]
"""A change to an occurrence count at a location of some scope: ``(location, time, delta)``."""


class ScopedChange(NamedTuple):
    """A time entering (``diff=+1``) or leaving (``diff=-1``) a location's frontier, in the
    time of the location's scope."""

    location: ScopedLocation
    time: Timestamp
    diff: int


@dataclass(frozen=True)
class Scope:
    """One scope: its kind, the arity of its times, and its graph (with the boundary node ``0``
    for a nested scope, and scope nodes carrying their computed summaries as connections)."""

    path: ScopePath
    kind: ScopeKind
    arity: int
    graph: Graph
    children: frozenset[int]
    """The ids of this scope's nodes that are scopes themselves."""

    def ingress(self, time: Timestamp) -> Timestamp:
        """A parent time entering this scope."""
        return (*time, 0) if self.kind == "iterative" else time

    def egress(self, time: Timestamp) -> Timestamp:
        """A time of this scope leaving it for the parent."""
        return time[:-1] if self.kind == "iterative" else time


@dataclass(frozen=True)
class NestedGraph:
    """A validated dataflow whose nodes may be scopes; one flat graph per scope.

    ``scope_summaries[path]`` maps ``(input, output)`` of a nested scope to its summaries in the
    parent's time (absent: that output cannot be reached from that input).
    """

    scopes: Mapping[ScopePath, Scope]
    scope_summaries: Mapping[ScopePath, Mapping[tuple[int, int], tuple[PathSummary, ...]]]

    @property
    def root(self) -> Scope:
        return self.scopes[()]

    @classmethod
    def from_json(cls, arity: int, body: Mapping[str, Any]) -> NestedGraph:
        """Build from the registration body's ``nodes`` and ``edges`` (scopes nested in nodes).

        Raises:
            GraphError: the first problem, naming its scope path.
        """
        return cls.build(arity, _parse_scope(body, ()))

    @classmethod
    def build(cls, arity: int, root: ScopeSpec) -> NestedGraph:
        """Validate every scope bottom-up and freeze; raise :class:`GraphError` naming the scope.

        Checked: everything :meth:`Graph.build` checks, per scope; node ``0`` of a nested scope
        is the boundary (not listed among its nodes); a scope node has no connections of its own;
        nesting depth at most :data:`MAX_DEPTH`; no cycle made of edges and zero summaries in any
        scope, scope nodes carrying their computed summaries.
        """
        if isinstance(arity, bool) or not isinstance(arity, int) or arity < 1:
            raise GraphError(f"timestamp_arity must be a positive integer, got {arity!r}")
        scopes: dict[ScopePath, Scope] = {}
        summaries: dict[ScopePath, dict[tuple[int, int], tuple[PathSummary, ...]]] = {}
        _build_scope(root, (), "root", arity, None, scopes, summaries)
        return cls(scopes, summaries)

    def locations(self) -> Iterator[ScopedLocation]:
        """Every location of every scope, scope by scope (root first)."""
        for path in sorted(self.scopes, key=lambda p: (len(p), p)):
            for loc in self.scopes[path].graph.locations():
                yield ScopedLocation(path, *loc)

    def arity_of(self, path: ScopePath) -> int:
        """The arity of times in scope ``path``."""
        return self.scopes[path].arity

    def holds_pointstamps(self, location: ScopedLocation) -> bool:
        """False for the boundary of a nested scope and for a scope node's outputs: those
        locations' counts are the service's own bookkeeping, never reported by workers."""
        if location.scope and location.node == BOUNDARY:
            return False
        scope = self.scopes.get(location.scope)
        return not (scope and location.kind == "source" and location.node in scope.children)

    def check_updates(self, updates: Sequence[tuple[object, object, object]]) -> list[ScopedUpdate]:
        """Validate a batch; return it normalised or raise :class:`GraphError` naming the first
        bad update (by index): unknown scope or location, a time of the wrong arity for its
        scope, a location that holds no pointstamps, a non-integer delta."""
        checked: list[ScopedUpdate] = []
        for index, (location, time, delta) in enumerate(updates):
            loc = location if isinstance(location, ScopedLocation) else ScopedLocation(*location)  # type: ignore[misc]
            scope = self.scopes.get(tuple(loc.scope))
            if scope is None:
                raise GraphError(f"update {index}: unknown scope {list(loc.scope)}")
            if not self.holds_pointstamps(loc):
                what = "the boundary (node 0) of a scope" if loc.node == BOUNDARY else "a scope node's output"
                raise GraphError(f"update {index}: {loc} is {what}, which holds no pointstamps")
            try:
                [(local, t, d)] = scope.graph.check_updates([(loc.local, time, delta)])
            except GraphError as error:
                raise GraphError(f"update {index}: scope {list(loc.scope)}: "
                                 f"{str(error).removeprefix('update 0: ')}") from None
            checked.append((ScopedLocation(loc.scope, *local), t, d))
        return checked


@dataclass(frozen=True)
class ScopeSpec:
    """A scope as the user describes it: its kind (``root`` at the top), nodes and edges."""

    kind: ScopeKind
    nodes: tuple[NodeSpec, ...]
    edges: tuple[Edge, ...]


@dataclass(frozen=True)
class NodeSpec:
    """A node as the user describes it: an operator, or a scope when ``scope`` is set."""

    node: Node
    scope: ScopeSpec | None = None


def _build_scope(spec: ScopeSpec, path: ScopePath, kind: ScopeKind, arity: int, boundary: tuple[int, int] | None,
                 scopes: dict[ScopePath, Scope], summaries: dict[ScopePath, dict[tuple[int, int],
                                                                                 tuple[PathSummary, ...]]]) -> None:
    where = f"scope {list(path)}" if path else "root scope"
    if len(path) > MAX_DEPTH:
        raise GraphError(f"{where}: scopes nest at most {MAX_DEPTH} deep")
    nodes: list[Node] = []
    children: set[int] = set()
    if boundary is not None:
        inputs, outputs = boundary  # the scope's inputs are the boundary's outputs
        nodes.append(Node(BOUNDARY, outputs, inputs, "boundary", ()))
    for node_spec in spec.nodes:
        node = node_spec.node
        if boundary is not None and node.id == BOUNDARY:
            raise GraphError(f"{where}: node 0 is the scope's boundary; number the scope's own nodes from 1")
        if node_spec.scope is None:
            nodes.append(node)
            continue
        if node.connections is not None:
            raise GraphError(f"{where}: node {node.id} is a scope and cannot have connections of its own "
                             "(its summaries are computed from its inside)")
        if not isinstance(node.id, int) or isinstance(node.id, bool) or node.id < 0:
            raise GraphError(f"{where}: node ids must be non-negative integers, got {node.id!r}")
        child_path = (*path, node.id)
        child_kind = node_spec.scope.kind
        if child_kind not in ("iterative", "region"):
            raise GraphError(f"scope {list(child_path)}: kind must be 'iterative' or 'region', got {child_kind!r}")
        child_arity = arity + 1 if child_kind == "iterative" else arity
        _build_scope(node_spec.scope, child_path, child_kind, child_arity, (node.inputs, node.outputs),
                     scopes, summaries)
        children.add(node.id)
        connections = tuple(Connection(i, o, s) for (i, o), s in sorted(summaries[child_path].items()))
        nodes.append(Node(node.id, node.inputs, node.outputs, node.name, connections))
    try:
        graph = Graph.build(arity, nodes, spec.edges)
    except GraphError as error:
        raise GraphError(f"{where}: {error}") from None
    cycle = find_cycles(graph)
    if cycle:
        raise NonIncrementingCycle(path, cycle)
    scope = Scope(path, kind, arity, graph, frozenset(children))
    scopes[path] = scope
    if boundary is not None:
        summaries[path] = _boundary_summaries(scope, boundary)


def _boundary_summaries(scope: Scope, boundary: tuple[int, int]) -> dict[tuple[int, int], tuple[PathSummary, ...]]:
    """The scope's summaries as an operator: the minimal inner path summaries from each input to
    each output, carried into the parent's time (an iterative scope drops the loop counter)."""
    inputs, outputs = boundary
    psi = path_summaries(scope.graph, [Location.source(BOUNDARY, p) for p in range(inputs)])
    result: dict[tuple[int, int], tuple[PathSummary, ...]] = {}
    for p in range(inputs):
        for q in range(outputs):
            inner = psi.get((Location.source(BOUNDARY, p), Location.target(BOUNDARY, q)))
            if inner is None:
                continue
            outer: Antichain[PathSummary] = Antichain()
            for summary in inner.elements():
                outer.insert(PathSummary(scope.egress(tuple(summary))))
            result[(p, q)] = tuple(outer.elements())
    return result


class NonIncrementingCycle(GraphError):
    """A cycle of one scope does not advance time; ``transitions`` name it with their scope."""

    def __init__(self, path: ScopePath, transitions: list[Transition]) -> None:
        self.path = path
        self.transitions = transitions
        named = ", ".join(f"{list(path)}{t}" for t in transitions)
        super().__init__(f"scope {list(path)} has a cycle that does not advance time: {named}")


def _parse_scope(body: Mapping[str, Any], path: ScopePath) -> ScopeSpec:
    kind: ScopeKind = body.get("kind", "root") if path else "root"
    nodes = []
    for raw in body.get("nodes", []):
        connections = raw.get("connections")
        node = Node(raw["id"], raw.get("inputs", 0), raw.get("outputs", 0), raw.get("name", ""),
                    None if connections is None else tuple(
                        Connection(c["input"], c["output"], tuple(tuple(s) for s in c["summaries"]))  # type: ignore[misc]
                        for c in connections))
        inner = raw.get("scope")
        nodes.append(NodeSpec(node, None if inner is None else _parse_scope(inner, (*path, raw["id"]))))
    edges = tuple(Edge(Location.source(e["source"]["node"], e["source"]["port"]),
                       Location.target(e["target"]["node"], e["target"]["port"])) for e in body.get("edges", []))
    return ScopeSpec(kind, tuple(nodes), edges)
