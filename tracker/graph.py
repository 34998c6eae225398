"""The dataflow graph: locations, operators with internal connections, edges, initial times.

The data model of Naiad (SOSP 2013) as ``docs/core.md`` restates it: a :class:`Location` is
an operator port, a ``source`` (output) or a ``target`` (input); edges go from sources to
targets and never change times; operators change times only along their internal connections
``(input, output, summary antichain)``.

Guarantees: a :class:`Graph` exists only through :meth:`Graph.build`, which validates
everything a user can get wrong (and raises :class:`GraphError` naming the culprit), so every
graph in the program is well formed; :meth:`Graph.check_updates` validates a whole batch before
any of it is used. Cycles are checked separately (:func:`tracker.structure.find_cycles`).

>>> g = Graph.build(1, nodes=[Node(0, inputs=0, outputs=1), Node(1, inputs=1, outputs=0)],
...                 edges=[Edge(Location.source(0, 0), Location.target(1, 0))])
>>> [str(t) for t in g.transitions()]
['(0,0,source) -> (1,0,target) +[0]']
>>> g.default_initial()
[(Location(node=0, port=0, kind='source'), (0,), 1)]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Literal, NamedTuple

from tracker.antichain import Antichain
from tracker.timestamp import MAX_INCREMENT, PathSummary, Timestamp, check_time, minimum

Kind = Literal["source", "target"]


class GraphError(ValueError):
    """The graph (or an update against it) is invalid; the message says exactly what and where."""


class Location(NamedTuple):
    """An operator port: ``kind`` is ``source`` (an output) or ``target`` (an input).

    >>> Location.target(3, 0)
    Location(node=3, port=0, kind='target')
    """

    node: int
    port: int
    kind: Kind

    @classmethod
    def source(cls, node: int, port: int) -> Location:
        """Output ``port`` of operator ``node``."""
        return cls(node, port, "source")

    @classmethod
    def target(cls, node: int, port: int) -> Location:
        """Input ``port`` of operator ``node``."""
        return cls(node, port, "target")

    def __str__(self) -> str:
        return f"({self.node},{self.port},{self.kind})"


class Transition(NamedTuple):
    """One step a time can take: along an edge (zero summary) or an internal connection."""

    src: Location
    dst: Location
    summary: PathSummary

    def __str__(self) -> str:
        return f"{self.src} -> {self.dst} +{list(self.summary)}"  # times and summaries as the service's JSON


@dataclass(frozen=True)
class Connection:
    """An internal connection from input ``input`` to output ``output`` of one operator.

    ``summaries`` is an antichain: a time ``t`` entering the input may leave at ``s(t)`` for
    each ``s`` (the least increments the operator promises).
    """

    input: int
    output: int
    summaries: tuple[PathSummary, ...]


@dataclass(frozen=True)
class Node:
    """An operator with ``inputs`` targets and ``outputs`` sources.

    ``connections=None`` means every input reaches every output with the zero summary, the
    common case; an explicit list replaces that (an empty list: no input reaches any output).
    """

    id: int
    inputs: int
    outputs: int
    name: str = ""
    connections: tuple[Connection, ...] | None = None


@dataclass(frozen=True)
class Edge:
    """A channel from an operator output (``source``) to an operator input (``target``)."""

    source: Location
    target: Location


MAX_LOCATIONS = 100_000
"""The most ports a graph may have."""
MAX_TRANSITIONS = 100_000
"""The most transitions (edges plus internal connection summaries) a graph may have."""
MAX_NODE_ID = 2**31 - 1
"""The largest node id (the tables store node ids and ports as 32-bit integers)."""
MAX_DELTA = 2**31 - 1
"""The largest magnitude of one update's ``delta`` (counts are stored as 64-bit integers)."""

Update = tuple[Location, Timestamp, int]
"""A change to an occurrence count: ``(location, time, delta)``."""


@dataclass(frozen=True)
class Graph:
    """A validated dataflow graph of a fixed timestamp arity. Build it with :meth:`build`."""

    arity: int
    nodes: tuple[Node, ...]
    edges: tuple[Edge, ...]
    _locations: frozenset[Location] = field(repr=False, compare=False)
    _transitions: tuple[Transition, ...] = field(repr=False, compare=False)

    @classmethod
    def build(cls, arity: int, nodes: Sequence[Node], edges: Sequence[Edge]) -> Graph:
        """Validate and freeze a graph; raise :class:`GraphError` naming the first problem.

        Checked: arity >= 1, unique non-negative node ids, non-negative port counts, connection
        ports that exist, summaries of the right arity with non-negative increments and at least
        one per connection, edges from an existing source to an existing target, and size:
        at most :data:`MAX_LOCATIONS` ports and :data:`MAX_TRANSITIONS` transitions (a node with
        omitted connections has ``inputs * outputs`` of them), so that a few bytes of JSON cannot
        ask for millions of objects. Cycles are not checked here: see
        :func:`tracker.structure.find_cycles`.

        Raises:
            GraphError: the first problem found, naming the node, connection or edge.

        >>> Graph.build(1, [Node(0, 0, 1)], [Edge(Location.source(0, 0), Location.target(1, 0))])
        Traceback (most recent call last):
        ...
        tracker.graph.GraphError: edge (0,0,source) -> (1,0,target): unknown port (1,0,target)
        """
        if isinstance(arity, bool) or not isinstance(arity, int) or arity < 1:
            raise GraphError(f"timestamp_arity must be a positive integer, got {arity!r}")
        seen: dict[int, Node] = {}
        built: list[Node] = []
        for node in nodes:
            built.append(_check_node(node, arity, seen))
        _check_size(built, len(edges))
        locations = frozenset(
            loc
            for node in built
            for loc in (
                *(Location.target(node.id, p) for p in range(node.inputs)),
                *(Location.source(node.id, p) for p in range(node.outputs)),
            )
        )
        for edge in edges:
            _check_edge(edge, locations)
        graph_edges = tuple(
            Edge(Location.source(e.source.node, e.source.port), Location.target(e.target.node, e.target.port))
            for e in edges
        )
        zero = PathSummary.zero(arity)
        transitions: list[Transition] = []
        for node in built:
            for conn in _connections_of(node, arity):
                for summary in conn.summaries:
                    transitions.append(
                        Transition(Location.target(node.id, conn.input), Location.source(node.id, conn.output), summary)
                    )
        transitions.extend(Transition(e.source, e.target, zero) for e in graph_edges)
        return cls(arity, tuple(built), graph_edges, locations, tuple(transitions))

    def locations(self) -> list[Location]:
        """Every location, sorted by (node, kind, port) so listings are stable: an operator's
        inputs, then its outputs."""
        # Built once per graph, in order rather than by a comparison sort: every frontier answer
        # and snapshot lists them, and sorting 100,000 locations held the GIL (so the event loop)
        # 40-175 ms in one call.
        cached: tuple[Location, ...] | None = self.__dict__.get("_sorted")
        if cached is None:
            cached = tuple(loc for node in self._by_id() for loc in (
                *(Location.target(node.id, p) for p in range(node.inputs)),
                *(Location.source(node.id, p) for p in range(node.outputs))))
            object.__setattr__(self, "_sorted", cached)
        return list(cached)

    def sorted_locations(self) -> list[Location]:
        """Every location in its natural order, ``sorted(self.locations())``: by (node, port,
        kind), an output before the input of the same number (the compiled engine's index
        order).

        >>> graph = Graph.build(1, [Node(0, 2, 1)], [])
        >>> graph.sorted_locations() == sorted(graph.locations())
        True
        """
        cached: tuple[Location, ...] | None = self.__dict__.get("_natural")
        if cached is None:
            cached = tuple(loc for node in self._by_id() for p in range(max(node.inputs, node.outputs)) for loc in (
                *((Location.source(node.id, p),) if p < node.outputs else ()),
                *((Location.target(node.id, p),) if p < node.inputs else ())))
            object.__setattr__(self, "_natural", cached)
        return list(cached)

    def outputs_first(self) -> list[Location]:
        """Every location sorted by (node, kind, port): an operator's outputs, then its inputs
        (the order ``Psi`` is listed in), generated in order.

        >>> graph = Graph.build(1, [Node(0, 2, 1)], [])
        >>> graph.outputs_first() == sorted(graph.locations(), key=lambda loc: (loc.node, loc.kind, loc.port))
        True
        """
        return [loc for node in self._by_id() for loc in (
            *(Location.source(node.id, p) for p in range(node.outputs)),
            *(Location.target(node.id, p) for p in range(node.inputs)))]

    def _by_id(self) -> list[Node]:
        return sorted(self.nodes, key=attrgetter("id"))  # small integers: a fast C sort

    def has_location(self, location: Location) -> bool:
        """True iff ``location`` is a port of this graph."""
        return location in self._locations

    def transitions(self) -> tuple[Transition, ...]:
        """Every one-step move: one per summary of each connection, and one per edge."""
        return self._transitions

    def connections(self, node: Node) -> tuple[Connection, ...]:
        """``node``'s internal connections, the implicit all-to-all zero ones spelled out."""
        return _connections_of(node, self.arity)

    def default_initial(self) -> list[Update]:
        """Naiad's input-vertex rule: each output of each input-less node holds one capability
        at the minimum time."""
        zero = minimum(self.arity)
        return [
            (Location.source(n.id, p), zero, 1)
            for n in self.nodes
            if n.inputs == 0
            for p in range(n.outputs)
        ]

    def check_updates(self, updates: Iterable[tuple[object, object, object]]) -> list[Update]:
        """Validate a batch of ``(location, time, delta)`` and return it normalised.

        Raises:
            GraphError: the first bad update, by index (unknown location, a time of the wrong
                arity or out of range, a delta that is not an int or out of range).
        """
        result: list[Update] = []
        for index, (location, time, delta) in enumerate(updates):
            loc = Location(*location) if isinstance(location, tuple) else location
            if not isinstance(loc, Location) or not self.has_location(loc):
                raise GraphError(f"update {index}: unknown location {location}")
            try:
                checked = check_time(time, self.arity)
            except ValueError as error:
                raise GraphError(f"update {index}: {error}") from None
            if isinstance(delta, bool) or not isinstance(delta, int):
                raise GraphError(f"update {index}: delta must be an integer, got {delta!r}")
            if not -MAX_DELTA <= delta <= MAX_DELTA:
                raise GraphError(f"update {index}: delta {delta} is out of range (at most {MAX_DELTA} either way)")
            result.append((loc, checked, delta))
        return result


def _check_size(nodes: list[Node], edges: int) -> None:
    locations = sum(n.inputs + n.outputs for n in nodes)
    if locations > MAX_LOCATIONS:
        raise GraphError(f"graph has {locations} ports (inputs plus outputs); the limit is {MAX_LOCATIONS}")
    transitions = edges + sum(
        n.inputs * n.outputs if n.connections is None else sum(len(c.summaries) for c in n.connections)
        for n in nodes
    )
    if transitions > MAX_TRANSITIONS:
        raise GraphError(
            f"graph has {transitions} transitions (edges plus internal connections; a node without explicit "
            f"connections connects every input to every output); the limit is {MAX_TRANSITIONS}"
        )


def _check_node(node: Node, arity: int, seen: dict[int, Node]) -> Node:
    for name in ("id", "inputs", "outputs"):
        value = getattr(node, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise GraphError(f"node {node.id!r}: {name} must be a non-negative integer, got {value!r}")
    if node.id > MAX_NODE_ID:
        raise GraphError(f"node {node.id}: node ids are at most {MAX_NODE_ID}")
    if node.id in seen:
        raise GraphError(f"duplicate node id {node.id}")
    seen[node.id] = node
    if node.connections is None:
        return node
    checked: list[Connection] = []
    for conn in node.connections:
        where = f"node {node.id} connection {conn.input}->{conn.output}"
        if not 0 <= conn.input < node.inputs:
            raise GraphError(f"{where}: input {conn.input} does not exist (node has {node.inputs} inputs)")
        if not 0 <= conn.output < node.outputs:
            raise GraphError(f"{where}: output {conn.output} does not exist (node has {node.outputs} outputs)")
        if not conn.summaries:
            raise GraphError(f"{where}: needs at least one summary")
        summaries: Antichain[PathSummary] = Antichain()
        for raw in conn.summaries:
            try:
                summaries.insert(PathSummary(check_time(raw, arity, what="summary", limit=MAX_INCREMENT)))
            except ValueError as error:
                raise GraphError(f"{where}: {error} (increments are non-negative, at most {MAX_INCREMENT})") from None
        checked.append(Connection(conn.input, conn.output, tuple(summaries.elements())))
    return Node(node.id, node.inputs, node.outputs, node.name, tuple(checked))


def _check_edge(edge: Edge, locations: frozenset[Location]) -> None:
    src, dst = edge.source, edge.target
    if src.kind != "source":
        raise GraphError(f"edge {src} -> {dst}: an edge must start at a source (an operator output)")
    if dst.kind != "target":
        raise GraphError(
            f"edge {src} -> {dst}: an edge must end at a target (an operator input); edges into sources are not allowed"
        )
    for loc in (src, dst):
        if loc not in locations:
            raise GraphError(f"edge {src} -> {dst}: unknown port {loc}")


def _connections_of(node: Node, arity: int) -> tuple[Connection, ...]:
    if node.connections is not None:
        return node.connections
    zero = (PathSummary.zero(arity),)
    return tuple(Connection(i, o, zero) for i in range(node.inputs) for o in range(node.outputs))
