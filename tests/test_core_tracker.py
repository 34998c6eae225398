"""The native tracker against the brute-force oracle, on random graphs and update sequences."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.strategies import acyclic_graphs, raw_graphs, update_batches
from tracker import oracle
from tracker.bounds import summary_bound
from tracker.graph import Connection, Edge, Graph, GraphError, Location, Node
from tracker.reachability import FrontierChange, Tracker
from tracker.structure import branching_locations, find_cycles, path_summaries, summary_cost, widest_summaries
from tracker.timestamp import PathSummary

SETTINGS = settings(max_examples=150, deadline=None)


def _replay(changes: list[FrontierChange]) -> dict[Location, list[tuple[int, ...]]]:
    counts: dict[tuple[Location, tuple[int, ...]], int] = defaultdict(int)
    for change in changes:
        counts[(change.location, change.time)] += change.diff
    result: dict[Location, list[tuple[int, ...]]] = defaultdict(list)
    for (location, time), count in counts.items():
        assert count in (0, 1), f"replayed count {count} for {location}@{time}"
        if count:
            result[location].append(time)
    return {loc: sorted(times) for loc, times in result.items()}


def _diff(before: dict, after: dict) -> set[tuple[Location, tuple[int, ...], int]]:
    out = set()
    for loc in after:
        old, new = set(before[loc]), set(after[loc])
        out |= {(loc, t, -1) for t in old - new} | {(loc, t, 1) for t in new - old}
    return out


@pytest.mark.parametrize("loops", [False, True], ids=["dag", "loops"])
@pytest.mark.parametrize("arity", [1, 2])
def test_tracker_matches_oracle_after_every_batch(arity: int, loops: bool) -> None:
    @SETTINGS
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        graph = data.draw(acyclic_graphs(arity=arity, loops=loops))
        batches = data.draw(update_batches(graph))
        tracker = Tracker(graph)
        psi = oracle.path_summaries(graph)
        expected_before = oracle.frontiers(graph, {}, psi)
        emitted: list[FrontierChange] = []
        for index in range(len(batches)):
            changes = tracker.apply(batches[index])
            emitted.extend(changes)
            expected = oracle.frontiers(graph, oracle.accumulate(batches[: index + 1]), psi)
            assert tracker.frontiers() == expected
            assert oracle.fixpoint_frontiers(graph, oracle.accumulate(batches[: index + 1])) == expected
            # Exactly the changes the batch causes, each once, nothing more.
            assert len(changes) == len(set(changes))
            assert {tuple(c) for c in changes} == _diff(expected_before, expected)
            expected_before = expected
        final = {loc: times for loc, times in tracker.frontiers().items() if times}
        assert _replay(emitted) == final
        assert tracker.pointstamps() == oracle.accumulate(batches)

    check()


@SETTINGS
@given(graph=raw_graphs())
def test_cycle_check_accepts_exactly_the_graphs_without_non_incrementing_cycles(graph: Graph) -> None:
    assert set(find_cycles(graph)) == oracle.cycle_transitions(graph)
    if find_cycles(graph):
        with pytest.raises(ValueError, match="non-incrementing"):
            Tracker(graph)
    else:
        Tracker(graph)


@SETTINGS
@given(graph=acyclic_graphs())
def test_path_summaries_equal_the_oracle(graph: Graph) -> None:
    assert path_summaries(graph) == oracle.path_summaries(graph)


def _timely_example() -> Graph:
    """Timely's reachability docs: three nodes in a cycle, the third adds one."""
    nodes = [
        Node(0, 1, 1),
        Node(1, 1, 1),
        Node(2, 1, 1, connections=(Connection(0, 0, (PathSummary((1,)),)),)),
    ]
    edges = [Edge(Location.source(a, 0), Location.target(b, 0)) for a, b in [(0, 1), (1, 2), (2, 0)]]
    return Graph.build(1, nodes, edges)


@SETTINGS
@given(graph=acyclic_graphs(arity=2, max_nodes=8), limit=st.integers(1, 4), budget=st.integers(0, 100))
def test_widest_summaries_bounds_every_antichain_of_psi(graph: Graph, limit: int, budget: int) -> None:
    """Searching only the branching origins never refuses a graph whose antichains all fit,
    misses a too-wide antichain by at most one element (a chain's own summary), and refuses
    exactly when some branching origin's cost is over the budget."""
    psi = path_summaries(graph)
    widest = max(len(chain) for chain in psi.values())
    costs = {origin: sum(summary_cost(len(chain)) for (o, _), chain in psi.items() if o == origin)
             for origin in branching_locations(graph)}
    overflow = widest_summaries(graph, limit, cost_base=budget)
    if overflow is None:
        assert widest <= limit + 1 and all(cost <= budget for cost in costs.values())
    elif overflow.size > limit:
        assert widest >= overflow.size
    else:
        assert overflow.cost > budget and costs[overflow.origin] >= overflow.cost
    if widest_summaries(graph, 1000, cost_base=budget) is None:  # then the cost decided nothing
        assert all(cost <= budget for cost in costs.values())


@SETTINGS
@given(graph=acyclic_graphs(arity=2, max_nodes=8) | acyclic_graphs(arity=3, max_nodes=6))
def test_the_cheap_summary_bound_is_never_below_an_antichain_of_psi(graph: Graph) -> None:
    """``summary_bound`` judges every graph without ``Psi``: it must never be below a width of
    ``Psi`` (loops included: cycles that advance time)."""
    bound = summary_bound(graph)
    for (_, dest), chain in path_summaries(graph).items():
        assert len(chain) <= bound.widths[dest], (dest, chain, bound.widths[dest])
    assert bound.widest == max(bound.widths.values(), default=1)


def test_the_summary_bound_is_exact_on_a_chain_of_diamonds() -> None:
    """k diamonds of branches [1, 0] and [0, 1]: k + 1 summaries at the end, and the bound says
    so (it is what refuses k = 400 and 700, whose exact check would cost too much)."""
    from api.schema.models import RegisterRequest
    from api.schema.registration import build_graph
    from api.schema.spec import registration_record
    from bench.workloads import diamonds_graph

    for k in (3, 10, 40):
        graph, _ = build_graph(registration_record(RegisterRequest.model_validate(diamonds_graph(k))), new=False)
        bound = summary_bound(graph)
        psi = path_summaries(graph, [Location.source(0, 0)])
        assert bound.widest == k + 1 == max(len(chain) for chain in psi.values())
        assert all(bound.widths[d] == len(chain) for (_, d), chain in psi.items())


def test_timely_worked_example() -> None:
    tracker = Tracker(_timely_example())
    source = Location.source(0, 0)
    added = tracker.apply([(source, (17,), 1)])
    targets = {(c.location, c.time, c.diff) for c in added if c.location.kind == "target"}
    assert targets == {
        (Location.target(0, 0), (18,), 1),
        (Location.target(1, 0), (17,), 1),
        (Location.target(2, 0), (17,), 1),
    }
    assert tracker.frontier(source) == [(17,)]
    removed = tracker.apply([(source, (17,), -1)])
    assert {(c.location, c.time, -c.diff) for c in removed} == {(c.location, c.time, c.diff) for c in added}
    assert all(not times for times in tracker.frontiers().values())


def test_transiently_negative_counts_hold_nothing_back() -> None:
    tracker = Tracker(_timely_example())
    target = Location.target(1, 0)
    assert tracker.apply([(target, (3,), -1)]) == []  # the receiver's -1 arrives first
    assert tracker.pointstamps() == {(target, (3,)): -1}
    assert tracker.apply([(target, (3,), 1)]) == []  # the sender's +1 cancels it: nothing ever active
    assert tracker.pointstamps() == {}


def test_notification_safety() -> None:
    tracker = Tracker(_timely_example())
    tracker.apply([(Location.source(0, 0), (5,), 1)])
    assert not tracker.can_notify(Location.target(1, 0), (5,))
    assert tracker.can_notify(Location.target(1, 0), (4,))
    assert not tracker.can_notify(Location.target(0, 0), (6,))
    assert tracker.can_notify(Location.target(0, 0), (5,))


def test_bad_batch_changes_nothing() -> None:
    tracker = Tracker(_timely_example())
    tracker.apply([(Location.source(0, 0), (1,), 1)])
    before = (tracker.frontiers(), tracker.pointstamps())
    with pytest.raises(GraphError, match="update 1: unknown location"):
        tracker.apply([(Location.source(1, 0), (1,), 1), (Location.source(9, 0), (1,), 1)])
    with pytest.raises(GraphError, match="arity is 1"):
        tracker.apply([(Location.source(1, 0), (1, 2), 1)])
    with pytest.raises(GraphError, match="non-negative"):
        tracker.apply([(Location.source(1, 0), (-1,), 1)])
    with pytest.raises(GraphError, match="delta must be an integer"):
        tracker.apply([(Location.source(1, 0), (1,), 1.5)])
    assert (tracker.frontiers(), tracker.pointstamps()) == before


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_tracker_matches_fixpoint_on_larger_graphs(data: st.DataObject) -> None:
    """Graphs too large for path enumeration, against the from-scratch fixed point."""
    graph = data.draw(acyclic_graphs(max_nodes=25))
    batches = data.draw(update_batches(graph, max_batches=15))
    tracker = Tracker(graph)
    for index, batch in enumerate(batches):
        tracker.apply(batch)
        assert tracker.frontiers() == oracle.fixpoint_frontiers(graph, oracle.accumulate(batches[: index + 1]))
