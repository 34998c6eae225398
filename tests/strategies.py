"""Hypothesis strategies for random dataflow graphs and update sequences, shared by the suites."""

from __future__ import annotations

from hypothesis import strategies as st

from tracker import oracle
from tracker.graph import Connection, Edge, Graph, Location, Node, Update
from tracker.timestamp import PathSummary


@st.composite
def raw_graphs(draw: st.DrawFn, arity: int | None = None, max_nodes: int = 6) -> Graph:
    """A random valid graph; it may contain non-incrementing cycles."""
    arity = draw(st.sampled_from([1, 2])) if arity is None else arity
    count = draw(st.integers(1, max_nodes))
    nodes = []
    for node_id in range(count):
        inputs, outputs = draw(st.integers(0, 2)), draw(st.integers(1 if node_id == 0 else 0, 2))
        connections = None
        if inputs and outputs and draw(st.booleans()):
            pairs = draw(st.sets(st.tuples(st.integers(0, inputs - 1), st.integers(0, outputs - 1)), max_size=4))
            connections = tuple(
                Connection(i, o, tuple(draw(st.lists(_summary(arity), min_size=1, max_size=2))))
                for i, o in sorted(pairs)
            )
        nodes.append(Node(node_id, inputs, outputs, f"op{node_id}", connections))
    sources = [Location.source(n.id, p) for n in nodes for p in range(n.outputs)]
    targets = [Location.target(n.id, p) for n in nodes for p in range(n.inputs)]
    edges = []
    if sources and targets:
        pairs = draw(st.lists(st.tuples(st.sampled_from(sources), st.sampled_from(targets)), max_size=2 * count))
        edges = [Edge(s, t) for s, t in pairs]
    return Graph.build(arity, nodes, edges)


def _summary(arity: int) -> st.SearchStrategy[tuple[int, ...]]:
    return st.tuples(*[st.integers(0, 2)] * arity)


def break_cycles(graph: Graph) -> Graph:
    """The same graph with every zero-summary connection on a non-incrementing cycle given a
    positive summary, so loops remain but all of them advance time (a feedback operator).

    Terminates: edges alone cannot form a cycle (a target's only way out is a connection), so
    every offending cycle holds a connection, and each round removes at least one."""
    while cycles := oracle.cycle_transitions(graph):
        bump = {(t.src.node, t.src.port, t.dst.port) for t in cycles if t.src.kind == "target"}
        feedback = PathSummary((0,) * (graph.arity - 1) + (1,))  # advance the innermost coordinate
        nodes = []
        for node in graph.nodes:
            conns = []
            for c in graph.connections(node):
                offending = (node.id, c.input, c.output) in bump
                conns.append(Connection(c.input, c.output, tuple(
                    feedback if offending and s.is_zero() else s for s in c.summaries)))
            nodes.append(Node(node.id, node.inputs, node.outputs, node.name, tuple(conns)))
        graph = Graph.build(graph.arity, nodes, list(graph.edges))
    return graph


@st.composite
def acyclic_graphs(draw: st.DrawFn, arity: int | None = None, loops: bool = True, max_nodes: int = 6) -> Graph:
    """A random graph the tracker accepts; with ``loops`` its cycles (if any) advance time,
    without ``loops`` every edge goes from a lower to a higher node id (a DAG)."""
    graph = draw(raw_graphs(arity, max_nodes))
    if not loops:
        edges = [e for e in graph.edges if e.source.node < e.target.node]
        graph = Graph.build(graph.arity, list(graph.nodes), edges)
    return break_cycles(graph)


@st.composite
def update_batches(draw: st.DrawFn, graph: Graph, max_batches: int = 8) -> list[list[Update]]:
    """Random batches of ``(location, time, delta)``; counts may go transiently negative."""
    locations = graph.locations()
    times = st.tuples(*[st.integers(0, 3)] * graph.arity)
    update = st.tuples(st.sampled_from(locations), times, st.sampled_from([-2, -1, 1, 1, 1, 2]))
    return draw(st.lists(st.lists(update, min_size=1, max_size=5), min_size=1, max_size=max_batches))
