"""Hypothesis strategies for random dataflow graphs and update sequences, shared by the suites."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from tracker import oracle
from tracker.graph import Connection, Edge, Graph, Location, Node, Transition, Update
from tracker.scope import NestedGraph, NonIncrementingCycle, ScopedLocation
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


# -- nested scopes ------------------------------------------------------------------------------


@st.composite
def nested_bodies(draw: st.DrawFn, max_depth: int = 3, max_nodes: int = 4) -> tuple[int, dict[str, Any]]:
    """A random valid nested dataflow as ``(root arity, registration body)``: scopes of both
    kinds up to ``max_depth`` deep, loops inside scopes and around them, every cycle advancing
    time (offending zero-summary connections become feedback, or an edge is dropped)."""
    arity = draw(st.sampled_from([1, 2]))
    body = _scope_body(draw, arity, 0, max_depth, max_nodes, None)
    while True:
        try:
            NestedGraph.from_json(arity, body)
            return arity, body
        except NonIncrementingCycle as cycle:
            _break(body, cycle.path, cycle.transitions)


def _scope_body(draw: st.DrawFn, arity: int, depth: int, max_depth: int, max_nodes: int,
                boundary: tuple[int, int] | None) -> dict[str, Any]:
    first = 0 if boundary is None else 1
    nodes: list[dict[str, Any]] = []
    sources: list[tuple[int, int]] = [(0, p) for p in range(boundary[0])] if boundary else []
    targets: list[tuple[int, int]] = [(0, q) for q in range(boundary[1])] if boundary else []
    for node_id in range(first, first + draw(st.integers(1, max_nodes))):
        inputs = draw(st.integers(0, 2))
        outputs = draw(st.integers(1 if node_id == 0 else 0, 2))
        node: dict[str, Any] = {"id": node_id, "inputs": inputs, "outputs": outputs}
        is_input = boundary is None and node_id == 0  # the root's node 0 stays a plain input
        if depth < max_depth and not is_input and (inputs or outputs) and draw(st.integers(0, 2)) == 0:
            kind = draw(st.sampled_from(["iterative", "region"]))
            inner_arity = arity + 1 if kind == "iterative" else arity
            node["scope"] = {"kind": kind, **_scope_body(draw, inner_arity, depth + 1, max_depth,
                                                         max(1, max_nodes - 1), (inputs, outputs))}
        elif inputs and outputs and draw(st.booleans()):
            pairs = draw(st.sets(st.tuples(st.integers(0, inputs - 1), st.integers(0, outputs - 1)), max_size=3))
            node["connections"] = [{"input": i, "output": o,
                                    "summaries": draw(st.lists(_summary(arity).map(list), min_size=1, max_size=2))}
                                   for i, o in sorted(pairs)]
        nodes.append(node)
        sources += [(node_id, p) for p in range(outputs)]
        targets += [(node_id, p) for p in range(inputs)]
    edges = []
    if sources and targets:
        pairs = draw(st.lists(st.tuples(st.sampled_from(sources), st.sampled_from(targets)),
                              max_size=2 * len(nodes) + 2))
        edges = [{"source": {"node": s[0], "port": s[1]}, "target": {"node": t[0], "port": t[1]}} for s, t in pairs]
    return {"nodes": nodes, "edges": edges}


def _break(body: dict[str, Any], path: tuple[int, ...], transitions: list[Transition]) -> None:
    scope = body
    for node_id in path:
        scope = next(n for n in scope["nodes"] if n["id"] == node_id)["scope"]
    nodes = {n["id"]: n for n in scope["nodes"]}
    for t in transitions:
        node = nodes.get(t.src.node)
        if t.src.kind == "target" and node is not None and "scope" not in node:
            width = len(t.summary)
            feedback = [0] * (width - 1) + [1]
            connections = node.get("connections")
            if connections is None:
                connections = [{"input": i, "output": o, "summaries": [[0] * width]}
                               for i in range(node["inputs"]) for o in range(node["outputs"])]
            for conn in connections:
                if conn["input"] == t.src.port and conn["output"] == t.dst.port:
                    conn["summaries"] = [feedback if not any(s) else s for s in conn["summaries"]]
            node["connections"] = connections
            return
    for t in transitions:  # only scope nodes' summaries and edges: drop an edge of the cycle
        if t.src.kind == "source":
            edge = {"source": {"node": t.src.node, "port": t.src.port},
                    "target": {"node": t.dst.node, "port": t.dst.port}}
            scope["edges"] = [e for e in scope["edges"] if e != edge]
            return
    raise AssertionError(f"cannot break {transitions}")


@st.composite
def nested_batches(draw: st.DrawFn, nested: NestedGraph, max_batches: int = 6
                   ) -> list[list[tuple[ScopedLocation, tuple[int, ...], int]]]:
    """Random batches at the locations that hold pointstamps, transient negatives included."""
    holders = [loc for loc in nested.locations() if nested.holds_pointstamps(loc)]
    batches: list[list[tuple[ScopedLocation, tuple[int, ...], int]]] = []
    if not holders:
        return batches
    for _ in range(draw(st.integers(1, max_batches))):
        batch = []
        for _ in range(draw(st.integers(1, 4))):
            loc = draw(st.sampled_from(holders))
            time = tuple(draw(st.lists(st.integers(0, 3), min_size=nested.arity_of(loc.scope),
                                       max_size=nested.arity_of(loc.scope))))
            batch.append((loc, time, draw(st.sampled_from([1, 1, 2, -1]))))
        batches.append(batch)
    return batches
