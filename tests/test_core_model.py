"""Unit tests of the model: timestamps, summaries, antichains, and every graph validation error."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.strategies import raw_graphs
from tracker.antichain import Antichain, MutableAntichain
from tracker.graph import Connection, Edge, Graph, GraphError, Location, Node
from tracker.timestamp import PathSummary, check_time, less_equal, less_than

times2 = st.tuples(st.integers(0, 4), st.integers(0, 4))


def test_product_order_is_partial() -> None:
    assert less_equal((1, 2), (1, 2)) and not less_than((1, 2), (1, 2))
    assert not less_equal((2, 1), (1, 2)) and not less_equal((1, 2), (2, 1))


def test_summary_algebra() -> None:
    s, u = PathSummary((0, 1)), PathSummary((2, 0))
    assert s.results_in((3, 4)) == (3, 5)
    assert s.followed_by(u) == (2, 1)
    assert s.followed_by(u).results_in((0, 0)) == u.results_in(s.results_in((0, 0)))
    assert PathSummary.zero(2).is_zero() and not s.is_zero()


@given(st.lists(times2, max_size=12))
def test_antichain_keeps_exactly_the_minimal_elements(elements: list[tuple[int, int]]) -> None:
    chain = Antichain(elements)
    minimal = {e for e in elements if not any(less_than(o, e) for o in elements)}
    assert set(chain) == minimal
    for probe in [(0, 0), (2, 2), (4, 4)]:
        assert chain.less_equal(probe) == any(less_equal(e, probe) for e in elements)
    assert chain.dominates(Antichain(elements))


@given(st.lists(st.tuples(st.one_of(times2, st.tuples(st.integers(0, 4))), st.sampled_from([-1, 0, 1, 2])),
                max_size=20).filter(lambda us: len({len(t) for t, _ in us}) <= 1), st.booleans())
def test_mutable_antichain_reports_exact_changes(updates: list[tuple[tuple[int, ...], int]], single: bool) -> None:
    counts: dict[tuple[int, ...], int] = {}
    chain: MutableAntichain[tuple[int, ...]] = MutableAntichain()
    frontier: set[tuple[int, ...]] = set()
    for time, delta in updates:
        counts[time] = counts.get(time, 0) + delta
        changes = chain.update(time, delta) if single else chain.update_iter([(time, delta)])
        for changed, diff in changes:
            (frontier.add if diff > 0 else frontier.remove)(changed)
        active = [t for t, c in counts.items() if c > 0]
        expected = {t for t in active if not any(less_than(o, t) for o in active)}
        assert frontier == expected == set(chain.frontier())


def _node(node_id: int, inputs: int = 1, outputs: int = 1, **kw: object) -> Node:
    return Node(node_id, inputs, outputs, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("arity", "nodes", "edges", "message"),
    [
        (0, [_node(0)], [], "timestamp_arity must be a positive integer"),
        (1, [_node(0), _node(0)], [], "duplicate node id 0"),
        (1, [_node(-1)], [], "id must be a non-negative integer"),
        (1, [_node(0, inputs=-1)], [], "inputs must be a non-negative integer"),
        (1, [_node(0, connections=(Connection(1, 0, ((0,),)),))], [], "input 1 does not exist"),
        (1, [_node(0, connections=(Connection(0, 3, ((0,),)),))], [], "output 3 does not exist"),
        (1, [_node(0, connections=(Connection(0, 0, ()),))], [], "needs at least one summary"),
        (1, [_node(0, connections=(Connection(0, 0, ((0, 1),)),))], [], "arity is 1"),
        (1, [_node(0, connections=(Connection(0, 0, ((-1,),)),))], [], "non-negative"),
        (1, [_node(0)], [Edge(Location.source(0, 1), Location.target(0, 0))], "unknown port (0,1,source)"),
        (1, [_node(0)], [Edge(Location.source(0, 0), Location.target(5, 0))], "unknown port (5,0,target)"),
        (1, [_node(0), _node(1)], [Edge(Location.source(0, 0), Location.source(1, 0))], "edges into sources"),
        (1, [_node(0), _node(1)], [Edge(Location.target(0, 0), Location.target(1, 0))], "must start at a source"),
    ],
)
def test_graph_validation_errors(arity: int, nodes: list[Node], edges: list[Edge], message: str) -> None:
    with pytest.raises(GraphError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Graph.build(arity, nodes, edges)


def test_graph_size_limits() -> None:
    with pytest.raises(GraphError, match="1000000 transitions"):
        Graph.build(1, [Node(0, 1000, 1000)], [])
    with pytest.raises(GraphError, match="200000 ports"):
        Graph.build(1, [Node(0, 0, 200_000)], [])
    Graph.build(1, [Node(0, 300, 300)], [])  # 90,000 transitions: allowed


def test_update_validation_errors() -> None:
    graph = Graph.build(2, [_node(0)], [])
    target = Location.target(0, 0)
    assert graph.check_updates([(target, [1, 2], 1)]) == [(target, (1, 2), 1)]
    for bad, message in [
        ((Location.target(0, 1), (1, 2), 1), "unknown location"),
        ((target, (1,), 1), "arity is 2"),
        ((target, (1, -2), 1), "non-negative"),
        ((target, (1, True), 1), "non-negative integers"),
        ((target, "12", 1), "must be a list"),
        ((target, (1, 2), "1"), "delta must be an integer"),
    ]:
        with pytest.raises(GraphError, match=message):
            graph.check_updates([bad])
    with pytest.raises(ValueError, match="coordinates"):
        check_time([1, 2, 3], 2)


def test_default_initial_pointstamps_follow_the_input_vertex_rule() -> None:
    graph = Graph.build(2, [Node(0, 0, 2), Node(1, 1, 1), Node(2, 0, 0)], [])
    assert graph.default_initial() == [
        (Location.source(0, 0), (0, 0), 1),
        (Location.source(0, 1), (0, 0), 1),
    ]


def test_omitted_connections_mean_all_to_all_zero() -> None:
    graph = Graph.build(1, [Node(0, 2, 2)], [])
    assert {(t.src.port, t.dst.port, tuple(t.summary)) for t in graph.transitions()} == {
        (i, o, (0,)) for i in range(2) for o in range(2)
    }


@given(raw_graphs())
def test_a_graphs_location_orders_are_its_locations_sorted(graph: Graph) -> None:
    every = graph._locations  # the ports as validated (the orders are generated from the nodes)
    assert len(every) == len(graph.locations())
    assert graph.locations() == sorted(every, key=lambda loc: (loc.node, loc.kind != "target", loc.port))
    assert graph.sorted_locations() == sorted(every)
