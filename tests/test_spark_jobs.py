"""Differential tests of the Spark jobs: cycles, Psi and frontiers equal the native core and the
oracle on random graphs. Each hypothesis example packs a dozen random graphs into one Spark job
(one dataflow id each), which also exercises the multi-dataflow partitioning the tables use."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_jobs.cycles import find_cycles_for_graph, find_cycles_for_graphs
from spark_jobs.frames import Progress
from spark_jobs.propagate import frontiers_for, frontiers_for_graphs
from spark_jobs.summaries import summaries_for_graph, summaries_for_graphs
from tests.helpers import chain
from tests.strategies import acyclic_graphs, raw_graphs, update_batches
from tracker import oracle
from tracker.graph import Connection, Edge, Graph, Location, Node
from tracker.reachability import Tracker
from tracker.structure import find_cycles, path_summaries
from tracker.timestamp import PathSummary

pytestmark = pytest.mark.spark
SPARK = settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
PER_EXAMPLE = 12


def by_id(graphs: list[Graph]) -> dict[str, Graph]:
    return {f"g{i}": g for i, g in enumerate(graphs)}


@SPARK
@given(st.lists(raw_graphs(), min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
def test_cycles_equal_native_and_oracle(spark, graphs: list[Graph]) -> None:
    found = find_cycles_for_graphs(spark, by_id(graphs))
    for key, graph in by_id(graphs).items():
        assert found[key] == find_cycles(graph), graph
        assert set(found[key]) == oracle.cycle_transitions(graph)


def test_cycles_blame_only_the_cycle_not_what_hangs_off_it(spark) -> None:
    # 0 -> 1 <-> 2 (zero loop) -> 3 -> 4 (increments back to 3): only the 1/2 loop is reported.
    inc = (Connection(0, 0, (PathSummary((1,)),)),)
    graph = Graph.build(
        1,
        [Node(0, 0, 1), Node(1, 2, 1), Node(2, 1, 2), Node(3, 2, 1), Node(4, 1, 1, "fb", inc)],
        [
            Edge(Location.source(0, 0), Location.target(1, 0)),
            Edge(Location.source(1, 0), Location.target(2, 0)),
            Edge(Location.source(2, 0), Location.target(1, 1)),
            Edge(Location.source(2, 1), Location.target(3, 0)),
            Edge(Location.source(3, 0), Location.target(4, 0)),
            Edge(Location.source(4, 0), Location.target(3, 1)),
        ],
    )
    got = find_cycles_for_graph(spark, graph)
    assert got == find_cycles(graph)
    assert {t.src.node for t in got} | {t.dst.node for t in got} == {1, 2}
    assert find_cycles_for_graph(spark, chain(4)) == []


@SPARK
@given(st.lists(acyclic_graphs(), min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
def test_psi_equals_native_and_oracle(spark, graphs: list[Graph]) -> None:
    psi = summaries_for_graphs(spark, by_id(graphs))
    doubling = summaries_for_graphs(spark, by_id(graphs), engine="dataframe")
    for key, graph in by_id(graphs).items():
        assert psi[key] == doubling[key] == path_summaries(graph) == oracle.path_summaries(graph), graph


@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(acyclic_graphs(arity=2), min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
def test_linear_summarize_equals_doubling(spark, graphs: list[Graph]) -> None:
    linear = summaries_for_graphs(spark, by_id(graphs), method="linear", engine="dataframe")
    for key, graph in by_id(graphs).items():
        assert linear[key] == path_summaries(graph), graph


@st.composite
def graphs_with_counts(draw: st.DrawFn) -> tuple[Graph, dict]:
    graph = draw(acyclic_graphs())
    return graph, oracle.accumulate(draw(update_batches(graph)))


@SPARK
@given(st.lists(graphs_with_counts(), min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
def test_frontiers_equal_native_and_oracle(spark, cases: list[tuple[Graph, dict]]) -> None:
    graphs = by_id([g for g, _ in cases])
    counts = {key: c for key, (_, c) in zip(graphs, cases, strict=True)}
    default = frontiers_for_graphs(spark, graphs, counts)
    semi_naive = frontiers_for_graphs(spark, graphs, counts, engine="dataframe")
    via_psi = frontiers_for_graphs(spark, graphs, counts, method="psi")
    for key, graph in graphs.items():
        tracker = Tracker(graph)
        tracker.apply([(loc, t, c) for (loc, t), c in counts[key].items()])
        expected = oracle.frontiers(graph, counts[key])
        assert semi_naive[key] == default[key] == expected == tracker.frontiers(), graph
        assert via_psi[key] == expected, graph


def test_timely_worked_example(spark) -> None:
    graph = chain(2)
    frontiers = frontiers_for(spark, graph, {(Location.source(0, 0), (17,)): 1, (Location.target(2, 0), (3,)): 0})
    assert frontiers[Location.target(1, 0)] == [(17,)] and frontiers[Location.target(1, 1)] == [(18,)]
    assert frontiers[Location.source(0, 0)] == [(17,)]
    assert (
        summaries_for_graph(spark, graph)[(Location.source(2, 0), Location.target(2, 0))]
        == path_summaries(graph)[(Location.source(2, 0), Location.target(2, 0))]
    )


def test_iterations_keep_a_flat_plan(spark) -> None:
    """30 rounds of the DataFrame path's propagation: the analysed plan of the state is the same size every round,
    because each round ends with an eager localCheckpoint (lineage cut)."""
    graph = chain(14)
    progress = Progress(label="flat")
    frontiers = frontiers_for(spark, graph, {(Location.source(0, 0), (0,)): 1}, progress=progress,
                              engine="dataframe")
    assert frontiers == oracle.frontiers(graph, {(Location.source(0, 0), (0,)): 1})
    assert progress.rounds >= 25
    assert len(set(progress.plan_sizes)) == 1, progress.plan_sizes
    # The work of each round has a fixed, non-trivial plan: it starts from checkpointed frames.
    # (Round 1 reads the initial frame directly, later rounds a projection of the last one.)
    assert len(set(progress.query_sizes[1:])) == 1 and progress.query_sizes[1] > 3, progress.query_sizes


@SPARK
@given(st.lists(acyclic_graphs(), min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
def test_scope_summaries_equal_psi_into_operator_zero_inputs(spark, graphs: list[Graph]) -> None:
    """The backward ``summarize``: every location to each operator-zero input an edge enters."""
    from spark_jobs.frames import transitions_of
    from spark_jobs.summaries import boundary_of, boundary_summaries, collect_psi, operator_summary

    transitions = transitions_of(spark, by_id(graphs))
    scope = boundary_summaries(transitions, boundary_of(transitions))
    got = collect_psi(scope)
    as_operator = collect_psi(operator_summary(scope))
    for key, graph in by_id(graphs).items():
        boundary = {e.target for e in graph.edges if e.target.node == 0}
        expected = {(a, b): s for (a, b), s in path_summaries(graph).items() if b in boundary}
        assert got.get(key, {}) == expected, graph
        zero_outputs = {(a, b): s for (a, b), s in expected.items() if a == Location.source(0, a.port)}
        assert as_operator.get(key, {}) == zero_outputs


@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(raw_graphs(), min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
def test_cycle_paths_agree(spark, graphs: list[Graph]) -> None:
    """The DataFrame path's two methods, path doubling (its default) and prune-then-close, find
    the same transitions."""
    from spark_jobs.cycles import find_cycles as spark_cycles
    from spark_jobs.frames import transitions_of

    transitions = transitions_of(spark, by_id(graphs)).localCheckpoint()
    doubling = sorted(map(tuple, spark_cycles(transitions, engine="dataframe").collect()))
    pruned = sorted(map(tuple, spark_cycles(transitions, engine="dataframe", method="prune").collect()))
    assert doubling == pruned


def test_registration_check_of_a_ring(spark) -> None:
    """The batched registration check: a 100-operator ring (acceptable: one +1 edge) and a ring
    without the increment (rejected), in one call; answers equal the native core."""
    from bench.spark_jobs_figures import ring
    from spark_jobs.registration import check_graphs

    good = ring(100)
    bad = Graph.build(1, [Node(i, 1, 1) for i in range(5)],
                      [Edge(Location.source(i, 0), Location.target((i + 1) % 5, 0)) for i in range(5)])
    checks = check_graphs(spark, {"good": good, "bad": bad})
    assert checks["good"].acceptable and checks["good"].psi == path_summaries(good)
    assert not checks["bad"].acceptable and checks["bad"].cycles == find_cycles(bad) and checks["bad"].psi == {}
