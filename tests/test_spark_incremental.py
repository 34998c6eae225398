"""The incremental Spark job: after every batch of a series, its frontier changes equal the
native tracker's changes (the GraphX helper's, with ``Psi`` indexed once or shuffled with every
batch, its state kept beside the index in the executors, and the DataFrame path's alike), and
each path's frontiers and counts equal a full Spark recompute and the oracle."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_jobs.frames import all_arity_one, decode_code, encode, locations_of, transitions_of
from spark_jobs.graphx import IncrementalState, index_psi
from spark_jobs.incremental import FRONTIER_SCHEMA, POINTS_SCHEMA, SparkFrontierEngine, incremental, update_frontiers
from spark_jobs.propagate import frontiers_for_graphs
from spark_jobs.summaries import summarize
from tests.helpers import chain
from tests.strategies import acyclic_graphs, update_batches
from tracker import oracle
from tracker.graph import Graph, Location
from tracker.reachability import Tracker
from tracker.structure import path_summaries

pytestmark = pytest.mark.spark
BATCHES = 4


@st.composite
def series(draw: st.DrawFn) -> tuple[Graph, list]:
    graph = draw(acyclic_graphs())
    batches = draw(update_batches(graph, max_batches=BATCHES))
    return graph, batches + [[]] * (BATCHES - len(batches))


@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(series(), min_size=10, max_size=10))
def test_incremental_changes_equal_native_and_full_recompute(spark, cases: list[tuple[Graph, list]]) -> None:
    graphs = {f"g{i}": g for i, (g, _) in enumerate(cases)}
    arity_one = all_arity_one(graphs)
    psi = summarize(transitions_of(spark, graphs), locations_of(spark, graphs), arity_one).localCheckpoint()
    points = spark.createDataFrame([], POINTS_SCHEMA)
    frontiers = spark.createDataFrame([], FRONTIER_SCHEMA)
    by_frames = (points, frontiers)  # the DataFrame path's own state, checked alongside
    indexed, by_index = index_psi(psi), (points, frontiers)  # Psi indexed once for every batch, as the engine keeps it
    state = IncrementalState.start(indexed, points, frontiers)  # counts and frontiers kept beside the index
    trackers = {key: Tracker(g) for key, g in graphs.items()}
    history: dict[str, list] = defaultdict(list)
    for step in range(BATCHES):
        rows = [
            (key, encode(loc), list(t), d)
            for key, (_, batches) in zip(graphs, cases, strict=True)
            for loc, t, d in batches[step]
        ]
        batch = spark.createDataFrame(rows, POINTS_SCHEMA).withColumnRenamed("count", "delta")
        result = incremental(psi, points, batch, frontiers, arity_one)
        points, frontiers = result.points, result.frontiers
        other = incremental(psi, by_frames[0], batch, by_frames[1], arity_one, engine="dataframe")
        by_frames = (other.points, other.frontiers)
        third = incremental(indexed, by_index[0], batch, by_index[1], arity_one)
        by_index = (third.points, third.frontiers)
        assert sorted(map(tuple, third.changes.collect())) == sorted(map(tuple, result.changes.collect()))
        previous, (state, found) = state, state.apply(rows)
        assert sorted(found) == sorted((r[0], r[1], tuple(r[2]), r[3]) for r in result.changes.collect())
        previous.drop()
        got: dict[str, set] = defaultdict(set)
        for r in result.changes.collect():
            got[r["dataflow_id"]].add((decode_code(r["loc"]), tuple(r["time"]), r["diff"]))
        assert sorted(map(tuple, other.changes.collect())) == sorted(map(tuple, result.changes.collect()))
        for key, (_, batches) in zip(graphs, cases, strict=True):
            history[key].append(batches[step])
            native = {(c.location, c.time, c.diff) for c in trackers[key].apply(batches[step])}
            assert got[key] == native, (graphs[key], history[key])
    counts = {key: oracle.accumulate(history[key]) for key in graphs}
    full = frontiers_for_graphs(spark, graphs, counts)
    # each path's own state, held to the oracle
    for kept_frontiers in (frontiers, by_frames[1], by_index[1], state.frontiers()):
        kept: dict[str, dict[Location, list]] = {key: {loc: [] for loc in g.locations()} for key, g in graphs.items()}
        for r in kept_frontiers.collect():
            kept[r["dataflow_id"]][decode_code(r["loc"])].append(tuple(r["time"]))
        for key, graph in graphs.items():
            got_frontiers = {loc: sorted(ts) for loc, ts in kept[key].items()}
            assert got_frontiers == full[key] == oracle.frontiers(graph, counts[key])
    for kept_points in (points, by_frames[0], by_index[0], state.points()):
        held: dict[str, dict] = defaultdict(dict)
        for r in kept_points.collect():
            if r["count"]:
                held[r["dataflow_id"]][(decode_code(r["loc"]), tuple(r["time"]))] = r["count"]
        assert all(held[key] == counts[key] for key in graphs)


def test_engine_and_one_shot_entry_point(spark) -> None:
    graph = chain(3, arity=2)
    engine = SparkFrontierEngine(spark, graph)
    tracker = Tracker(graph)
    start = [(Location.source(0, 0), (0, 0), 1)]
    assert engine.apply(start) == sorted(
        tracker.apply(start), key=lambda c: (c.location.node, c.location.kind, c.location.port, c.time, c.diff)
    )
    move = [(Location.source(0, 0), (0, 0), -1), (Location.source(0, 0), (1, 0), 1), (Location.target(2, 0), (0, 3), 1)]
    before_counts, before_frontiers = engine.pointstamps(), engine.frontiers()
    one_shot = update_frontiers(spark, graph, path_summaries(graph), before_frontiers, before_counts, move)
    changes = engine.apply(move)
    assert changes == one_shot
    assert {(c.location, c.time, c.diff) for c in changes} == {
        (c.location, c.time, c.diff) for c in tracker.apply(move)
    }
    assert engine.frontiers() == tracker.frontiers()
    assert engine.pointstamps() == tracker.pointstamps()
    assert engine.summaries() == path_summaries(graph)
    assert engine.apply([]) == []
