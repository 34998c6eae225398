"""The GraphX helper (:mod:`spark_jobs.graphx`) held to the native core and the oracle: its cycle
check, ``Psi`` and propagation, both methods (``local``: each dataflow in one task; ``pregel``:
GraphX's SCC and Pregel) against the DataFrame path, on random graphs with loops, a dozen per
example in one Spark job; the engine choice and the one-line set-up errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_jobs import graphx
from spark_jobs.cycles import find_cycles_for_graphs
from spark_jobs.propagate import frontiers_for_graphs
from spark_jobs.session import graph_engine
from spark_jobs.summaries import summaries_for_graphs
from tests.strategies import acyclic_graphs, raw_graphs, update_batches
from tracker import oracle
from tracker.graph import Edge, Graph, Location, Node
from tracker.reachability import Tracker
from tracker.structure import find_cycles, path_summaries

pytestmark = pytest.mark.spark
SPARK = settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
PER_EXAMPLE = 12
ROOT = Path(__file__).resolve().parent.parent


def by_id(graphs: list[Graph]) -> dict[str, Graph]:
    return {f"g{i}": g for i, g in enumerate(graphs)}


def test_the_session_runs_graphx(spark) -> None:
    assert graph_engine(spark).startswith("graphx (helper ")
    assert graphx.jar_path().is_file()


@SPARK
@given(st.lists(raw_graphs(), min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
def test_cycles_equal_native_oracle_and_the_dataframe_path(spark, graphs: list[Graph]) -> None:
    local = find_cycles_for_graphs(spark, by_id(graphs), engine="graphx", method="local")
    frames = find_cycles_for_graphs(spark, by_id(graphs), engine="dataframe")
    for key, graph in by_id(graphs).items():
        assert local[key] == find_cycles(graph), graph
        assert set(local[key]) == oracle.cycle_transitions(graph)
        assert local[key] == frames[key], graph


# GraphX's own algorithms take a few Spark jobs per superstep: one example of a dozen graphs.
@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(raw_graphs(), min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
def test_graphx_own_scc_agrees(spark, graphs: list[Graph]) -> None:
    pregel = find_cycles_for_graphs(spark, by_id(graphs), engine="graphx", method="pregel")
    for key, graph in by_id(graphs).items():
        assert pregel[key] == find_cycles(graph), graph


def test_a_self_loop_and_a_ring_are_cycles_a_chain_is_not(spark) -> None:
    loop = Graph.build(1, [Node(0, 1, 1)], [Edge(Location.source(0, 0), Location.target(0, 0))])
    ring = Graph.build(1, [Node(i, 1, 1) for i in range(3)],
                       [Edge(Location.source(i, 0), Location.target((i + 1) % 3, 0)) for i in range(3)])
    chain = Graph.build(1, [Node(i, 1, 1) for i in range(3)],
                        [Edge(Location.source(i, 0), Location.target(i + 1, 0)) for i in range(2)])
    found = find_cycles_for_graphs(spark, {"loop": loop, "ring": ring, "chain": chain}, engine="graphx")
    assert len(found["loop"]) == 2 and len(found["ring"]) == 6 and found["chain"] == []


@SPARK
@given(st.lists(acyclic_graphs(), min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
def test_psi_equals_native_and_oracle(spark, graphs: list[Graph]) -> None:
    psi = summaries_for_graphs(spark, by_id(graphs), engine="graphx")
    for key, graph in by_id(graphs).items():
        assert psi[key] == path_summaries(graph) == oracle.path_summaries(graph), graph


@st.composite
def graphs_with_counts(draw: st.DrawFn) -> tuple[Graph, dict]:
    graph = draw(acyclic_graphs())
    return graph, oracle.accumulate(draw(update_batches(graph)))


@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(graphs_with_counts(), min_size=PER_EXAMPLE, max_size=PER_EXAMPLE))
def test_propagation_equals_native_and_oracle_both_methods(spark, cases: list[tuple[Graph, dict]]) -> None:
    from spark_jobs.frames import transitions_of
    from spark_jobs.propagate import collect_frontiers, times_of

    graphs = by_id([g for g, _ in cases])
    counts = {key: c for key, (_, c) in zip(graphs, cases, strict=True)}
    local = frontiers_for_graphs(spark, graphs, counts, engine="graphx")
    pregel = collect_frontiers(graphs, graphx.propagate(transitions_of(spark, graphs), times_of(spark, counts),
                                                        "pregel"))
    for key, graph in graphs.items():
        tracker = Tracker(graph)
        tracker.apply([(loc, t, c) for (loc, t), c in counts[key].items()])
        expected = oracle.frontiers(graph, counts[key])
        assert local[key] == expected == tracker.frontiers(), graph
        assert pregel[key] == expected, graph


def test_a_missing_helper_is_a_one_line_setup_error(tmp_path: Path) -> None:
    """In a fresh process whose cache has no jar: ``graph_engine()`` and ``get_spark()`` both
    refuse with one line, before any JVM starts; ``TRACKER_GRAPH_ENGINE=dataframe`` does not."""
    script = ("from spark_jobs.session import get_spark, graph_engine\n"
              "for call in (graph_engine, get_spark):\n"
              "    try:\n        call()\n    except Exception as error:\n"
              "        print(type(error).__name__, '|', str(error))\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XDG_CACHE_HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("HelperMissing | the GraphX helper is not built") for line in lines)
    assert "python -m spark_jobs.graphx" in lines[0] and "TRACKER_GRAPH_ENGINE=dataframe" in lines[0]
    probe = "from spark_jobs.session import graph_engine; print(graph_engine())"
    chosen = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={**env, "TRACKER_GRAPH_ENGINE": "dataframe"},
                            capture_output=True, text=True, timeout=120)
    assert chosen.stdout.strip() == "dataframe (TRACKER_GRAPH_ENGINE=dataframe)", chosen.stderr


def test_build_is_cached_and_names_its_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build into a fresh cache compiles; the second is a no-op; another source is another key."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    built = graphx.build(quiet=True)
    assert built.is_file() and built.is_relative_to(tmp_path)
    stamp = built.stat().st_mtime_ns
    assert graphx.build(quiet=True) == built and built.stat().st_mtime_ns == stamp
    assert graphx.cache_key([], {"A.java": b"1"}) != graphx.cache_key([], {"A.java": b"2"})
    import zipfile

    with zipfile.ZipFile(built) as jar:
        assert "tracker/graphx/ProgressGraphs.class" in jar.namelist()


@settings(max_examples=1, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_nested_check_and_audit_equal_the_native_engine_and_the_oracle(spark, data: st.DataObject) -> None:
    """What the service's Spark process calls for nested dataflows (:mod:`spark_jobs.nested`):
    the check agrees with the native build, the audit's frontiers with the scoped tracker and
    the flattened oracle."""
    from spark_jobs.nested import check_nested, nested_frontiers, nested_verdict
    from tests.strategies import nested_batches, nested_bodies
    from tracker import scoped_oracle
    from tracker.scope import NestedGraph
    from tracker.scoped import ScopedTracker

    graphs = {}
    for i in range(6):
        arity, body = data.draw(nested_bodies(max_depth=3, max_nodes=3))
        graphs[f"n{i}"] = NestedGraph.from_json(arity, body)
    checks = check_nested(spark, graphs)
    for i, graph in graphs.items():
        assert nested_verdict(graph, checks[i])[0] == "agreed", (i, nested_verdict(graph, checks[i]))
        assert checks[i].acceptable
    graph = graphs["n0"]
    batches = data.draw(nested_batches(graph, max_batches=3))
    counts = scoped_oracle.accumulate(batches)
    tracker = ScopedTracker(graph)
    for batch in batches:
        tracker.apply(batch)
    got = nested_frontiers(spark, graph, counts)
    assert got == {loc: sorted(ts) for loc, ts in scoped_oracle.frontiers(graph, counts).items()}
    live = {loc: sorted(ts) for loc, ts in tracker.frontiers().items() if ts}
    assert {loc: ts for loc, ts in got.items() if ts} == live
